//! The walls the kernel keeps around every engine run (`helm`, `kubectl kustomize`) and every
//! render worker: whatever a pull request makes an engine do, it reads only its private folder
//! and the system's programs and libraries, writes only that folder, and opens no socket.
//! previewd's checks of the input (`kustomize::shape`, the reference check) stay in front for
//! clear error messages; these walls hold when a parser difference lets something past them.
//!
//! * **Files: Landlock** ([`landlock`]): a ruleset that handles every filesystem right the
//!   kernel knows and allows them only beneath the private folder (read and write, nothing
//!   run), the program itself and the system folders (`/usr`, `/lib*`, `/bin`, `/sbin`: read
//!   and run). The operator's files (the ServiceAccount token, `/proc`, `/etc`, the checkout of
//!   another render) are out of reach. From ABI 6 on, signals and abstract UNIX sockets towards
//!   processes outside the sandbox are refused too.
//! * **Network: seccomp** ([`seccomp`]): `socket(2)` is refused for every family, so no TCP,
//!   no UDP (no DNS lookups that carry data out) and no UNIX socket; Landlock's TCP rules
//!   (ABI 4) refuse bind and connect as a second wall where the kernel has them.
//!   `helm pull` of a published chart is the one run that reaches the network (its address is
//!   the template's, not the pull request's); it also reads `/etc` for TLS roots and DNS.
//!
//! Both need no privilege (no_new_privs, which the chart sets anyway) and no capability, so
//! they work in a pod under the `restricted` Pod Security level. A fresh network namespace
//! would need `CAP_SYS_ADMIN` or user namespaces, which that level and most seccomp profiles
//! refuse: not used. With `--engine-containment=required` (the default) an engine does not run
//! on a kernel that lacks either wall; `best-effort` runs it behind what the kernel has.

mod landlock;
mod seccomp;

use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// Whether engines run behind the kernel's walls (`--engine-containment`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum ContainmentMode {
    /// Both walls or no run: an engine on a kernel without Landlock or seccomp fails its
    /// render with a message that says so.
    #[default]
    Required,
    /// Whatever walls the kernel has (said at start, in `/readyz` and in
    /// `previewd_engine_containment`).
    BestEffort,
    /// No walls: only for tests that show what the walls stop.
    #[value(skip)]
    Off,
}

/// What this machine's kernel lets previewd enforce, probed once.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Support {
    /// The Landlock ABI version, when the kernel has Landlock.
    pub landlock_abi: Option<u32>,
    /// Whether seccomp filters can refuse sockets.
    pub seccomp: bool,
}

impl Support {
    pub fn probe() -> Self {
        static PROBED: OnceLock<Support> = OnceLock::new();
        *PROBED.get_or_init(|| Support {
            landlock_abi: landlock::abi_version(),
            seccomp: seccomp::available(),
        })
    }

    /// Whether the files wall holds.
    pub fn files(&self) -> bool {
        self.landlock_abi.is_some()
    }

    /// Whether the network wall holds.
    pub fn network(&self) -> bool {
        self.seccomp
    }

    /// One line for the start-up log and `/readyz`.
    pub fn describe(&self, mode: ContainmentMode) -> String {
        if mode == ContainmentMode::Off {
            return "engines: not contained (containment turned off)".into();
        }
        let files = match self.landlock_abi {
            Some(abi) => format!("files: Landlock ABI {abi} (private folder only)"),
            None => "files: NOT contained (this kernel offers no Landlock)".into(),
        };
        let network = match (self.seccomp, self.landlock_abi) {
            (true, Some(abi)) if abi >= 4 => {
                format!("network: seccomp refuses every socket, Landlock ABI {abi} TCP")
            }
            (true, _) => "network: seccomp refuses every socket".into(),
            (false, Some(abi)) if abi >= 4 => {
                format!("network: Landlock ABI {abi} refuses TCP only (no seccomp filters)")
            }
            (false, _) => "network: NOT contained (no seccomp filters)".into(),
        };
        let mode = match mode {
            ContainmentMode::Required => "required",
            _ => "best-effort",
        };
        format!("engines contained ({mode}): {files}; {network}")
    }

    /// What `mode` refuses to run without, said for the environment's condition.
    fn missing(&self, mode: ContainmentMode) -> Option<String> {
        if mode != ContainmentMode::Required || (self.files() && self.network()) {
            return None;
        }
        let mut missing = Vec::new();
        if !self.files() {
            missing.push("Landlock (Linux 5.13 or newer, `landlock` in the boot's lsm= list)");
        }
        if !self.network() {
            missing.push("seccomp filters");
        }
        Some(format!(
            "previewd runs engines only behind the kernel's walls and this node lacks {}; \
             run previewd where it has them, or set --engine-containment=best-effort \
             (docs/security.md)",
            missing.join(" and ")
        ))
    }
}

