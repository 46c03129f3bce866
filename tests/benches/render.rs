//! Benchmark: a Helm chart and a Kustomize overlay the size of the Online Boutique (its 35
//! objects, each a file) rendered through previewd's engines, next to running the same engine
//! by hand on the same input, in one run.
//!
//! Run with `cargo bench --bench render` (no cluster needed). It prints figures and fails only
//! when something breaks, never because a machine is slow.
//!
//! For each engine, each round:
//! - by hand: the engine's command line on a folder already on disk, as a person or a CI job
//!   runs it (`helm template`, `kubectl kustomize`);
//! - previewd, new commit: a new image tag, so nothing is cached: previewd writes the files to a
//!   private folder, runs the engine with its limits, and keeps the output;
//! - previewd, unchanged push: the same input again, which must run no engine (counted).
//!
//! And previewd's own template render (minijinja, the Online Boutique's inline template), which
//! runs in a child process (kept warm between requests): each round, a new commit (a child)
//! next to the same request rendered in previewd's own process (as before the children), and
//! the same commit again (the child's answer kept by digest: no child, the answer read back).
//!
//! And what previewd parses of a pull request's YAML, which it parses only in a child process
//! (issue 52): each round, Helm's output for the chart above parsed and placed in waves, and the
//! overlay above checked (its kustomization read), each in a child for a new commit next to the
//! same request in previewd's own process (where it was parsed before).
//!
//! The engines are the real `helm` and `kubectl` of the pinned versions (`tests/support/tools.rs`,
//! `src/sandbox/versions.rs`); both sides of each ratio run the same engine.

#[path = "../support/mod.rs"]
mod support;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use previewd::engines::helm::{Chart, HelmRender};
use previewd::engines::kustomize::KustomizeRender;
use previewd::engines::{EngineConfig, EngineError, Engines, Rendered};
use previewd::forge::metrics::ForgeMetrics;
use previewd::model::crd::{InlineManifest, PreviewEnvironment, PreviewTemplate};
use previewd::plan::request::{RenderJob, RenderRequest, decode};
use previewd::plan::{place_request, templates_request};
use serde_json::{Value, json};

const ROUNDS: usize = 5;
const OBJECTS: usize = 35;
const NAMESPACE: &str = "bench";

fn main() {
    support::run_benchmark(benchmark());
}

type Files = Vec<(String, Vec<u8>)>;

/// The Online Boutique's objects, from the release manifests in `../shared/fixtures`.
fn boutique() -> Vec<Value> {
    let text = std::fs::read_to_string(support::fixture("apps/online-boutique.yaml"))
        .expect("the Online Boutique fixture");
    let objects = support::yaml_documents(&text);
    assert_eq!(objects.len(), OBJECTS, "the release's objects");
    objects
}

fn file_name(index: usize, object: &Value) -> String {
    let kind = object["kind"].as_str().unwrap_or("object").to_lowercase();
    let name = object["metadata"]["name"].as_str().unwrap_or("unnamed");
    format!("{index:02}-{kind}-{name}.yaml")
}

/// Every container image's repository (the part before the tag).
fn repositories(objects: &[Value]) -> Vec<String> {
    let mut found: Vec<String> = objects
        .iter()
        .filter_map(|o| o["spec"]["template"]["spec"]["containers"].as_array())
        .flatten()
        .filter_map(|c| c["image"].as_str())
        .map(|image| repository(image).to_string())
        .collect();
    found.sort();
    found.dedup();
    found
}

/// An image's repository: the part before the tag.
fn repository(image: &str) -> &str {
    image.rsplit_once(':').map_or(image, |(repo, _)| repo)
}

