//! A seccomp filter that refuses every new socket: `socket(2)` fails with `EACCES` whatever the
//! family (TCP, UDP, so DNS too, raw, netlink, UNIX), and so does `io_uring_setup(2)` (a ring
//! can open sockets of its own). It also refuses what would reach previewd or the kernel past
//! the Landlock walls, which older kernels do not scope (signals before ABI 6): signals to any
//! process but the child itself (`kill`, `tgkill`, `rt_sigqueueinfo`, `rt_tgsigqueueinfo`
//! aimed elsewhere; `tkill`, pidfds), reading or writing another process (`ptrace`,
//! `process_vm_*`), and new namespaces, BPF programs, keyrings, perf events, userfaultfd and
//! mounts. A system call of another architecture's table (the 32-bit one, or x32) is refused as
//! a whole: its numbers differ and would slip past the check. Helm, Kustomize and previewd's
//! render worker use none of these: they read files and print.
//!
//! The filter is built in previewd's process; the child writes its own pid into it and
//! installs it between fork and exec (a `getpid` and one system call).

/// The architecture this filter is written for (`AUDIT_ARCH_*`), when seccomp is used on it.
#[cfg(target_arch = "x86_64")]
const NATIVE_ARCH: u32 = 0xC000_003E;
#[cfg(target_arch = "aarch64")]
const NATIVE_ARCH: u32 = 0xC000_00B7;

/// System call numbers of x32, which share the x86_64 table's arch value.
#[cfg(target_arch = "x86_64")]
const X32_SYSCALL_BIT: u32 = 0x4000_0000;

// Classic BPF, as seccomp reads it (linux/filter.h).
const LD_W_ABS: u16 = 0x20;
const JEQ_K: u16 = 0x15;
const JGE_K: u16 = 0x35;
const RET_K: u16 = 0x06;
/// Offsets in `struct seccomp_data`.
const OFFSET_NR: u32 = 0;
const OFFSET_ARCH: u32 = 4;

/// Whether this build and kernel can refuse sockets: a supported architecture, and a kernel
/// that has seccomp filters with the `ERRNO` action (and lets previewd use them).
pub fn available() -> bool {
    cfg!(any(target_arch = "x86_64", target_arch = "aarch64")) && {
        let action: u32 = libc::SECCOMP_RET_ERRNO;
        // SAFETY: the kernel reads one u32 that lives across the call.
        let answered = unsafe {
            libc::syscall(
                libc::SYS_seccomp,
                libc::SECCOMP_GET_ACTION_AVAIL,
                0u32,
                &action as *const u32,
            )
        };
        answered == 0
    }
}

fn statement(code: u16, k: u32) -> libc::sock_filter {
    libc::sock_filter {
        code,
        jt: 0,
        jf: 0,
        k,
    }
}

fn jump(code: u16, k: u32, jt: u8, jf: u8) -> libc::sock_filter {
    libc::sock_filter { code, jt, jf, k }
}

/// System calls refused outright.
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
const REFUSED: [libc::c_long; 18] = [
    libc::SYS_socket,
    libc::SYS_io_uring_setup,
    libc::SYS_tkill,
    libc::SYS_pidfd_open,
    libc::SYS_pidfd_getfd,
    libc::SYS_pidfd_send_signal,
    libc::SYS_ptrace,
    libc::SYS_process_vm_readv,
    libc::SYS_process_vm_writev,
    libc::SYS_unshare,
    libc::SYS_setns,
    libc::SYS_mount,
    libc::SYS_bpf,
    libc::SYS_userfaultfd,
    libc::SYS_perf_event_open,
    libc::SYS_keyctl,
    libc::SYS_add_key,
    libc::SYS_request_key,
];

/// System calls allowed only when their first argument is the child's own pid (a Go program
/// signals its own threads with `tgkill(getpid(), tid, …)`).
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
const ONLY_TO_ITSELF: [libc::c_long; 4] = [
    libc::SYS_kill,
    libc::SYS_tgkill,
    libc::SYS_rt_sigqueueinfo,
    libc::SYS_rt_tgsigqueueinfo,
];

/// Offset of the low 32 bits of the first argument in `struct seccomp_data` (little endian).
const OFFSET_ARG0_LOW: u32 = 16;

/// The filter program, and where in it the child writes its own pid ([`own_pid`]).
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
pub fn no_sockets() -> (Vec<libc::sock_filter>, Vec<usize>) {
    let refuse = libc::SECCOMP_RET_ERRNO | libc::EACCES as u32;
    let allow = libc::SECCOMP_RET_ALLOW;
    let nr = |n: libc::c_long| u32::try_from(n).unwrap_or(u32::MAX);
    let mut program = vec![
        statement(LD_W_ABS, OFFSET_ARCH),
        // Native: go on (skip the refusal); otherwise refuse.
        jump(JEQ_K, NATIVE_ARCH, 1, 0),
        statement(RET_K, refuse),
        statement(LD_W_ABS, OFFSET_NR),
    ];
    #[cfg(target_arch = "x86_64")]
    program.extend([jump(JGE_K, X32_SYSCALL_BIT, 0, 1), statement(RET_K, refuse)]);
    for refused in REFUSED {
        program.extend([jump(JEQ_K, nr(refused), 0, 1), statement(RET_K, refuse)]);
    }
    let mut pid_slots = Vec::new();
    for call in ONLY_TO_ITSELF {
        // Not this call: skip its four instructions (the accumulator still holds the number).
        program.extend([
            jump(JEQ_K, nr(call), 0, 4),
            statement(LD_W_ABS, OFFSET_ARG0_LOW),
        ]);
        pid_slots.push(program.len());
        program.extend([
            jump(JEQ_K, 0, 0, 1),
            statement(RET_K, allow),
            statement(RET_K, refuse),
        ]);
    }
    program.push(statement(RET_K, allow));
    (program, pid_slots)
}

/// Writes `pid` into the program's slots (in the child: no allocation).
pub fn own_pid(program: &mut [libc::sock_filter], slots: &[usize], pid: u32) {
    for &slot in slots {
        if let Some(instruction) = program.get_mut(slot) {
            instruction.k = pid;
        }
    }
}

#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
pub fn no_sockets() -> (Vec<libc::sock_filter>, Vec<usize>) {
    (Vec::new(), Vec::new())
}

/// Installs `program` on the calling thread (no_new_privs must be set). Only a system call:
/// safe between fork and exec.
pub fn install(program: &[libc::sock_filter]) -> std::io::Result<()> {
    let Ok(len) = u16::try_from(program.len()) else {
        return Err(std::io::Error::from_raw_os_error(libc::EINVAL));
    };
    let fprog = libc::sock_fprog {
        len,
        filter: program.as_ptr().cast_mut(),
    };
    // SAFETY: the kernel copies the program, which lives across the call, and never writes it.
    let installed = unsafe {
        libc::syscall(
            libc::SYS_seccomp,
            libc::SECCOMP_SET_MODE_FILTER,
            0u32,
            &fprog as *const libc::sock_fprog,
        )
    };
    if installed == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}
