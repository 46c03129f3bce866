//! The walls, shown with ordinary programs (`sh`, `perl`) in place of an engine: each hostile
//! step is also run without the walls, where it succeeds, so that each test fails without
//! the wall it is about.

use std::io::Read;
use std::net::TcpListener;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use super::*;
use crate::engines::process::{self, Run, RunError};

fn run_in(folder: &Path, script: &str, walls: Walls) -> Result<String, RunError> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(process::run(Run {
        program: Path::new("/bin/sh"),
        args: vec!["-c".into(), script.into()],
        folder,
        env: vec![("PATH", "/usr/bin:/bin".into())],
        timeout: Duration::from_secs(20),
        max_output: 1 << 20,
        max_memory: 256 << 20,
        reads_input: false,
        walls,
    }))
}

fn sealed(folder: &Path) -> Walls {
    Walls::sealed(Some(folder), ContainmentMode::Required)
}

fn open(folder: &Path) -> Walls {
    Walls::sealed(Some(folder), ContainmentMode::Off)
}

/// A loopback listener that counts the connections it accepts.
fn counting_listener() -> (u16, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let seen = Arc::new(AtomicUsize::new(0));
    let counter = seen.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            counter.fetch_add(1, Ordering::SeqCst);
            let mut stream = stream;
            let _ = stream.set_read_timeout(Some(Duration::from_millis(200)));
            let _ = stream.read(&mut [0u8; 1024]);
        }
    });
    (port, seen)
}

#[test]
fn this_kernel_offers_both_walls() {
    let support = Support::probe();
    assert!(
        support.files() && support.network(),
        "the tests run where previewd's default (--engine-containment=required) runs: {support:?}"
    );
}

#[test]
fn a_contained_program_reads_and_writes_its_folder_only() {
    let folder = tempfile::tempdir().unwrap();
    let elsewhere = tempfile::tempdir().unwrap();
    let secret = elsewhere.path().join("token");
    std::fs::write(&secret, "operator-token").unwrap();
    std::fs::write(folder.path().join("chart.yaml"), "name: web").unwrap();
    let read_own = "cat chart.yaml && echo out > rendered && cat rendered";
    assert_eq!(
        run_in(folder.path(), read_own, sealed(folder.path())),
        Ok("name: webout\n".into())
    );

    let steal = format!("cat {}", secret.display());
    assert_eq!(
        run_in(folder.path(), &steal, open(folder.path())),
        Ok("operator-token".into()),
        "without the walls the file is read"
    );
    let refused = run_in(folder.path(), &steal, sealed(folder.path())).unwrap_err();
    assert!(
        refused.to_string().contains("Permission denied"),
        "{refused}"
    );
    for outside in ["/proc/self/environ", "/etc/hostname"] {
        let refused = run_in(
            folder.path(),
            &format!("cat {outside}"),
            sealed(folder.path()),
        );
        assert!(refused.is_err(), "{outside}: {refused:?}");
    }

    let plant = format!("echo x > {}/planted", elsewhere.path().display());
    assert!(run_in(folder.path(), &plant, sealed(folder.path())).is_err());
    assert!(!elsewhere.path().join("planted").exists());
}

#[test]
fn a_contained_program_opens_no_socket_of_any_family() {
    let folder = tempfile::tempdir().unwrap();
    let (port, seen) = counting_listener();
    let connect = format!(
        "perl -MIO::Socket::INET -e 'IO::Socket::INET->new(PeerAddr => \"127.0.0.1:{port}\") \
         or die \"refused: $!\\n\"; print \"connected\"'"
    );
    assert_eq!(
        run_in(folder.path(), &connect, open(folder.path())),
        Ok("connected".into())
    );
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(
        seen.load(Ordering::SeqCst),
        1,
        "without the walls it connects"
    );

    let refused = run_in(folder.path(), &connect, sealed(folder.path())).unwrap_err();
    assert!(
        refused.to_string().contains("refused: Permission denied"),
        "{refused}"
    );
    // UDP (a DNS query carries data out as well as a connection) and UNIX sockets too.
    for family in [
        "AF_INET, SOCK_DGRAM",
        "AF_INET6, SOCK_STREAM",
        "AF_UNIX, SOCK_STREAM",
    ] {
        let open_socket = format!(
            "perl -MSocket -e 'socket(my $s, {family}, 0) or die \"refused: $!\\n\"; print \"open\"'"
        );
        let refused = run_in(folder.path(), &open_socket, sealed(folder.path())).unwrap_err();
        assert!(
            refused.to_string().contains("refused"),
            "{family}: {refused}"
        );
    }
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(
        seen.load(Ordering::SeqCst),
        1,
        "the walls let nothing through"
    );

    // The one run that fetches (`helm pull`) keeps the files wall and reaches the network.
    let fetching = Walls {
        network: true,
        ..sealed(folder.path())
    };
    assert_eq!(
        run_in(folder.path(), &connect, fetching),
        Ok("connected".into())
    );
}