/// A chart of the objects: each in its own template, the image tag a value, the release's
/// name as a label, as charts are written.
fn chart(objects: &[Value]) -> Files {
    let mut files: Files = vec![
        (
            "Chart.yaml".into(),
            b"apiVersion: v2\nname: boutique\nversion: 0.1.0\n".to_vec(),
        ),
        ("values.yaml".into(), b"image:\n  tag: v0.10.1\n".to_vec()),
    ];
    for (index, object) in objects.iter().enumerate() {
        let mut object = object.clone();
        object["metadata"]["labels"]["app.kubernetes.io/instance"] = "{{ .Release.Name }}".into();
        // The app's containers take the tag; init containers keep their pinned images.
        if let Some(list) = object["spec"]["template"]["spec"]["containers"].as_array_mut() {
            for container in list {
                if let Some(repo) = container["image"]
                    .as_str()
                    .map(|i| repository(i).to_string())
                {
                    container["image"] = format!("{repo}:{{{{ .Values.image.tag }}}}").into();
                }
            }
        }
        let text = serde_yaml_ng::to_string(&object).expect("YAML");
        files.push((
            format!("templates/{}", file_name(index, &object)),
            text.into_bytes(),
        ));
    }
    files
}

/// A Kustomize folder of the objects: each a resource file.
fn overlay(objects: &[Value]) -> Files {
    let names: Vec<String> = objects
        .iter()
        .enumerate()
        .map(|(i, o)| file_name(i, o))
        .collect();
    let kustomization = serde_yaml_ng::to_string(&json!({"resources": names})).expect("YAML");
    let mut files: Files = vec![("kustomization.yaml".into(), kustomization.into_bytes())];
    for (name, object) in names.into_iter().zip(objects) {
        files.push((
            name,
            serde_yaml_ng::to_string(object).expect("YAML").into_bytes(),
        ));
    }
    files
}

fn write(root: &Path, files: &Files) {
    for (path, bytes) in files {
        let target = root.join(path);
        if let Some(parent) = target.parent() {
            std::fs::create_dir_all(parent).expect("create a folder");
        }
        std::fs::write(target, bytes).expect("write a file");
    }
}

/// Runs `command` and returns how long it took and the objects it printed.
fn by_hand(command: &mut Command) -> (Duration, Vec<Value>) {
    let started = Instant::now();
    let output = command.output().expect("run the engine");
    let took = started.elapsed();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let objects = support::yaml_documents(&String::from_utf8_lossy(&output.stdout));
    (took, objects)
}

/// previewd's output is what the engine printed by hand, and every image carries `tag`: the
/// figures are for the same work.
fn same_objects(previewd: &str, by_hand: &[Value], tag: &str) {
    let objects = support::yaml_documents(previewd);
    assert!(
        objects == by_hand,
        "previewd's render differs from the engine's by hand"
    );
    let images: Vec<&str> = objects
        .iter()
        .filter_map(|o| o["spec"]["template"]["spec"]["containers"].as_array())
        .flatten()
        .filter_map(|c| c["image"].as_str())
        .collect();
    assert!(!images.is_empty(), "the render has containers");
    for image in images {
        assert!(
            image.ends_with(&format!(":{tag}")),
            "{image} is not at {tag}"
        );
    }
}

fn median(mut times: Vec<Duration>) -> Duration {
    times.sort();
    times[times.len() / 2]
}

fn ms(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1000.0
}

struct Figures {
    by_hand: Duration,
    new_commit: Duration,
    unchanged: Duration,
    engine_runs_unchanged: usize,
}

fn print(engine: &str, what: &str, figures: &Figures) {
    println!(
        "{engine} ({what}): by hand {:.1} ms, previewd for a new commit {:.1} ms ({:.2}x by hand), \
         previewd for an unchanged push {:.3} ms with {} engine runs (median of {ROUNDS})",
        ms(figures.by_hand),
        ms(figures.new_commit),
        figures.new_commit.as_secs_f64() / figures.by_hand.as_secs_f64(),
        ms(figures.unchanged),
        figures.engine_runs_unchanged,
    );
}

/// The times of every round, for one engine.
#[derive(Default)]
struct Rounds {
    hand: Vec<Duration>,
    fresh: Vec<Duration>,
    again: Vec<Duration>,
    engine_runs_unchanged: usize,
}

impl Rounds {
    /// Runs the engine by hand; returns the objects it printed.
    fn by_hand(&mut self, command: &mut Command) -> Vec<Value> {
        let (took, printed) = by_hand(command);
        assert_eq!(printed.len(), OBJECTS, "{command:?}");
        self.hand.push(took);
        printed
    }

