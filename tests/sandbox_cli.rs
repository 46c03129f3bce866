//! `previewd sandbox` as a person runs it: a real process, a real control plane, and nothing left
//! running after it stops, whether it is asked to (SIGTERM) or killed (SIGKILL).

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

struct SandboxRun {
    child: Child,
    info_file: PathBuf,
    _scratch: tempfile::TempDir,
}

fn start_sandbox() -> SandboxRun {
    let scratch = tempfile::tempdir().unwrap();
    let info_file = scratch.path().join("info.json");
    let child = Command::new(env!("CARGO_BIN_EXE_previewd"))
        .args(["sandbox", "--info-file"])
        .arg(&info_file)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start previewd sandbox");
    SandboxRun {
        child,
        info_file,
        _scratch: scratch,
    }
}

/// Waits for the info file; returns the kubeconfig path and how long it took.
fn wait_for_info(run: &mut SandboxRun) -> (PathBuf, Duration) {
    let started = Instant::now();
    // The first run on a machine builds the control plane (minutes); later ones take seconds.
    while started.elapsed() < Duration::from_secs(1_200) {
        if let Ok(text) = std::fs::read_to_string(&run.info_file)
            && let Ok(info) = serde_json::from_str::<serde_json::Value>(&text)
        {
            let path = PathBuf::from(info["kubeconfig"].as_str().expect("kubeconfig key"));
            return (path, started.elapsed());
        }
        if let Ok(Some(status)) = run.child.try_wait() {
            let mut stderr = String::new();
            run.child
                .stderr
                .take()
                .unwrap()
                .read_to_string(&mut stderr)
                .unwrap();
            panic!("previewd sandbox exited early ({status}):\n{stderr}");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("previewd sandbox wrote no info file");
}

/// pids of processes whose command line mentions `dir` (every process the sandbox starts
/// gets its data folder on the command line).
fn processes_using(dir: &Path) -> Vec<u32> {
    let needle = dir.to_string_lossy().to_string();
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|entry| entry.file_name().to_string_lossy().parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .map(|raw| {
                    String::from_utf8_lossy(&raw)
                        .replace('\0', " ")
                        .contains(&needle)
                })
                .unwrap_or(false)
        })
        .collect()
}

fn wait_until_gone(pids: &[u32], timeout: Duration) -> Vec<u32> {
    let deadline = Instant::now() + timeout;
    loop {
        // A zombie still has a /proc entry until its parent reaps it; count only live ones.
        let alive: Vec<u32> = pids
            .iter()
            .copied()
            .filter(|pid| {
                std::fs::read_to_string(format!("/proc/{pid}/stat"))
                    .map(|stat| !stat.contains(") Z "))
                    .unwrap_or(false)
            })
            .collect();
        if alive.is_empty() || Instant::now() > deadline {
            return alive;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn kubectl(kubeconfig: &Path, args: &[&str]) -> String {
    let output = Command::new("kubectl")
        .env("KUBECONFIG", kubeconfig)
        .args(args)
        .output()
        .expect("run kubectl");
    assert!(
        output.status.success(),
        "kubectl {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).to_string()
}

fn signal(child: &Child, signal: i32) {
    // SAFETY: signalling a child we spawned and have not reaped.
    assert_eq!(unsafe { libc::kill(child.id() as i32, signal) }, 0);
}

#[test]
fn sandbox_serves_a_cluster_and_stops_everything_on_sigterm() {
    let mut run = start_sandbox();
    let (kubeconfig, ready_in) = wait_for_info(&mut run);
    let data_dir = kubeconfig.parent().unwrap().to_path_buf();

    let nodes = kubectl(&kubeconfig, &["get", "nodes", "--no-headers"]);
    assert_eq!(
        nodes.lines().filter(|l| l.contains(" Ready ")).count(),
        2,
        "nodes:\n{nodes}"
    );
    let crds = kubectl(&kubeconfig, &["get", "crds", "-o", "name"]);
    assert!(
        crds.contains("previewenvironments.previewd.dev")
            && crds.contains("previewtemplates.previewd.dev")
    );

    let children = processes_using(&data_dir);
    assert_eq!(
        children.len(),
        4,
        "etcd, apiserver, controller-manager and scheduler run"
    );

    signal(&run.child, libc::SIGTERM);
    let status = run.child.wait().unwrap();
    let mut stdout = String::new();
    run.child
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut stdout)
        .unwrap();
    let mut stderr = String::new();
    run.child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    assert!(
        status.success(),
        "previewd sandbox exits cleanly on SIGTERM: {status}\n{stderr}"
    );
    assert!(
        stdout.contains(&format!("kubeconfig: {}", kubeconfig.display())),
        "prints the kubeconfig:\n{stdout}"
    );
    assert!(
        stdout.contains("kubectl get"),
        "prints a kubectl line to try:\n{stdout}"
    );

    assert_eq!(
        wait_until_gone(&children, Duration::from_secs(5)),
        Vec::<u32>::new(),
        "no stray processes"
    );
    assert!(!data_dir.exists(), "the data folder is removed");

    // A run that had to build says so on stderr; a cached one starts in seconds.
    let built = stderr.contains("building kube-apiserver");
    eprintln!(
        "previewd sandbox: control plane ready in {:.1} s ({})",
        ready_in.as_secs_f64(),
        if built {
            "first run: built the binaries"
        } else {
            "cached binaries"
        }
    );
    if !built {
        assert!(
            ready_in < Duration::from_secs(15),
            "with cached binaries the sandbox is ready in under 15 s, took {ready_in:?}"
        );
    }
}

#[test]
fn sandbox_children_die_with_a_killed_sandbox() {
    let mut run = start_sandbox();
    let (kubeconfig, _) = wait_for_info(&mut run);
    let data_dir = kubeconfig.parent().unwrap().to_path_buf();
    let children = processes_using(&data_dir);
    assert_eq!(children.len(), 4);

    signal(&run.child, libc::SIGKILL);
    let _ = run.child.wait();
    assert_eq!(
        wait_until_gone(&children, Duration::from_secs(5)),
        Vec::<u32>::new(),
        "the kernel kills the control plane when its parent dies"
    );
    // Nobody could clean the data folder up; the next sandbox start sweeps it.
    assert!(data_dir.exists());
    previewd::sandbox::control_plane::sweep_stale_data_dirs();
    assert!(!data_dir.exists(), "a dead sandbox's data folder is swept");
}
