//! `previewd sandbox` as a person runs it: a real process, a real control plane, and nothing left
//! running after it stops, whether it is asked to (SIGTERM) or killed (SIGKILL); the printed
//! `curl` lines create environments that `kubectl` shows Ready; `--demo` plays a PR's life and
//! exits 0.
//!
//! The tests take turns (one sandbox at a time): four control planes at once on two cores
//! would measure the machine, not the sandbox.

use std::io::{BufRead, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

struct SandboxRun {
    child: Child,
    info_file: PathBuf,
    _scratch: tempfile::TempDir,
}

impl Drop for SandboxRun {
    /// A failing test must not leave a sandbox running (its control plane dies with it).
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

static ONE_SANDBOX_AT_A_TIME: Mutex<()> = Mutex::new(());

fn take_turn() -> std::sync::MutexGuard<'static, ()> {
    ONE_SANDBOX_AT_A_TIME
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn start_sandbox() -> SandboxRun {
    start_sandbox_with(&[])
}

/// `previewd sandbox --info-file … <extra>`.
fn start_sandbox_with(extra: &[&str]) -> SandboxRun {
    let scratch = tempfile::tempdir().unwrap();
    let info_file = scratch.path().join("info.json");
    let child = Command::new(env!("CARGO_BIN_EXE_previewd"))
        .args(["sandbox", "--info-file"])
        .arg(&info_file)
        .args(extra)
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

/// Runs `command`; its stdout, or a panic naming `what` with its stderr.
fn checked_stdout(what: &str, command: &mut Command) -> Vec<u8> {
    let output = command.output().unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(
        output.status.success(),
        "{what}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    output.stdout
}

/// The kubectl the sandbox uses (built with its control plane, of the same release), brought
/// as the sandbox brings it; `previewd sandbox` also names it in its info file.
fn sandbox_kubectl() -> PathBuf {
    static KUBECTL: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    KUBECTL
        .get_or_init(|| {
            // Where `previewd sandbox` caches it: `--cache-dir`'s variable, else its default.
            let cache = previewd::sandbox::cli::cache_dir_from_environment();
            previewd::sandbox::provision::ensure_binaries(
                &cache,
                &previewd::sandbox::StderrProgress,
            )
            .expect("the sandbox's kubectl")
            .kubectl
        })
        .clone()
}

fn kubectl(kubeconfig: &Path, args: &[&str]) -> String {
    let stdout = checked_stdout(
        &format!("kubectl {args:?}"),
        Command::new(sandbox_kubectl())
            .env("KUBECONFIG", kubeconfig)
            .args(args),
    );
    String::from_utf8_lossy(&stdout).to_string()
}

fn signal(child: &Child, signal: i32) {
    // SAFETY: signalling a child we spawned and have not reaped.
    assert_eq!(unsafe { libc::kill(child.id() as i32, signal) }, 0);
}

#[test]
fn sandbox_serves_a_cluster_and_stops_everything_on_sigterm() {
    let _turn = take_turn();
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
        stdout.lines().any(|l| l.contains("kubeconfig:")
            && l.trim_end().ends_with(&kubeconfig.display().to_string())),
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

    // A run that had to build says so on stderr.
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
    // How fast a cached start is belongs to a benchmark, not to a test's pass or fail: a busy
    // machine must not fail it. The figure above is printed for the reader.
}

#[test]
fn sandbox_children_die_with_a_killed_sandbox() {
    let _turn = take_turn();
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

/// Lines of the child's stdout as they come.
fn stdout_lines(child: &mut Child) -> std::sync::mpsc::Receiver<String> {
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
        {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    rx
}

/// Reads lines until one satisfies `wanted`; returns it.
fn line_where(
    lines: &std::sync::mpsc::Receiver<String>,
    what: &str,
    wanted: impl Fn(&str) -> bool,
) -> String {
    let deadline = Instant::now() + Duration::from_secs(120);
    while let Some(left) = deadline.checked_duration_since(Instant::now()) {
        match lines.recv_timeout(left) {
            Ok(line) if wanted(&line) => return line,
            Ok(_) => {}
            Err(_) => break,
        }
    }
    panic!("previewd sandbox printed no {what}");
}

fn wait_for_kubectl_ready(kubeconfig: &Path, environment_prefix: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let listed = kubectl(kubeconfig, &["get", "previewenvironments"]);
        if let Some(line) = listed.lines().find(|l| {
            l.starts_with(environment_prefix) && l.split_whitespace().any(|w| w == "Ready")
        }) {
            return line.to_string();
        }
        assert!(
            Instant::now() < deadline,
            "kubectl never showed {environment_prefix}… Ready:\n{listed}"
        );
        std::thread::sleep(Duration::from_millis(250));
    }
}

fn run_curl(line: &str) -> serde_json::Value {
    let stdout = checked_stdout("curl", Command::new("sh").arg("-c").arg(line));
    serde_json::from_slice(&stdout).unwrap_or_else(|e| {
        panic!(
            "previewd's answer is not JSON ({e}): {}",
            String::from_utf8_lossy(&stdout)
        )
    })
}

#[test]
fn the_printed_curl_lines_create_environments_that_kubectl_shows_ready() {
    let _turn = take_turn();
    let mut run = start_sandbox();
    let (kubeconfig, _) = wait_for_info(&mut run);
    let info: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&run.info_file).unwrap()).unwrap();
    for key in [
        "kubeconfig",
        "github_webhook_url",
        "github_webhook_secret",
        "gitlab_webhook_url",
        "gitlab_webhook_token",
        "forge_api_url",
        "ingress_url",
    ] {
        assert!(
            info[key].as_str().is_some_and(|v| !v.is_empty()),
            "--info-file has no {key}: {info}"
        );
    }
    // The info file is written after the block is printed: the curl lines are there to read.
    let lines = stdout_lines(&mut run.child);
    // The curl lines send to the printed webhook URLs (the forge stand-in, which passes the
    // deliveries on to previewd).
    let curl_to = |key: &str| {
        let url = format!("{} ", info[key].as_str().unwrap());
        move |l: &str| l.trim_start().starts_with("curl ") && l.contains(&url)
    };
    let github_curl = line_where(&lines, "GitHub curl line", curl_to("github_webhook_url"));
    let gitlab_curl = line_where(&lines, "GitLab curl line", curl_to("gitlab_webhook_url"));

    let answer = run_curl(github_curl.trim());
    assert_eq!(answer["outcome"], "accepted", "{answer}");
    let listed = wait_for_kubectl_ready(&kubeconfig, "hello-world-pr-2-");
    eprintln!("kubectl: {listed}");
    let answer = run_curl(gitlab_curl.trim());
    assert_eq!(answer["outcome"], "accepted", "{answer}");
    wait_for_kubectl_ready(&kubeconfig, "gitlab-test-pr-1-");
    // The stand-in printed the PR comment previewd wrote.
    line_where(&lines, "forge comment", |l| {
        l.starts_with("[forge] github Codertocat/Hello-World#2: PR comment")
    });
    asleep_then_opened(&kubeconfig, &listed, info["ingress_url"].as_str().unwrap());

    signal(&run.child, libc::SIGTERM);
    let status = run.child.wait().unwrap();
    assert!(status.success(), "exit on SIGTERM: {status}");
}

/// A chart of one's own in a git checkout: one Deployment whose annotation says `greeting`.
fn write_own_chart(folder: &Path, greeting: &str) {
    let chart = folder.join("chart");
    std::fs::create_dir_all(chart.join("templates")).unwrap();
    std::fs::write(
        chart.join("Chart.yaml"),
        "apiVersion: v2\nname: mine\nversion: 0.1.0\n",
    )
    .unwrap();
    std::fs::write(chart.join("values.yaml"), format!("greeting: {greeting}\n")).unwrap();
    let deployment = r#"apiVersion: apps/v1
kind: Deployment
metadata:
  name: {{ .Release.Name }}-web
  annotations:
    greeting: {{ .Values.greeting | quote }}
spec:
  replicas: 1
  selector:
    matchLabels: {app: web}
  template:
    metadata:
      labels: {app: web}
    spec:
      containers:
      - name: web
        image: "example.com/mine:{{ .Values.tag }}"
"#;
    std::fs::write(chart.join("templates/deployment.yaml"), deployment).unwrap();
}

fn git(folder: &Path, args: &[&str]) -> String {
    let stdout = checked_stdout(
        &format!("git {args:?}"),
        Command::new("git")
            .arg("-C")
            .arg(folder)
            .args(["-c", "user.name=me", "-c", "user.email=me@example.com"])
            .args(args),
    );
    String::from_utf8_lossy(&stdout).trim().to_string()
}

/// `previewd render ARGS`: its exit status and standard output.
fn render(args: &[&str]) -> (std::process::ExitStatus, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_previewd"))
        .arg("render")
        .args(args)
        .output()
        .expect("run previewd render");
    (
        output.status,
        String::from_utf8_lossy(&output.stdout).into_owned(),
    )
}

/// The objects `previewd render` printed (YAML documents after its `# namespace` line).
fn printed_objects(printed: &str) -> Vec<serde_json::Value> {
    printed
        .split("\n---\n")
        .skip(1)
        .map(|document| serde_yaml_ng::from_str(document).expect("a printed object is YAML"))
        .collect()
}

/// The objects `printed` are the environment's objects in its namespace: each of them is live
/// with the labels, annotations and (for workloads) pod template images it printed, and no
/// other object of their kinds carries the environment's label there.
fn assert_rendered_is_live(kubeconfig: &Path, printed: &str) {
    let namespace = printed
        .lines()
        .next()
        .and_then(|line| line.strip_prefix("# namespace "))
        .and_then(|rest| rest.split(',').next())
        .expect("a # namespace line");
    let objects = printed_objects(printed);
    assert!(!objects.is_empty(), "{printed}");
    let mut printed_names: std::collections::BTreeMap<String, Vec<String>> = Default::default();
    for object in &objects {
        let kind = object["kind"].as_str().unwrap().to_lowercase();
        let name = object["metadata"]["name"].as_str().unwrap().to_string();
        printed_names.entry(kind).or_default().push(name);
    }
    let environment = objects[0]["metadata"]["labels"]["previewd.dev/environment"]
        .as_str()
        .expect("objects carry their environment's label");
    for (kind, mut names) in printed_names {
        let selector = format!("previewd.dev/environment={environment}");
        let listed = kubectl(
            kubeconfig,
            &[
                "get",
                &kind,
                "-n",
                namespace,
                "-l",
                &selector,
                "-o",
                "jsonpath={.items[*].metadata.name}",
            ],
        );
        let mut live: Vec<String> = listed.split_whitespace().map(str::to_string).collect();
        live.sort();
        names.sort();
        assert_eq!(live, names, "{kind} of {environment}: live vs printed");
    }
    for object in objects {
        let (kind, name) = (
            object["kind"].as_str().unwrap(),
            object["metadata"]["name"].as_str().unwrap(),
        );
        let live = kubectl(
            kubeconfig,
            &["get", kind, name, "-n", namespace, "-o", "json"],
        );
        let live: serde_json::Value = serde_json::from_str(&live).unwrap();
        for field in ["labels", "annotations"] {
            for (key, value) in object["metadata"][field].as_object().into_iter().flatten() {
                assert_eq!(
                    &live["metadata"][field][key], value,
                    "{kind}/{name} {field} {key}"
                );
            }
        }
        let containers = &object["spec"]["template"]["spec"]["containers"];
        if containers.is_array() {
            assert_eq!(
                &live["spec"]["template"]["spec"]["containers"][0]["image"],
                &containers[0]["image"],
                "{kind}/{name}"
            );
        }
    }
}

/// `previewd render` with no cluster: every example of templates/ renders, allowed, in waves
/// (web-chart's chart and web-kustomize's overlay from the examples' repository, which the
/// stand-in serves).
#[test]
fn previewd_render_prints_every_example_allowed_in_waves() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("templates");
    for (example, at_least) in [
        ("web-postgres", 8),
        ("online-boutique", 36),
        ("web-chart", 5),
        ("web-kustomize", 4),
    ] {
        let file = |name: &str| root.join(example).join(name).to_str().unwrap().to_string();
        let (status, printed) = render(&[
            "--template",
            &file("template.yaml"),
            "--environment",
            &file("environment.yaml"),
        ]);
        assert!(status.success(), "{example}: {status}\n{printed}");
        let waves = printed
            .lines()
            .filter(|l| l.starts_with("# wave ") && l.ends_with(": allowed"))
            .count();
        assert!(waves >= at_least, "{example}: {waves} objects\n{printed}");
        assert_eq!(printed_objects(&printed).len(), waves, "{example}");
        assert!(!printed.contains("refused"), "{example}: {printed}");
    }
}

/// A template the policy refuses: exit status 1, and the reason and message the environment's
/// condition and PR comment would show.
#[test]
fn previewd_render_exits_1_with_the_refusal_a_pull_request_would_see() {
    let scratch = tempfile::tempdir().unwrap();
    let template = scratch.path().join("template.yaml");
    std::fs::write(
        &template,
        r#"apiVersion: previewd.dev/v1alpha1
kind: PreviewTemplate
metadata: {name: bad}
spec:
  forge: {kind: github, repository: me/app}
  url: {host: "{{ slug }}.example.com"}
  manifests:
    inline:
    - name: escape.yaml
      template: |
        apiVersion: v1
        kind: Pod
        metadata: {name: escape}
        spec:
          containers: [{name: c, image: busybox}]
          volumes: [{name: root, hostPath: {path: /}}]
    - name: net.yaml
      template: |
        apiVersion: v1
        kind: Pod
        metadata: {name: net}
        spec:
          hostNetwork: true
          containers: [{name: c, image: busybox}]
"#,
    )
    .unwrap();
    let (status, printed) = render(&[
        "--template",
        template.to_str().unwrap(),
        "--branch",
        "feature",
    ]);
    assert_eq!(status.code(), Some(1), "{printed}");
    assert!(printed.contains("# refused: PolicyRejected: Pod/escape (from escape.yaml): spec.volumes[0] mounts hostPath"), "{printed}");
    // Each refused object on a line of its own, with its own reason.
    assert!(
        printed.contains(
            "\n# Pod/escape (from escape.yaml): refused: spec.volumes[0] mounts hostPath"
        ),
        "{printed}"
    );
    assert!(
        printed.contains("\n# Pod/net (from net.yaml): refused: "),
        "{printed}"
    );
    assert!(
        !printed.contains("# wave"),
        "nothing is said to be applied: {printed}"
    );
}

/// The walk-through of docs/getting-started.md ("Your own repository"): a template for one's
/// own repository, an environment at a commit of its git checkout, and a new local commit as
/// the next SHA; and every example of templates/, applied as a newcomer applies them.
#[test]
fn your_own_chart_and_every_example_reach_ready_with_kubectl_apply() {
    let _turn = take_turn();
    let app = tempfile::tempdir().unwrap();
    write_own_chart(app.path(), "first");
    git(app.path(), &["init", "-q", "-b", "main"]);
    git(app.path(), &["add", "."]);
    git(app.path(), &["commit", "-q", "-m", "a chart"]);
    let first = git(app.path(), &["rev-parse", "HEAD"]);
    let served = format!("me/app={}", app.path().display());
    let mut run = start_sandbox_with(&["--repository", &served]);
    let (kubeconfig, _) = wait_for_info(&mut run);
    // Read both outputs as they come, so that the sandbox never blocks on a full pipe.
    let lines = stdout_lines(&mut run.child);
    let stderr = run.child.stderr.take().unwrap();
    std::thread::spawn(move || std::io::copy(&mut { stderr }, &mut std::io::sink()));
    line_where(&lines, "the repository served", |l| {
        l.contains("repositories:") && l.contains("me/app (git checkout")
    });

    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    // Every example of templates/, as docs/getting-started.md applies them.
    let examples = [
        "web-postgres",
        "online-boutique",
        "web-chart",
        "web-kustomize",
    ];
    for example in examples {
        let folder = root.join("templates").join(example);
        kubectl(&kubeconfig, &["apply", "-f", folder.to_str().unwrap()]);
    }
    let template = r#"apiVersion: previewd.dev/v1alpha1
kind: PreviewTemplate
metadata:
  name: mine
spec:
  forge:
    kind: github
    repository: me/app
    tokenSecretRef: {name: forge-token, key: token}
  url:
    host: "{{ slug }}.mine.example.com"
  manifests:
    helm:
      chart:
        path: chart
      values:
        tag: "{{ sha }}"
"#;
    let environment = |sha: &str| {
        format!(
            "apiVersion: previewd.dev/v1alpha1\nkind: PreviewEnvironment\nmetadata:\n  name: mine-main\nspec:\n  template: mine\n  source:\n    repository: me/app\n    branch: main\n    headSha: {sha}\n"
        )
    };
    let scratch = tempfile::tempdir().unwrap();
    let apply = |name: &str, text: &str| {
        let file = scratch.path().join(name);
        std::fs::write(&file, text).unwrap();
        kubectl(&kubeconfig, &["apply", "-f", file.to_str().unwrap()]);
    };
    apply("template.yaml", template);
    apply("environment.yaml", &environment(&first));
    let environments = [
        "web-postgres-pr-2",
        "online-boutique-pr-7",
        "web-chart-pr-2",
        "web-kustomize-pr-2",
        "mine-main",
    ];
    for name in environments {
        eprintln!("kubectl: {}", wait_for_kubectl_ready(&kubeconfig, name));
    }
    let greeting = |sha: &str| {
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let status = kubectl(
                &kubeconfig,
                &[
                    "get",
                    "previewenvironment",
                    "mine-main",
                    "-o",
                    "jsonpath={.status.phase} {.status.deployedSha} {.status.namespace}",
                ],
            );
            let fields: Vec<&str> = status.split_whitespace().collect();
            if let ["Ready", deployed, namespace] = fields.as_slice()
                && *deployed == sha
            {
                return kubectl(
                    &kubeconfig,
                    &[
                        "get",
                        "deployment",
                        "-n",
                        namespace,
                        "-o",
                        "jsonpath={.items[0].metadata.annotations.greeting}",
                    ],
                );
            }
            assert!(
                Instant::now() < deadline,
                "mine-main never Ready at {sha}: {status}"
            );
            std::thread::sleep(Duration::from_millis(250));
        }
    };
    assert_eq!(greeting(&first), "first");
    // `previewd render` prints what the sandbox applied, for the same files and commit.
    let files = |name: &str| scratch.path().join(name).to_str().unwrap().to_string();
    let (template_file, environment_file) = (files("template.yaml"), files("environment.yaml"));
    let checkout = app.path().to_str().unwrap();
    let (status, printed) = render(&[
        "--template",
        &template_file,
        "--environment",
        &environment_file,
        "--checkout",
        checkout,
    ]);
    assert!(status.success(), "{printed}");
    assert_rendered_is_live(&kubeconfig, &printed);
    // A new local commit is a new SHA to preview.
    write_own_chart(app.path(), "second");
    git(app.path(), &["commit", "-q", "-am", "a new greeting"]);
    let second = git(app.path(), &["rev-parse", "HEAD"]);
    let patch = format!(r#"{{"spec":{{"source":{{"headSha":"{second}"}}}}}}"#);
    kubectl(
        &kubeconfig,
        &[
            "patch",
            "previewenvironment",
            "mine-main",
            "--type",
            "merge",
            "-p",
            &patch,
        ],
    );
    assert_eq!(greeting(&second), "second");

    signal(&run.child, libc::SIGTERM);
    let status = run.child.wait().unwrap();
    assert!(status.success(), "exit on SIGTERM: {status}");
}

#[test]
fn the_demo_plays_a_pull_request_and_exits_0() {
    let _turn = take_turn();
    let scratch = tempfile::tempdir().unwrap();
    let mut run = SandboxRun {
        child: Command::new(env!("CARGO_BIN_EXE_previewd"))
            .args(["sandbox", "--demo"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start previewd sandbox --demo"),
        info_file: scratch.path().join("unused"),
        _scratch: scratch,
    };
    let child = &mut run.child;
    let lines = stdout_lines(child);
    let kubeconfig_line = line_where(&lines, "kubeconfig", |l| l.contains("kubeconfig:"));
    let kubeconfig = PathBuf::from(kubeconfig_line.split_whitespace().last().unwrap());
    let mut stdout = vec![kubeconfig_line];
    let deadline = Instant::now() + Duration::from_secs(600);
    let status = loop {
        stdout.extend(lines.try_iter());
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "the demo did not finish within 10 min"
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    std::thread::sleep(Duration::from_millis(200));
    stdout.extend(lines.try_iter());
    let stdout = stdout.join("\n");
    let mut stderr = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    assert!(
        status.success(),
        "the demo exits 0: {status}\n{stdout}\n{stderr}"
    );
    for step in [
        "kubectl apply -f templates/web-chart/",
        "READY: web-chart-pr-2",
        "kubectl apply -f templates/web-kustomize/",
        "READY: web-kustomize-pr-2",
        "READY: ",
        "UPDATED: ",
        "sleep: spec.sleep set",
        "→ 503: previewd's waiting page (starting, about",
        "WOKEN: GET http://changes.preview.example.com/ → 200",
        "sandbox app: Service ",
        "DESTROYED: ",
        "demo done",
    ] {
        assert!(stdout.contains(step), "no {step:?} in:\n{stdout}");
    }
    // With PostgreSQL installed (as .ci/run installs it), the pull request gets its own
    // database, and its own login reads the baseline's rows there.
    if previewd::sandbox::postgres::LocalPostgres::installed().is_some() {
        let said = stdout
            .lines()
            .find(|line| line.contains("DATABASE: orders Ready, branched from its baseline in"));
        assert!(
            said.is_some_and(|line| line.contains("reads 1000 rows of orders")),
            "no database line in:\n{stdout}"
        );
    }
    // Nothing is wrong in the demo, so nothing may say so (the sweep at start-up asks the
    // stand-in for open PRs and branches, and must get an answer).
    let complaints: Vec<&str> = stdout
        .lines()
        .chain(stderr.lines())
        .filter(|line| {
            let plain = without_colours(line);
            plain.contains(" WARN ") || plain.contains(" ERROR ")
        })
        .collect();
    assert!(
        complaints.is_empty(),
        "the demo logged warnings or errors:\n{}",
        complaints.join("\n")
    );
    // The PR comment as it changed: created deploying, edited to ready, then destroyed.
    for text in [
        "PR comment created",
        "### Preview environment: ready",
        "(commit `5a1b2c3`)",
        "### Preview environment: destroyed",
    ] {
        assert!(
            stdout.contains(text),
            "the demo did not print {text:?}:\n{stdout}"
        );
    }
    assert!(
        !kubeconfig.parent().unwrap().exists(),
        "the sandbox's data folder is removed"
    );
    eprintln!(
        "{}",
        stdout
            .lines()
            .filter(|l| l.starts_with("demo done"))
            .collect::<String>()
    );
}

/// `line` without the terminal colour codes the log writer may add.
fn without_colours(line: &str) -> String {
    let mut plain = String::with_capacity(line.len());
    let mut in_escape = false;
    for c in line.chars() {
        match (in_escape, c) {
            (false, '\u{1b}') => in_escape = true,
            (true, 'm') => in_escape = false,
            (true, _) => {}
            (false, c) => plain.push(c),
        }
    }
    plain
}

/// Puts the environment kubectl `listed` to sleep, then opens its host as the printed line says
/// (`curl -H 'Host: …'` through the sandbox's ingress): the waiting page, then the app.
fn asleep_then_opened(kubeconfig: &Path, listed: &str, ingress_url: &str) {
    let name = listed.split_whitespace().next().unwrap();
    kubectl(
        kubeconfig,
        &[
            "patch",
            "previewenvironment",
            name,
            "--type=merge",
            "-p",
            r#"{"spec":{"sleep":true}}"#,
        ],
    );
    let deadline = Instant::now() + Duration::from_secs(120);
    let host = loop {
        let phase = kubectl(
            kubeconfig,
            &[
                "get",
                "previewenvironment",
                name,
                "-o",
                "jsonpath={.status.phase} {.status.host}",
            ],
        );
        if let Some(host) = phase.strip_prefix("Sleeping ") {
            break host.trim().to_string();
        }
        assert!(
            Instant::now() < deadline,
            "{name} did not fall asleep: {phase}"
        );
        std::thread::sleep(Duration::from_millis(300));
    };
    let open = || {
        let line = format!(
            "curl -s -o /dev/stderr -w '%{{http_code}}' -H 'Host: {host}' -H 'Accept: text/html' {ingress_url}/"
        );
        let output = Command::new("sh").arg("-c").arg(&line).output().unwrap();
        (
            String::from_utf8_lossy(&output.stdout).to_string(),
            String::from_utf8_lossy(&output.stderr).to_string(),
        )
    };
    let (status, page) = open();
    assert_eq!(status, "503", "{page}");
    assert!(
        page.contains("<meta http-equiv=\"refresh\"") && page.contains("Preview environment"),
        "{page}"
    );
    assert!(
        !page.contains(name),
        "the page names nothing of the environment: {page}"
    );
    loop {
        let (status, body) = open();
        if status == "200" {
            assert!(body.starts_with("sandbox app: Service "), "{body}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{host} never reached the app: {status} {body}"
        );
        std::thread::sleep(Duration::from_millis(300));
    }
}