    /// Runs previewd's render for a new commit, then the same render again (futures start
    /// when awaited, so each is timed alone).
    async fn previewd<F>(&mut self, new_commit: F, unchanged: F, by_hand: &[Value], tag: &str)
    where
        F: Future<Output = Result<Rendered, EngineError>>,
    {
        let started = Instant::now();
        let rendered = new_commit.await.expect("previewd's render");
        self.fresh.push(started.elapsed());
        assert!(!rendered.cached, "a new tag is a new render");
        same_objects(&rendered.text, by_hand, tag);
        let started = Instant::now();
        let again = unchanged.await.expect("previewd's render");
        self.again.push(started.elapsed());
        self.engine_runs_unchanged += usize::from(!again.cached);
    }

    fn figures(self) -> Figures {
        Figures {
            by_hand: median(self.hand),
            new_commit: median(self.fresh),
            unchanged: median(self.again),
            engine_runs_unchanged: self.engine_runs_unchanged,
        }
    }
}

async fn helm(engines: &Engines, objects: &[Value]) -> Figures {
    let files = chart(objects);
    let folder = tempfile::tempdir().expect("a folder");
    write(&folder.path().join("chart"), &files);
    let mut rounds = Rounds::default();
    for round in 0..ROUNDS {
        let tag = format!("round-{round}");
        let values = json!({"image": {"tag": tag}});
        write(
            folder.path(),
            &vec![("values.json".into(), values.to_string().into_bytes())],
        );
        let printed = rounds.by_hand(
            Command::new(support::tools::template_command())
                .args(["template", "boutique", "./chart", "--namespace", NAMESPACE])
                .args(["--values", "values.json", "--include-crds"])
                .current_dir(folder.path()),
        );
        let render = HelmRender {
            chart: Chart::Files(&files),
            release: "boutique",
            namespace: NAMESPACE,
            values: &values,
        };
        let (new_commit, unchanged) = (
            engines.helm_template(&render, "bench/app"),
            engines.helm_template(&render, "bench/app"),
        );
        rounds.previewd(new_commit, unchanged, &printed, &tag).await;
    }
    rounds.figures()
}

async fn kustomize(engines: &Engines, objects: &[Value]) -> Figures {
    let files = overlay(objects);
    let repositories = repositories(objects);
    let folder = tempfile::tempdir().expect("a folder");
    write(&folder.path().join("repo"), &files);
    let mut rounds = Rounds::default();
    for round in 0..ROUNDS {
        let tag = format!("round-{round}");
        let images: Vec<Value> = repositories
            .iter()
            .map(|name| json!({"name": name, "newTag": tag}))
            .collect();
        let mine = json!({"namespace": NAMESPACE, "resources": ["../repo"], "images": images});
        write(
            folder.path(),
            &vec![(
                "mine/kustomization.yaml".into(),
                mine.to_string().into_bytes(),
            )],
        );
        let printed = rounds.by_hand(
            Command::new(support::tools::kubectl())
                .args(["kustomize", "mine"])
                .current_dir(folder.path()),
        );
        let render = KustomizeRender {
            files: &files,
            root: "",
            overlay: "",
            namespace: NAMESPACE,
            images: &images,
            patches: &[],
        };
        let (new_commit, unchanged) = (
            engines.kustomize_build(&render, "bench/app"),
            engines.kustomize_build(&render, "bench/app"),
        );
        rounds.previewd(new_commit, unchanged, &printed, &tag).await;
    }
    rounds.figures()
}

fn engines() -> Engines {
    Engines::new(EngineConfig {
        helm: support::tools::template_command(),
        worker: env!("CARGO_BIN_EXE_previewd").into(),
        timeout: Duration::from_secs(120),
        ..Default::default()
    })
}

/// The Online Boutique's template as a render request of commit `sha`.
fn boutique_request(sha: &str) -> RenderRequest {
    let (template, environment) = boutique_at(sha);
    templates_request(
        &environment,
        &template,
        template.spec.manifests.inline.clone(),
        NAMESPACE,
    )
}

