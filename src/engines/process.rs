//! Runs an engine program (`helm`, `kubectl`) the way input from a pull request must be run:
//! with a time limit, an output limit, a memory limit, no inherited environment (so no
//! operator credentials, kubeconfig or proxy settings reach it) and killed when previewd stops
//! waiting.
//!
//! The memory limit holds twice: the kernel refuses the program's private writable memory
//! beyond it (`RLIMIT_DATA`), and previewd reads the program's resident memory every
//! [`MEMORY_CHECK_INTERVAL`] and kills it once over (Go's runtime sometimes maps its heap in a
//! way the first does not count: measured, a 1 GiB `repeat` in a chart passed a 384 MiB
//! `RLIMIT_DATA` in 2 runs of 6). A chart or overlay that builds a gigabyte from a few lines is
//! stopped and said, instead of growing previewd's container to its limit, where the kernel
//! would kill whichever process it chose, previewd included.

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use tokio::io::AsyncReadExt;
use tokio::process::{Child, Command};

use super::contain::{self, Prepared, Walls};

/// Why a program gave no output previewd can use. The messages speak to the template's
/// author: they end up in the environment's condition.
#[derive(Clone, Debug, thiserror::Error, PartialEq)]
pub enum RunError {
    #[error("could not start {program}: {reason} (is it installed? see docs/installing.md)")]
    NotStarted { program: String, reason: String },
    #[error("{program} took longer than {}s and was stopped", limit.as_secs())]
    TimedOut { program: String, limit: Duration },
    #[error("{program} printed more than {limit} bytes and was stopped")]
    TooMuchOutput { program: String, limit: usize },
    /// The kernel's walls could not be put up (`engines::contain`): not run.
    #[error("{program} was not run: {reason}")]
    NotContained { program: String, reason: String },
    #[error("{program} needed more than {} MiB of memory and was stopped (--render-memory-limit)", limit >> 20)]
    OutOfMemory { program: String, limit: u64 },
    /// The program's own error message (its standard error, shortened).
    #[error("{message}")]
    Failed { message: String },
}

/// How often the program's resident memory is read: at memory's speed of filling, a program
/// gets at most a few dozen MiB past its limit between two reads.
pub const MEMORY_CHECK_INTERVAL: Duration = Duration::from_millis(5);

/// The largest file a program may write (`RLIMIT_FSIZE`).
const MAX_FILE_BYTES: u64 = 64 << 20;

/// The most of a program's standard error previewd repeats in a condition.
const MAX_MESSAGE_CHARS: usize = 2_000;

/// A program to run: what, with which arguments, in which folder, with which environment.
pub struct Run<'a> {
    pub program: &'a Path,
    pub args: Vec<String>,
    pub folder: &'a Path,
    /// The only environment variables the program gets (besides nothing).
    pub env: Vec<(&'static str, String)>,
    pub timeout: Duration,
    pub max_output: usize,
    /// The most private writable memory the program may map, in bytes.
    pub max_memory: u64,
    /// Whether the program reads its standard input (a warm child's requests, `engines::warm`);
    /// when not, it reads nothing.
    pub reads_input: bool,
    /// What the kernel lets it touch (`engines::contain`).
    pub walls: Walls,
}

/// Runs the program and returns its standard output, or why not.
pub async fn run(run: Run<'_>) -> Result<String, RunError> {
    start(run)?.finish().await
}

/// A program started, waiting for its input (when it reads any); its limits count from
/// [`Started::finish`]. Killed when dropped.
pub struct Started {
    child: Child,
    program: String,
    folder: String,
    timeout: Duration,
    max_output: usize,
    max_memory: u64,
}

