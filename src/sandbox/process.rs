//! Child processes that can never outlive previewd.
//!
//! The control plane is four long-running processes. Whatever happens to the process that
//! started them (a clean exit, a panic, Ctrl-C, SIGKILL), they must go too:
//!
//! * Every child asks the kernel for SIGKILL when its parent goes away (`PR_SET_PDEATHSIG`).
//!   Linux ties that signal to the *thread* that forked, not the process, and test harnesses
//!   run tests on short-lived threads; so all children are spawned from one thread that lives
//!   as long as the process.
//! * Each child runs in its own process group, so a Ctrl-C in the terminal reaches previewd
//!   only, and previewd stops the children in order (scheduler before apiserver before etcd).
//! * [`ManagedProcess`] stops its child on drop; a test binary's shared control plane lives in
//!   a `static` that is never dropped, so [`stop_all_at_exit`] also registers an `atexit` hook.

use std::collections::HashMap;
use std::fs::File;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use super::SandboxError;

type SpawnReply = mpsc::Sender<std::io::Result<Child>>;

/// Requests to the one spawning thread.
fn spawner() -> &'static Mutex<mpsc::Sender<(Command, SpawnReply)>> {
    static SPAWNER: OnceLock<Mutex<mpsc::Sender<(Command, SpawnReply)>>> = OnceLock::new();
    SPAWNER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<(Command, SpawnReply)>();
        std::thread::Builder::new()
            .name("sandbox-spawner".into())
            .spawn(move || {
                for (mut command, reply) in rx {
                    let _ = reply.send(command.spawn());
                }
                // The sender lives in a static, so this loop never ends: the thread, and with it
                // the parent-death signal of every child, lasts as long as the process.
            })
            .expect("spawn the sandbox spawner thread");
        Mutex::new(tx)
    })
}

/// pids of running children with the signal that stops each, for the exit hook.
fn live_children() -> &'static Mutex<HashMap<u32, libc::c_int>> {
    static LIVE: OnceLock<Mutex<HashMap<u32, libc::c_int>>> = OnceLock::new();
    LIVE.get_or_init(|| Mutex::new(HashMap::new()))
}

/// A child process that is stopped (its stop signal, then SIGKILL) when dropped.
pub struct ManagedProcess {
    name: String,
    child: Option<Child>,
    log_path: PathBuf,
    program: PathBuf,
    args: Vec<String>,
    options: SpawnOptions,
}

/// How a child is started and stopped, beyond its arguments.
#[derive(Debug, Clone, Copy)]
pub struct SpawnOptions {
    /// The user and group it runs as (a server that refuses to run as root); `None`: ours.
    pub user: Option<(u32, u32)>,
    /// The signal that asks it to stop (SIGTERM; PostgreSQL's fast shutdown is SIGINT).
    pub stop_signal: libc::c_int,
}

impl Default for SpawnOptions {
    fn default() -> Self {
        Self {
            user: None,
            stop_signal: libc::SIGTERM,
        }
    }
}

impl ManagedProcess {
    /// Starts `program args…` with stdout and stderr written to `log_path`.
    pub fn spawn(
        name: &str,
        program: &Path,
        args: &[String],
        log_path: &Path,
    ) -> Result<Self, SandboxError> {
        Self::spawn_with(name, program, args, log_path, SpawnOptions::default())
    }

    /// [`ManagedProcess::spawn`], with its user and stop signal.
    pub fn spawn_with(
        name: &str,
        program: &Path,
        args: &[String],
        log_path: &Path,
        options: SpawnOptions,
    ) -> Result<Self, SandboxError> {
        let log = File::create(log_path).map_err(|e| SandboxError::io(log_path, e))?;
        let mut process = Self {
            name: name.to_string(),
            child: None,
            log_path: log_path.to_path_buf(),
            program: program.to_path_buf(),
            args: args.to_vec(),
            options,
        };
        process.child = Some(process.launch(log)?);
        Ok(process)
    }

    /// Starts the process again with the same arguments, its log continued (fault tests: a
    /// process killed with [`ManagedProcess::kill`] comes back as a restarted pod would).
    pub fn start_again(&mut self) -> Result<(), SandboxError> {
        self.kill();
        let log = File::options()
            .append(true)
            .open(&self.log_path)
            .map_err(|e| SandboxError::io(&self.log_path, e))?;
        self.child = Some(self.launch(log)?);
        Ok(())
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// `Some(description)` when the process has exited.
    pub fn exited(&mut self) -> Option<String> {
        let child = self.child.as_mut()?;
        match child.try_wait() {
            Ok(Some(status)) => Some(status.to_string()),
            Ok(None) => None,
            Err(e) => Some(format!("unknown ({e})")),
        }
    }

    /// The last `lines` lines of the process's log, for error messages.
    pub fn log_tail(&self, lines: usize) -> String {
        let text = std::fs::read_to_string(&self.log_path).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    pub fn log_path(&self) -> &Path {
        &self.log_path
    }

    /// Sends SIGKILL and reaps the child, without the polite SIGTERM first (fault tests).
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
            forget_child(child.id());
        }
    }