#[test]
fn a_node_without_a_wall_is_said_and_runs_nothing_when_required() {
    let bare = Support {
        landlock_abi: None,
        seccomp: false,
    };
    let said = bare.missing(ContainmentMode::Required).unwrap();
    assert!(
        said.contains("Landlock") && said.contains("seccomp") && said.contains("best-effort"),
        "{said}"
    );
    assert_eq!(bare.missing(ContainmentMode::BestEffort), None);
    assert!(
        bare.describe(ContainmentMode::BestEffort)
            .contains("files: NOT contained")
    );
    let full = Support {
        landlock_abi: Some(6),
        seccomp: true,
    };
    assert_eq!(full.missing(ContainmentMode::Required), None);
}

#[test]
fn a_contained_program_signals_nothing_but_itself() {
    let folder = tempfile::tempdir().unwrap();
    let previewd = std::process::id();
    let probe = format!(
        "kill -0 $$ && echo itself; kill -0 {previewd} 2>/dev/null && echo previewd || echo refused"
    );
    assert_eq!(
        run_in(folder.path(), &probe, open(folder.path())),
        Ok("itself\npreviewd\n".into()),
        "without the walls previewd can be signalled"
    );
    assert_eq!(
        run_in(folder.path(), &probe, sealed(folder.path())),
        Ok("itself\nrefused\n".into())
    );
}

#[test]
fn a_relative_program_is_never_looked_up_in_the_runs_folder() {
    let resolved = resolve(Path::new("./helm")).unwrap();
    assert!(resolved.is_absolute(), "{}", resolved.display());
    assert_eq!(
        resolved,
        std::env::current_dir().unwrap().join("./helm"),
        "relative to previewd's working folder, not to the folder a pull request's files are in"
    );
    assert_eq!(
        resolve(Path::new("sh")).map(|p| p.is_absolute()),
        Some(true)
    );
    assert_eq!(resolve(Path::new("no-such-program-anywhere")), None);
}

/// The chart runs previewd as user 65532 with no capability: the walls go up there too (they
/// need only no_new_privs, which previewd sets), and hold.
#[test]
fn an_unprivileged_process_puts_the_walls_up() {
    use std::os::unix::fs::PermissionsExt;
    use std::os::unix::process::CommandExt;
    let folder = tempfile::tempdir().unwrap();
    std::fs::set_permissions(folder.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let (port, seen) = counting_listener();
    let script = format!(
        "id -u; echo own > own && cat own; \
         perl -MIO::Socket::INET -e 'IO::Socket::INET->new(PeerAddr => \"127.0.0.1:{port}\") \
         or print \"refused\\n\"'"
    );
    let walls = sealed(folder.path());
    let mut prepared = prepare(Path::new("/bin/sh"), &walls).expect("the walls are prepared");
    let mut command = std::process::Command::new("/bin/sh");
    command
        .args(["-c", &script])
        .current_dir(folder.path())
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .uid(65532)
        .gid(65532);
    // SAFETY: the closure only makes system calls (Prepared::enforce), as in engines::process.
    unsafe {
        command.pre_exec(move || prepared.enforce());
    }
    let output = command.output().expect("the unprivileged run starts");
    let printed = String::from_utf8_lossy(&output.stdout);
    assert_eq!(printed, "65532\nown\nrefused\n", "{output:?}");
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(seen.load(Ordering::SeqCst), 0);
}