/// What one run may touch.
#[derive(Clone, Debug)]
pub struct Walls {
    /// The folder it may read and write (its private folder); `None`: no file of its own.
    pub folder: Option<PathBuf>,
    /// Whether it may open sockets (`helm pull` only).
    pub network: bool,
    pub mode: ContainmentMode,
}

impl Walls {
    /// A run on input from a pull request: its folder, no network.
    pub fn sealed(folder: Option<&Path>, mode: ContainmentMode) -> Self {
        Self {
            folder: folder.map(Path::to_path_buf),
            network: false,
            mode,
        }
    }
}

/// The walls made ready in previewd's process (which may allocate and open files), to be put
/// up in the child between fork and exec, where only system calls are safe ([`Self::enforce`]).
pub struct Prepared {
    ruleset: Option<OwnedFd>,
    /// The seccomp program, and where the child writes its own pid into it.
    filter: Option<(Vec<libc::sock_filter>, Vec<usize>)>,
}

/// The system folders every program may read and run from (libraries, the dynamic loader, a
/// script's interpreter). They hold nothing of the operator's.
const SYSTEM_FOLDERS: [&str; 5] = ["/usr", "/lib", "/lib64", "/bin", "/sbin"];

/// Prepares `walls` for a run of `program` (an absolute path, [`resolve`]), or says why it
/// must not run.
pub fn prepare(program: &Path, walls: &Walls) -> Result<Prepared, String> {
    if walls.mode == ContainmentMode::Off {
        return Ok(Prepared {
            ruleset: None,
            filter: None,
        });
    }
    let support = Support::probe();
    if let Some(missing) = support.missing(walls.mode) {
        return Err(missing);
    }
    let ruleset = match support.landlock_abi {
        Some(abi) => Some(ruleset(abi, program, walls).map_err(|e| format!("Landlock: {e}"))?),
        None => None,
    };
    let filter = (support.seccomp && !walls.network).then(seccomp::no_sockets);
    Ok(Prepared { ruleset, filter })
}

fn ruleset(abi: u32, program: &Path, walls: &Walls) -> std::io::Result<OwnedFd> {
    let mut rules = landlock::Ruleset::new(abi, !walls.network)?;
    if let Some(folder) = &walls.folder {
        rules.allow(folder, landlock::PRIVATE_FOLDER)?;
    }
    rules.allow(program, landlock::READ_FILE | landlock::EXECUTE)?;
    for folder in SYSTEM_FOLDERS {
        rules.allow(Path::new(folder), landlock::READ_AND_RUN)?;
    }
    rules.allow(
        Path::new("/dev/null"),
        landlock::READ_FILE | landlock::WRITE_FILE,
    )?;
    if walls.network {
        // TLS roots, resolv.conf, hosts, nsswitch.conf.
        rules.allow(Path::new("/etc"), landlock::READ_FILE | landlock::READ_DIR)?;
    } else {
        // The dynamic loader's cache, nothing else of /etc.
        rules.allow(Path::new("/etc/ld.so.cache"), landlock::READ_FILE)?;
    }
    Ok(rules.into_fd())
}

/// The file `program` names, as an absolute path: itself when it holds a `/` (relative to
/// previewd's working folder, never to the run's folder, where a pull request's files are),
/// else the first match in an absolute folder of previewd's PATH. The run executes this path,
/// and the walls allow exactly it.
pub fn resolve(program: &Path) -> Option<PathBuf> {
    if program.components().count() > 1 {
        return match program.is_absolute() {
            true => Some(program.to_path_buf()),
            false => Some(std::env::current_dir().ok()?.join(program)),
        };
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .filter(|dir| dir.is_absolute())
        .map(|dir| dir.join(program))
        .find(|candidate| candidate.is_file())
}

impl Prepared {
    /// Puts the walls up on the calling thread, for good: no_new_privs, the Landlock ruleset,
    /// the seccomp filter (with this process's pid written in). System calls only, no
    /// allocation (it runs between fork and exec).
    pub fn enforce(&mut self) -> std::io::Result<()> {
        if self.ruleset.is_none() && self.filter.is_none() {
            return Ok(());
        }
        // SAFETY: prctl with integer arguments.
        if unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        if let Some(ruleset) = &self.ruleset {
            landlock::restrict_self(ruleset.as_raw_fd())?;
        }
        if let Some((filter, pid_slots)) = &mut self.filter {
            // SAFETY: getpid(2) takes nothing and cannot fail.
            let pid = unsafe { libc::getpid() };
            seccomp::own_pid(filter, pid_slots, u32::try_from(pid).unwrap_or(0));
            seccomp::install(filter)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