    /// The stop signal, then SIGKILL after `grace`; reaps the child.
    pub fn stop(&mut self, grace: Duration) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        terminate(child.id(), self.options.stop_signal, grace);
        let _ = child.wait();
        forget_child(child.id());
    }
}

impl ManagedProcess {
    /// Spawns the program (from the spawner thread, see the module documentation) with stdout
    /// and stderr going to `log`, and registers it for the exit hook.
    fn launch(&self, log: File) -> Result<Child, SandboxError> {
        let log_err = log
            .try_clone()
            .map_err(|e| SandboxError::io(&self.log_path, e))?;
        let mut command = Command::new(&self.program);
        command
            .args(&self.args)
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log_err)
            .process_group(0);
        if let Some((uid, gid)) = self.options.user {
            // std changes the ids before `pre_exec` runs, so the parent-death signal set
            // there survives (the kernel clears it on a change of credentials).
            command.uid(uid).gid(gid);
        }
        let child = spawn_bound_to_us(&self.name, &self.program, command)?;
        live_children()
            .lock()
            .expect("children lock")
            .insert(child.id(), self.options.stop_signal);
        Ok(child)
    }
}

/// Spawns `command` from the spawner thread, asking the kernel to kill it when we go.
fn spawn_bound_to_us(
    name: &str,
    program: &Path,
    mut command: Command,
) -> Result<Child, SandboxError> {
    let parent = std::process::id() as libc::pid_t;
    // SAFETY: the closure runs in the forked child before exec and only calls the
    // async-signal-safe functions prctl, getppid and _exit.
    unsafe {
        command.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // The parent may have died between fork and prctl: then nobody would signal us.
            if libc::getppid() != parent {
                libc::_exit(1);
            }
            Ok(())
        });
    }
    let (reply_tx, reply_rx) = mpsc::channel();
    spawner()
        .lock()
        .expect("spawner lock")
        .send((command, reply_tx))
        .map_err(|_| SandboxError::Process(format!("{name}: the spawner thread is gone")))?;
    let child = reply_rx
        .recv()
        .map_err(|_| SandboxError::Process(format!("{name}: the spawner thread is gone")))?
        .map_err(|e| SandboxError::Process(format!("cannot start {}: {e}", program.display())))?;
    Ok(child)
}

impl Drop for ManagedProcess {
    fn drop(&mut self) {
        self.stop(Duration::from_secs(5));
    }
}

fn forget_child(pid: u32) {
    if let Ok(mut live) = live_children().lock() {
        live.remove(&pid);
    }
}

/// Sends `signal` to `pid`, waits up to `grace` for it to go, then SIGKILLs it.
fn terminate(pid: u32, signal: libc::c_int, grace: Duration) {
    let pid = pid as libc::pid_t;
    // SAFETY: plain syscalls on a pid we spawned and have not reaped yet.
    unsafe {
        if libc::kill(pid, signal) != 0 {
            return;
        }
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline {
            let mut status = 0;
            if libc::waitpid(pid, &mut status, libc::WNOHANG) == pid {
                return;
            }
            std::thread::sleep(Duration::from_millis(25));
        }
        libc::kill(pid, libc::SIGKILL);
    }
}

extern "C" fn stop_live_children() {
    let pids: Vec<(u32, libc::c_int)> = match live_children().try_lock() {
        Ok(live) => live.iter().map(|(pid, signal)| (*pid, *signal)).collect(),
        Err(_) => return,
    };
    for (pid, signal) in pids {
        terminate(pid, signal, Duration::from_secs(2));
    }
    for dir in registered_dirs()
        .try_lock()
        .map(|d| d.clone())
        .unwrap_or_default()
    {
        let _ = std::fs::remove_dir_all(dir);
    }
}

fn registered_dirs() -> &'static Mutex<Vec<PathBuf>> {
    static DIRS: OnceLock<Mutex<Vec<PathBuf>>> = OnceLock::new();
    DIRS.get_or_init(|| Mutex::new(Vec::new()))
}

/// Makes sure that at normal process exit every live child is stopped and `dir` removed, even
/// when the owner (a `static`) is never dropped. Parent-death signals cover abnormal exits.
pub fn stop_all_at_exit(dir: &Path) {
    static HOOK: OnceLock<()> = OnceLock::new();
    HOOK.get_or_init(|| {
        // SAFETY: registering a plain extern "C" fn with no captured state.
        unsafe {
            libc::atexit(stop_live_children);
        }
    });
    registered_dirs()
        .lock()
        .expect("dirs lock")
        .push(dir.to_path_buf());
}

/// Whether a process with this pid exists (used to sweep data dirs of dead sandboxes).
pub fn pid_alive(pid: u32) -> bool {
    // SAFETY: signal 0 only checks for existence.
    unsafe { libc::kill(pid as libc::pid_t, 0) == 0 }
}