/// Starts the program, under its memory limit, with nothing of previewd's environment.
pub fn start(run: Run<'_>) -> Result<Started, RunError> {
    let program = run.program.display().to_string();
    // The path the child executes is decided here, not by a PATH search in its folder.
    let path = contain::resolve(run.program).ok_or_else(|| RunError::NotStarted {
        program: program.clone(),
        reason: "not found on PATH".into(),
    })?;
    let walls = contain::prepare(&path, &run.walls).map_err(|reason| RunError::NotContained {
        program: program.clone(),
        reason,
    })?;
    let mut command = Command::new(&path);
    before_exec(&mut command, run.max_memory, walls);
    let child = command
        .args(&run.args)
        .current_dir(run.folder)
        .env_clear()
        .envs(run.env.iter().map(|(k, v)| (*k, v)))
        .stdin(if run.reads_input {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| RunError::NotStarted {
            program: program.clone(),
            reason: e.to_string(),
        })?;
    Ok(Started {
        child,
        program,
        folder: run.folder.display().to_string(),
        timeout: run.timeout,
        max_output: run.max_output,
        max_memory: run.max_memory,
    })
}

impl Started {
    /// The running program itself, for a caller that talks to it on its own terms
    /// (`engines::warm`).
    pub(super) fn into_child(self) -> Child {
        self.child
    }

    /// Its standard output once it ends, or why not: its time, output and memory limits hold
    /// from here.
    async fn finish(mut self) -> Result<String, RunError> {
        let program = self.program.clone();
        let (Some(stdout), Some(stderr)) = (self.child.stdout.take(), self.child.stderr.take())
        else {
            return Err(RunError::NotStarted {
                program,
                reason: "no pipes".into(),
            });
        };
        let limit = self.max_output;
        let over_memory = watch_memory(self.child.id(), self.max_memory);
        let child = &mut self.child;
        let running = tokio::time::timeout(self.timeout, async {
            // One byte over the limit is enough to know: the rest of the output is never read.
            // Standard error is read to its end (a program blocked on a full pipe would only
            // time out) but only its beginning is kept.
            let reading_err = tokio::spawn(read_start(stderr, MAX_MESSAGE_CHARS * 4));
            let mut out = Vec::new();
            let read_out = stdout.take(limit as u64 + 1).read_to_end(&mut out).await;
            if read_out.is_ok_and(|n| n > limit) {
                reading_err.abort();
                return Err(RunError::TooMuchOutput {
                    program: program.clone(),
                    limit,
                });
            }
            let status = child.wait().await;
            let err = reading_err.await.unwrap_or_default();
            Ok((status, out, err))
        });
        let finished = tokio::select! {
            finished = running => finished,
            () = over_memory => {
                // Returning drops the child, which kills it (kill_on_drop).
                return Err(RunError::OutOfMemory { program, limit: self.max_memory });
            }
        };
        let (status, out, err) = match finished {
            Err(_) => {
                return Err(RunError::TimedOut {
                    program,
                    limit: self.timeout,
                });
            }
            Ok(outcome) => outcome?,
        };
        self.outcome(status, out, &err)
    }

    /// What the program's exit says: its output, or its error with paths said relative to
    /// its private folder (whose name means nothing to the template's author).
    fn outcome(
        &self,
        status: std::io::Result<std::process::ExitStatus>,
        out: Vec<u8>,
        err: &[u8],
    ) -> Result<String, RunError> {
        let program = self.program.clone();
        let succeeded = status.as_ref().is_ok_and(|s| s.success());
        if !succeeded {
            if ran_out_of_memory(err) {
                return Err(RunError::OutOfMemory {
                    program,
                    limit: self.max_memory,
                });
            }
            let mut message = message_of(err, status.ok());
            if self.folder.len() > 1 {
                message = message.replace(&self.folder, ".");
            }
            return Err(RunError::Failed { message });
        }
        String::from_utf8(out).map_err(|_| RunError::Failed {
            message: format!("{program} printed something that is not UTF-8 text"),
        })
    }
}

/// Makes the kernel refuse the program's memory beyond `bytes` (its heap and other private
/// writable mappings) and puts up its walls, in the child between fork and exec.
fn before_exec(command: &mut Command, bytes: u64, mut walls: Prepared) {
    let limit = libc::rlimit {
        rlim_cur: bytes,
        rlim_max: bytes,
    };
    // No file it writes (in its private folder, on previewd's scratch volume) grows past this:
    // a render prints at most 4 MiB, a chart archive is at most 8 MiB.
    let file_size = libc::rlimit {
        rlim_cur: MAX_FILE_BYTES,
        rlim_max: MAX_FILE_BYTES,
    };
    // SAFETY: the closure runs in the forked child before exec and makes only system calls
    // (setrlimit(2), then prctl(2), landlock_restrict_self(2) and seccomp(2) on what was
    // prepared before the fork); it allocates nothing and takes no lock.
    unsafe {
        command.pre_exec(move || {
            if libc::setrlimit(libc::RLIMIT_DATA, &limit) != 0
                || libc::setrlimit(libc::RLIMIT_FSIZE, &file_size) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            walls.enforce()
        });
    }
}

/// Resolves once process `pid` holds more than `limit` bytes of resident memory; never if
/// its memory cannot be read (it has exited: its status says the rest).
pub(super) async fn watch_memory(pid: Option<u32>, limit: u64) {
    let Some(pid) = pid else {
        return std::future::pending().await;
    };
    loop {
        tokio::time::sleep(MEMORY_CHECK_INTERVAL).await;
        match resident_bytes(pid).await {
            Some(resident) if resident > limit => return,
            Some(_) => {}
            None => return std::future::pending().await,
        }
    }
}

/// The resident memory of process `pid`, in bytes; `None` once it has exited.
pub(super) async fn resident_bytes(pid: u32) -> Option<u64> {
    let statm = tokio::fs::read_to_string(format!("/proc/{pid}/statm"))
        .await
        .ok()?;
    // SAFETY: sysconf only reads a constant of the system.
    let page = u64::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096);
    let pages = statm.split_whitespace().nth(1)?.parse::<u64>().ok()?;
    Some(pages.saturating_mul(page))
}

