//! Landlock, by its three system calls: a ruleset made in previewd's process (it opens the
//! paths the rules name) and enforced in the child between fork and exec, where only system
//! calls are safe. What each ABI version adds is used when the kernel has it: TCP bind and
//! connect (4), signals and abstract UNIX sockets outside the sandbox (6).

use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

// Filesystem rights (landlock(7)), by the ABI version that brought them.
pub const EXECUTE: u64 = 1 << 0;
pub const WRITE_FILE: u64 = 1 << 1;
pub const READ_FILE: u64 = 1 << 2;
pub const READ_DIR: u64 = 1 << 3;
const REMOVE_DIR: u64 = 1 << 4;
const REMOVE_FILE: u64 = 1 << 5;
const MAKE_DIR: u64 = 1 << 7;
const MAKE_REG: u64 = 1 << 8;
const MAKE_SYM: u64 = 1 << 12;
/// Every right of ABI 1 (bits 0 to 12).
const ABI_1_FS: u64 = (1 << 13) - 1;
const REFER: u64 = 1 << 13;
const TRUNCATE: u64 = 1 << 14;
const IOCTL_DEV: u64 = 1 << 15;
/// The rights a rule on a file (not a folder) may carry.
const FILE_RIGHTS: u64 = EXECUTE | WRITE_FILE | READ_FILE | TRUNCATE | IOCTL_DEV;

/// What a private folder allows: reading and writing its own files, nothing run from it.
pub const PRIVATE_FOLDER: u64 = READ_FILE
    | READ_DIR
    | WRITE_FILE
    | REMOVE_DIR
    | REMOVE_FILE
    | MAKE_DIR
    | MAKE_REG
    | MAKE_SYM
    | REFER
    | TRUNCATE;
/// What system programs and libraries allow: reading and running them.
pub const READ_AND_RUN: u64 = READ_FILE | READ_DIR | EXECUTE;

const NET_BIND_TCP: u64 = 1 << 0;
const NET_CONNECT_TCP: u64 = 1 << 1;
const SCOPE_ABSTRACT_UNIX_SOCKET: u64 = 1 << 0;
const SCOPE_SIGNAL: u64 = 1 << 1;

const CREATE_RULESET_VERSION: u32 = 1 << 0;
const RULE_PATH_BENEATH: libc::c_int = 1;

#[repr(C)]
struct RulesetAttr {
    handled_access_fs: u64,
    handled_access_net: u64,
    scoped: u64,
}

#[repr(C, packed)]
struct PathBeneathAttr {
    allowed_access: u64,
    parent_fd: i32,
}

/// The Landlock ABI version this kernel offers, or `None` when it has none (not built in,
/// not in the boot's list of security modules, or the system call refused by a seccomp
/// profile).
pub fn abi_version() -> Option<u32> {
    // SAFETY: a version query reads no memory (null attributes, size 0).
    let version = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<RulesetAttr>(),
            0usize,
            CREATE_RULESET_VERSION,
        )
    };
    u32::try_from(version).ok().filter(|v| *v >= 1)
}

/// A ruleset being written: the rights it handles (everything the ABI knows, so that what no
/// rule allows is refused) and the rules that allow some of them beneath some paths.
pub struct Ruleset {
    fd: OwnedFd,
    handled_fs: u64,
}

impl Ruleset {
    /// A ruleset that handles every filesystem right of `abi`, and, when `seal_network`, TCP
    /// bind and connect (ABI 4) and signals and abstract sockets to outside (ABI 6).
    pub fn new(abi: u32, seal_network: bool) -> std::io::Result<Self> {
        let mut handled_fs = ABI_1_FS;
        if abi >= 2 {
            handled_fs |= REFER;
        }
        if abi >= 3 {
            handled_fs |= TRUNCATE;
        }
        if abi >= 5 {
            handled_fs |= IOCTL_DEV;
        }
        let attr = RulesetAttr {
            handled_access_fs: handled_fs,
            handled_access_net: if seal_network && abi >= 4 {
                NET_BIND_TCP | NET_CONNECT_TCP
            } else {
                0
            },
            scoped: if abi >= 6 {
                SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL
            } else {
                0
            },
        };
        // An older kernel reads only the fields it knows: give it only those.
        let size = match abi {
            1..=3 => 8usize,
            4 | 5 => 16,
            _ => std::mem::size_of::<RulesetAttr>(),
        };
        // SAFETY: `attr` lives across the call and `size` does not exceed it.
        let fd = unsafe {
            libc::syscall(
                libc::SYS_landlock_create_ruleset,
                &attr as *const RulesetAttr,
                size,
                0u32,
            )
        };
        let fd = RawFd::try_from(fd)
            .ok()
            .filter(|fd| *fd >= 0)
            .ok_or_else(std::io::Error::last_os_error)?;
        // SAFETY: the kernel just returned this descriptor, owned by no one else.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(Self { fd, handled_fs })
    }

    /// Allows `rights` beneath `path` (on a file: its file rights only). A path that does not
    /// exist is skipped: there is nothing there to allow.
    pub fn allow(&mut self, path: &Path, rights: u64) -> std::io::Result<()> {
        let Ok(name) = CString::new(path.as_os_str().as_bytes()) else {
            return Ok(());
        };
        // SAFETY: `name` is a valid C string; O_PATH opens no content.
        let raw = unsafe { libc::open(name.as_ptr(), libc::O_PATH | libc::O_CLOEXEC) };
        if raw < 0 {
            return Ok(());
        }
        // SAFETY: the descriptor was just opened here.
        let target = unsafe { OwnedFd::from_raw_fd(raw) };
        let is_folder = std::fs::metadata(path).is_ok_and(|m| m.is_dir());
        let mut allowed = rights & self.handled_fs;
        if !is_folder {
            allowed &= FILE_RIGHTS;
        }
        if allowed == 0 {
            return Ok(());
        }
        let attr = PathBeneathAttr {
            allowed_access: allowed,
            parent_fd: target.as_raw_fd(),
        };
        // SAFETY: both descriptors are open and `attr` lives across the call.
        let added = unsafe {
            libc::syscall(
                libc::SYS_landlock_add_rule,
                self.fd.as_raw_fd(),
                RULE_PATH_BENEATH,
                &attr as *const PathBeneathAttr,
                0u32,
            )
        };
        if added == 0 {
            Ok(())
        } else {
            Err(std::io::Error::last_os_error())
        }
    }

    pub fn into_fd(self) -> OwnedFd {
        self.fd
    }
}

/// Enforces the ruleset `fd` on the calling thread and what it starts (no_new_privs must be
/// set). Only a system call: safe between fork and exec.
pub fn restrict_self(fd: RawFd) -> std::io::Result<()> {
    // SAFETY: a system call on a descriptor; no memory is passed.
    if unsafe { libc::syscall(libc::SYS_landlock_restrict_self, fd, 0u32) } == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}