/// The Online Boutique's template, and its environment at commit `sha`.
fn boutique_at(sha: &str) -> (PreviewTemplate, PreviewEnvironment) {
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("templates/online-boutique/template.yaml");
    let text = std::fs::read_to_string(path).expect("the example template");
    let template: PreviewTemplate = serde_yaml_ng::from_str(&text).expect("a PreviewTemplate");
    let environment: PreviewEnvironment = serde_json::from_value(json!({
        "apiVersion": "previewd.dev/v1alpha1", "kind": "PreviewEnvironment",
        "metadata": {"name": "online-boutique-pr-2"},
        "spec": {"template": "online-boutique", "source": {"repository": "GoogleCloudPlatform/microservices-demo",
                 "branch": "feature/login", "pullRequest": 2, "headSha": sha}}
    }))
    .expect("an environment");
    (template, environment)
}

/// Medians of `request(round)` answered by a child for a new commit, and of the same request
/// rendered in previewd's own process; both must answer the same.
async fn child_and_here(
    engines: &Engines,
    request: impl Fn(usize) -> RenderRequest,
) -> (Duration, Duration) {
    let (mut child, mut here) = (Vec::new(), Vec::new());
    for round in 0..ROUNDS * 4 {
        let request = request(round);
        let started = Instant::now();
        let (input, key) = request.encode().expect("a request");
        let answer = engines
            .render_isolated("bench/online-boutique", key, input)
            .await
            .expect("the child's answer");
        let answered = decode(answer.text.as_bytes()).expect("an answer");
        child.push(started.elapsed());
        assert!(!answer.cached, "a new commit is a new request");
        let started = Instant::now();
        let in_process = request.render().expect("rendered here");
        here.push(started.elapsed());
        assert_eq!(
            answered, in_process,
            "the child answers what previewd would"
        );
    }
    (median(child), median(here))
}

/// Helm's output for the chart of `objects` placed in waves, and the overlay of `objects`
/// checked: each in a child and in previewd's process (medians).
async fn parsed_apart(engines: &Engines, objects: &[Value]) -> [(Duration, Duration); 2] {
    let files = chart(objects);
    let values = json!({"image": {"tag": "v1"}});
    let render = HelmRender {
        chart: Chart::Files(&files),
        release: "boutique",
        namespace: NAMESPACE,
        values: &values,
    };
    let printed = engines.helm_template(&render, "bench/app").await;
    let printed = printed.expect("the chart renders").text.to_string();
    let output = InlineManifest {
        name: "helm boutique".into(),
        template: printed,
    };
    let place = |round: usize| {
        let (template, environment) = boutique_at(&format!("{round:040x}"));
        place_request(&environment, &template, output.clone(), NAMESPACE)
    };
    let placed = child_and_here(engines, place).await;
    let outline = previewd::engines::kustomize::outline(&overlay(objects), "");
    let check = |round: usize| {
        let (template, environment) = boutique_at(&format!("{round:040x}"));
        RenderRequest {
            job: RenderJob::CheckOverlay(outline.clone()),
            ..templates_request(&environment, &template, Vec::new(), NAMESPACE)
        }
    };
    let checked = child_and_here(engines, check).await;
    [placed, checked]
}

/// previewd's own render of the Online Boutique's template: a child for a new commit, the same
/// request in previewd's process, and the same commit again (no child); the figures are medians.
async fn templates(engines: &Engines) -> (Duration, Duration, Duration) {
    let (mut child, mut here, mut again) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..ROUNDS * 4 {
        let request = boutique_request(&format!("{round:040x}"));
        let (input, key) = request.encode().expect("a request");
        let started = Instant::now();
        let answer = engines
            .render_isolated("bench/online-boutique", key, input)
            .await
            .expect("the child's render");
        child.push(started.elapsed());
        assert!(!answer.cached, "a new commit is a new render");
        let rendered = decode(answer.text.as_bytes()).expect("rendered objects");
        let started = Instant::now();
        let in_process = request.render().expect("rendered here");
        here.push(started.elapsed());
        assert_eq!(
            rendered, in_process,
            "the child renders what previewd would"
        );
        let started = Instant::now();
        let (input, key) = request.encode().expect("a request");
        let kept = engines
            .render_isolated("bench/online-boutique", key, input)
            .await
            .expect("the kept answer");
        assert!(kept.cached, "the same commit runs no child");
        decode(kept.text.as_bytes()).expect("rendered objects");
        again.push(started.elapsed());
    }
    (median(child), median(here), median(again))
}