/// Whether the program's standard error says an allocation failed: Go's runtime (`fatal error:
/// out of memory`, or a thread it could not start), Python's `MemoryError`, C's `Cannot allocate
/// memory`, Perl's `Out of memory`, Rust's `memory allocation of N bytes failed` (previewd's own
/// render process).
pub(super) fn ran_out_of_memory(stderr: &[u8]) -> bool {
    let text = String::from_utf8_lossy(stderr).to_ascii_lowercase();
    [
        "out of memory",
        "memoryerror",
        "cannot allocate memory",
        "pthread_create failed",
        "memory allocation of",
    ]
    .iter()
    .any(|sign| text.contains(sign))
}

/// Reads `reader` to its end, keeping its first `keep` bytes.
pub(super) async fn read_start(
    mut reader: impl tokio::io::AsyncRead + Unpin,
    keep: usize,
) -> Vec<u8> {
    let mut kept = Vec::new();
    let mut buffer = [0u8; 8192];
    while let Ok(read) = reader.read(&mut buffer).await {
        if read == 0 {
            break;
        }
        let room = keep.saturating_sub(kept.len());
        kept.extend_from_slice(&buffer[..read.min(room)]);
    }
    kept
}

/// The program's standard error, trimmed and shortened, or its exit status if it said nothing.
pub(super) fn message_of(stderr: &[u8], status: Option<std::process::ExitStatus>) -> String {
    let text = String::from_utf8_lossy(stderr);
    let text = text.trim();
    if text.is_empty() {
        return match status {
            Some(status) => format!("exited with {status} and said nothing"),
            None => "could not be waited for".into(),
        };
    }
    let mut message: String = text.chars().take(MAX_MESSAGE_CHARS).collect();
    if text.chars().count() > MAX_MESSAGE_CHARS {
        message.push('…');
    }
    message
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shell(script: &str, timeout: Duration, max_output: usize) -> Run<'static> {
        Run {
            program: Path::new("/bin/sh"),
            args: vec!["-c".into(), script.into()],
            folder: Path::new("/"),
            env: vec![("PATH", "/usr/bin:/bin".into())],
            timeout,
            max_output,
            max_memory: 256 << 20,
            reads_input: false,
            walls: Walls::sealed(None, contain::ContainmentMode::Off),
        }
    }

    #[tokio::test]
    async fn output_errors_limits_and_environment() {
        let ok = run(shell("echo hello", Duration::from_secs(5), 100)).await;
        assert_eq!(ok, Ok("hello\n".into()));
        let failed = run(shell(
            "echo 'Error: no chart' >&2; exit 1",
            Duration::from_secs(5),
            100,
        ))
        .await;
        assert_eq!(
            failed,
            Err(RunError::Failed {
                message: "Error: no chart".into()
            })
        );
        let endless = run(shell("yes", Duration::from_secs(5), 1000)).await;
        assert!(
            matches!(endless, Err(RunError::TooMuchOutput { limit: 1000, .. })),
            "{endless:?}"
        );
        let slow = run(shell("sleep 5", Duration::from_millis(200), 100)).await;
        assert!(matches!(slow, Err(RunError::TimedOut { .. })), "{slow:?}");
        // previewd's own environment (tokens, kubeconfig) never reaches the program.
        let env = run(shell("env", Duration::from_secs(5), 10_000))
            .await
            .unwrap();
        // (the shell adds PWD itself)
        let mut seen: Vec<&str> = env.lines().filter(|l| !l.starts_with("PWD=")).collect();
        seen.sort();
        assert_eq!(seen, ["PATH=/usr/bin:/bin"], "{env}");
        let missing = run(Run {
            program: Path::new("/no/such/helm"),
            ..shell("", Duration::from_secs(1), 1)
        })
        .await;
        assert!(
            matches!(missing, Err(RunError::NotStarted { .. })),
            "{missing:?}"
        );
    }

    /// A program that builds more than its memory limit fails its own allocation and is said
    /// to; previewd's memory is not touched (the limit is the child's).
    #[tokio::test]
    async fn a_program_over_its_memory_limit_is_stopped_and_said() {
        let greedy = Run {
            max_memory: 64 << 20,
            ..shell(
                "exec perl -e '$x = q(x) x 1_000_000_000; print length $x'",
                Duration::from_secs(20),
                100,
            )
        };
        let refused = run(greedy).await;
        assert_eq!(
            refused,
            Err(RunError::OutOfMemory {
                program: "/bin/sh".into(),
                limit: 64 << 20
            })
        );
        let said = refused.unwrap_err().to_string();
        assert!(
            said.contains("more than 64 MiB") && said.contains("--render-memory-limit"),
            "{said}"
        );
        // Within the limit, the same program runs.
        let modest = Run {
            max_memory: 256 << 20,
            ..shell(
                "exec perl -e '$x = q(x) x 1_000_000; print length $x'",
                Duration::from_secs(20),
                100,
            )
        };
        assert_eq!(run(modest).await, Ok("1000000".into()));
    }
}