/// Commits `files` (paths from the repository's root) in the git checkout at `root`; returns
/// the commit's SHA.
fn commit(root: &Path, files: &Files, message: &str) -> String {
    write(root, files);
    let git = |args: &[&str]| {
        let output = Command::new("git")
            .arg("-C")
            .arg(root)
            .args([
                "-c",
                "user.name=bench",
                "-c",
                "user.email=bench@example.com",
            ])
            .args(args)
            .output()
            .expect("run git");
        assert!(output.status.success(), "git {args:?}: {output:?}");
        String::from_utf8_lossy(&output.stdout).trim().to_string()
    };
    git(&["add", "-A"]);
    git(&["commit", "-q", "-m", message]);
    git(&["rev-parse", "HEAD"])
}

/// Forge requests counted so far, every operation.
fn forge_requests(metrics: &ForgeMetrics) -> u64 {
    use prometheus::core::Collector;
    metrics
        .requests
        .collect()
        .iter()
        .flat_map(|family| family.get_metric())
        .map(|metric| metric.get_counter().get_value() as u64)
        .sum()
}

/// The Online Boutique as a chart in a repository (`deploy/chart`, 37 files beside the app's
/// own), served by the sandbox's forge stand-in from a git checkout, and 20 pushes: 18 change
/// only the app (`src/`), 2 change one chart file each. Each push's chart is read through
/// previewd's forge client and repository cache, and rendered by Helm through previewd's
/// engines. Returns (requests of the first commit, per push that changed no chart file, per push
/// that changed one, renders kept of 20).
async fn pushes_of_a_repository_chart(
    engines: &Engines,
    objects: &[Value],
) -> (u64, f64, f64, usize) {
    use previewd::forge::client::ForgeClients;
    use previewd::forge::repository::RepositoryManifests;
    use previewd::model::crd::ForgeKind;
    use previewd::sandbox::forge_standin::ForgeStandIn;
    use previewd::sandbox::repositories::Repositories;
    const REPOSITORY: &str = "bench/boutique";
    let chart_files: Files = chart(objects)
        .into_iter()
        .map(|(path, bytes)| (format!("deploy/chart/{path}"), bytes))
        .collect();
    let checkout = tempfile::tempdir().expect("a folder");
    let init = Command::new("git")
        .args(["init", "-q", "-b", "main"])
        .arg(checkout.path())
        .status();
    assert!(init.expect("git init").success());
    let app = |push: usize| {
        (
            "src/app.txt".to_string(),
            format!("build {push}\n").into_bytes(),
        )
    };
    let mut files = chart_files.clone();
    files.push(app(0));
    files.push(("README.md".into(), b"# The boutique\n".to_vec()));
    let mut commits = vec![commit(checkout.path(), &files, "the chart")];
    let mut changed_chart = Vec::new();
    for push in 1..=20 {
        let change = match push {
            7 => (
                "deploy/chart/values.yaml".to_string(),
                b"image:\n  tag: v0.10.2\n".to_vec(),
            ),
            14 => {
                let (path, bytes) = &chart_files[5];
                let mut edited = bytes.clone();
                edited.extend_from_slice(b"# reviewed\n");
                (path.clone(), edited)
            }
            _ => app(push),
        };
        changed_chart.push(change.0.starts_with("deploy/chart/"));
        commits.push(commit(
            checkout.path(),
            &vec![change],
            &format!("push {push}"),
        ));
    }
    let mut repositories = Repositories::default();
    repositories
        .add(REPOSITORY, checkout.path())
        .expect("serve the checkout");
    let stand_in = ForgeStandIn::serving(repositories)
        .await
        .expect("the forge stand-in");
    let metrics = ForgeMetrics::new();
    let clients = ForgeClients::new(metrics.clone());
    let url = stand_in.url();
    let client = clients
        .get(ForgeKind::Github, Some(&url), b"token", "token")
        .await
        .expect("a forge client");
    let manifests = RepositoryManifests::default();
    let values = json!({"image": {"tag": "v0.10.1"}});
    let (mut unchanged, mut changed, mut kept) = (Vec::new(), Vec::new(), 0);
    let mut first = 0;
    for (index, sha) in commits.iter().enumerate() {
        let before = forge_requests(&metrics);
        let chart = manifests
            .folder(&client, REPOSITORY, "deploy/chart", sha, "bench/pr-1")
            .await
            .expect("the chart at this commit");
        assert_eq!(chart.len(), objects.len() + 2, "the chart's files at {sha}");
        let spent = forge_requests(&metrics) - before;
        match index {
            0 => first = spent,
            _ if changed_chart[index - 1] => changed.push(spent),
            _ => unchanged.push(spent),
        }
        let render = HelmRender {
            chart: Chart::Files(&chart),
            release: "boutique",
            namespace: NAMESPACE,
            values: &values,
        };
        let rendered = engines
            .helm_template(&render, "bench/app")
            .await
            .expect("the render");
        kept += usize::from(rendered.cached && index > 0);
    }
    let mean = |spent: &[u64]| spent.iter().sum::<u64>() as f64 / spent.len() as f64;
    (first, mean(&unchanged), mean(&changed), kept)
}

async fn benchmark() {
    let objects = boutique();
    // One round outside the figures, with engines of its own (so its renders are not cached
    // for the measured rounds): the engines' first load from disk (helm, kubectl).
    let warming = engines();
    helm(&warming, &objects).await;
    kustomize(&warming, &objects).await;
    let engines = engines();
    let chart_figures = helm(&engines, &objects).await;
    print(
        "Helm chart",
        "35 templates, image tag and release name as values",
        &chart_figures,
    );
    let overlay_figures = kustomize(&engines, &objects).await;
    print(
        "Kustomize",
        "35 resources, an images entry per repository",
        &overlay_figures,
    );
    assert_eq!(
        chart_figures.engine_runs_unchanged + overlay_figures.engine_runs_unchanged,
        0,
        "an unchanged push ran an engine"
    );
    let (first, unchanged, changed, kept) = pushes_of_a_repository_chart(&engines, &objects).await;
    println!(
        "Chart from the repository (Online Boutique, 37 files, sandbox forge stand-in, 20 pushes): \
         forge requests {first} for the first commit, {unchanged:.2} per push that changed no chart \
         file (18), {changed:.2} per push that changed one (2); Helm renders kept: {kept} of 20"
    );
    let (child, here, again) = templates(&engines).await;
    println!(
        "Templates (the Online Boutique's inline template, 35 objects): a new commit in a child \
         process {:.2} ms, the same request in previewd's process {:.2} ms ({:.2}x), the same \
         commit again (digest, the child's answer kept and read back) {:.2} ms (median of {})",
        ms(child),
        ms(here),
        child.as_secs_f64() / here.as_secs_f64(),
        ms(again),
        ROUNDS * 4,
    );
    let [(placed_child, placed_here), (checked_child, checked_here)] =
        parsed_apart(&engines, &objects).await;
    println!(
        "Pull-request YAML parsed in a child (the Online Boutique, 35 objects, median of {}): \
         Helm's output placed in waves {:.2} ms in a child, {:.2} ms in previewd's process \
         ({:.2}x); the overlay's kustomization checked {:.2} ms in a child, {:.2} ms in \
         previewd's process ({:.2}x)",
        ROUNDS * 4,
        ms(placed_child),
        ms(placed_here),
        placed_child.as_secs_f64() / placed_here.as_secs_f64(),
        ms(checked_child),
        ms(checked_here),
        checked_child.as_secs_f64() / checked_here.as_secs_f64(),
    );
}
