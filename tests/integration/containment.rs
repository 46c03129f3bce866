//! The kernel's walls around the real engines (`previewd::engines::contain`): with previewd's
//! own checks of the input turned off, what a pull request's kustomization or chart asks an
//! engine to fetch or read never arrives. Every case runs twice: without the walls, where the
//! loopback server (standing in for an internal address) receives the request or the outside
//! file is read, which shows the case is a real way out; and behind them, where nothing
//! arrives. The spellings are the ones a parser of previewd's could read differently from Go's
//! (case-folded keys, Unicode that folds to ASCII): behind the walls, parity stops mattering.

use std::io::{Read, Write};
use std::net::TcpListener;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use previewd::engines::contain::{ContainmentMode, Walls};
use previewd::engines::helm::{Chart, HelmRender};
use previewd::engines::kustomize::KustomizeRender;
use previewd::engines::process::{self, Run};
use previewd::engines::{EngineConfig, Engines};
use serde_json::json;

use crate::support::tools;

/// A loopback HTTP server that answers every request with a ConfigMap (so that a fetch would
/// succeed and its body land in the output) and counts what it received.
struct Listener {
    port: u16,
    requests: Arc<AtomicUsize>,
}

fn listen() -> Listener {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let requests = Arc::new(AtomicUsize::new(0));
    let counter = requests.clone();
    std::thread::spawn(move || {
        for mut stream in listener.incoming().flatten() {
            counter.fetch_add(1, Ordering::SeqCst);
            let _ = stream.set_read_timeout(Some(Duration::from_millis(500)));
            let _ = stream.read(&mut [0u8; 4096]);
            let body = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: fetched\ndata:\n  stolen: \"yes\"\n";
            let _ = write!(
                stream,
                "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    Listener { port, requests }
}

impl Listener {
    fn received(&self) -> usize {
        // A request in flight when the engine gave up is counted all the same.
        std::thread::sleep(Duration::from_millis(200));
        self.requests.load(Ordering::SeqCst)
    }
}

/// The engines alone: `kustomize_build` runs what it is given (previewd checks an overlay in a
/// render worker before, `reconcile::renders`), so these runs have no check of the input.
fn engines(containment: ContainmentMode) -> Engines {
    Engines::new(EngineConfig {
        helm: tools::helm().to_path_buf(),
        kubectl: tools::kubectl().to_path_buf(),
        timeout: Duration::from_secs(60),
        containment,
        ..Default::default()
    })
}

fn files(list: &[(&str, String)]) -> Vec<(String, Vec<u8>)> {
    list.iter()
        .map(|(path, text)| (path.to_string(), text.clone().into_bytes()))
        .collect()
}

async fn build(engines: &Engines, kustomization: &str) -> Result<String, String> {
    let read = files(&[
        ("kustomization.yaml", kustomization.to_string()),
        (
            "web.yaml",
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: web\n".into(),
        ),
    ]);
    let render = KustomizeRender {
        files: &read,
        root: "deploy",
        overlay: "",
        namespace: "preview-web-pr-1",
        images: &[],
        patches: &[],
    };
    engines
        .kustomize_build(&render, "team/web")
        .await
        .map(|rendered| rendered.text.to_string())
        .map_err(|e| e.to_string())
}

/// Overlays that make Kustomize fetch `http://127.0.0.1:<port>/…`, by every field that loads
/// a file, some with keys Go's JSON decoder matches by Unicode case folding.
fn reaching_overlays(port: u16) -> Vec<(&'static str, String)> {
    let url = format!("http://127.0.0.1:{port}");
    vec![
        (
            "remote resource",
            format!("resources: [web.yaml, {url}/base.yaml]\n"),
        ),
        (
            "remote git base (Kustomize runs git)",
            format!("resources: [web.yaml, \"git::{url}/org/repo.git//base?timeout=10s\"]\n"),
        ),
        (
            "upper-case key",
            format!("RESOURCES: [web.yaml, {url}/upper.yaml]\n"),
        ),
        (
            "key with a long s (U+017F folds to s)",
            format!("re\u{17f}ources: [web.yaml, {url}/folded.yaml]\n"),
        ),
        (
            "generator file",
            format!(
                "resources: [web.yaml]\nconfigMapGenerator:\n- name: gen\n  files: [{url}/file]\n"
            ),
        ),
        (
            "generator envs entry",
            format!(
                "resources: [web.yaml]\nconfigMapGenerator:\n- name: gen\n  envs: [{url}/env]\n"
            ),
        ),
        (
            "patch path",
            format!("resources: [web.yaml]\npatches:\n- path: {url}/patch.yaml\n"),
        ),
        (
            "replacements path",
            format!("resources: [web.yaml]\nreplacements:\n- path: {url}/replacements.yaml\n"),
        ),
        (
            "openapi path",
            format!("resources: [web.yaml]\nopenapi:\n  path: {url}/schema.json\n"),
        ),
        (
            "flow-style tag after a colon",
            format!("{{resources: !!seq [web.yaml, {url}/tagged.yaml]}}\n"),
        ),
    ]
}

#[tokio::test]
async fn kustomize_fetches_nothing_behind_the_walls_whatever_the_spelling() {
    let open = engines(ContainmentMode::Off);
    let walled = engines(ContainmentMode::Required);
    let server = listen();
    let cases = reaching_overlays(server.port);
    let mut shown = Vec::new();
    for (case, overlay) in &cases {
        let before = server.received();
        let _ = build(&open, overlay).await;
        assert!(
            server.received() > before,
            "{case}: without the walls Kustomize should fetch (else the case shows nothing):\n{overlay}"
        );
        let before = server.received();
        let walled_build = build(&walled, overlay).await;
        assert_eq!(
            server.received(),
            before,
            "{case}: a request got through the walls:\n{overlay}\n{walled_build:?}"
        );
        if let Ok(text) = &walled_build {
            assert!(!text.contains("stolen"), "{case}: {text}");
        }
        shown.push(*case);
    }
    assert_eq!(shown.len(), cases.len());
}

#[tokio::test]
async fn kustomize_reads_no_folder_outside_its_own_behind_the_walls() {
    // A base outside the private folder, named by a path that climbs out of it (Kustomize's
    // root-only load restriction lets a base folder be anywhere). Both folders are in the
    // temporary folder: the private folder's `repo/` is two levels below it.
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(
        outside.path().join("kustomization.yaml"),
        "resources: [secret.yaml]\n",
    )
    .unwrap();
    std::fs::write(
        outside.path().join("secret.yaml"),
        "apiVersion: v1\nkind: Secret\nmetadata:\n  name: operator\nstringData:\n  token: operator-token\n",
    )
    .unwrap();
    let name = outside.path().file_name().unwrap().to_string_lossy();
    let overlay = format!("resources: [web.yaml, ../../{name}]\n");

    let open = build(&engines(ContainmentMode::Off), &overlay).await;
    assert!(
        open.as_ref()
            .is_ok_and(|text| text.contains("operator-token")),
        "without the walls the outside folder is read: {open:?}"
    );
    let walled = build(&engines(ContainmentMode::Required), &overlay).await;
    // Kustomize cannot even see the folder's kustomization there.
    let said = walled.expect_err("behind the walls the outside folder cannot be read");
    assert!(
        said.contains("unable to find one of 'kustomization.yaml'")
            && !said.contains("operator-token"),
        "{said}"
    );
}

async fn template(engines: &Engines, template: &str) -> Result<String, String> {
    let chart = files(&[
        (
            "Chart.yaml",
            "apiVersion: v2\nname: web\nversion: 0.1.0\n".into(),
        ),
        ("templates/web.yaml", template.to_string()),
    ]);
    let values = json!({});
    let render = HelmRender {
        chart: Chart::Files(&chart),
        release: "web",
        namespace: "preview-web-pr-1",
        values: &values,
    };
    engines
        .helm_template(&render, "team/web")
        .await
        .map(|rendered| rendered.text.to_string())
        .map_err(|e| e.to_string())
}

/// `getHostByName` asks DNS only under `--enable-dns`, which previewd never passes (so it
/// answers "" in previewd's renders, `engines/helm.rs`); a `helm` run with it resolves
/// `localhost` (from /etc/hosts) without the walls and nothing behind them.
#[tokio::test]
async fn helm_resolves_no_host_behind_the_walls() {
    let chart = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: web\ndata:\n  \
                 address: {{ getHostByName \"localhost\" | quote }}\n";
    let in_previewd = template(&engines(ContainmentMode::Off), chart)
        .await
        .unwrap();
    assert!(in_previewd.contains("address: \"\""), "{in_previewd}");

    let folder = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(folder.path().join("chart/templates")).unwrap();
    std::fs::write(
        folder.path().join("chart/Chart.yaml"),
        "apiVersion: v2\nname: web\nversion: 0.1.0\n",
    )
    .unwrap();
    std::fs::write(folder.path().join("chart/templates/web.yaml"), chart).unwrap();
    let helm_with_dns = |mode| {
        let home = folder.path().join("home").display().to_string();
        process::run(Run {
            program: tools::helm(),
            args: ["template", "web", "./chart", "--enable-dns"]
                .map(String::from)
                .to_vec(),
            folder: folder.path(),
            env: vec![("HOME", home)],
            timeout: Duration::from_secs(60),
            max_output: 1 << 20,
            max_memory: 384 << 20,
            reads_input: false,
            walls: Walls::sealed(Some(folder.path()), mode),
        })
    };
    let open = helm_with_dns(ContainmentMode::Off).await.unwrap();
    assert!(
        open.contains("127.0.0.1") || open.contains("::1"),
        "without the walls localhost resolves: {open}"
    );
    let walled = helm_with_dns(ContainmentMode::Required).await;
    if let Ok(text) = &walled {
        assert!(
            !text.contains("127.0.0.1") && !text.contains("::1"),
            "{text}"
        );
    }
}

/// What else a chart names at an address: a dependency's repository, values that hold URLs and
/// `lookup`. `helm template` fetches none of them, with or without the walls (a dependency
/// must be in `charts/`, and `lookup` finds nothing without a cluster); shown here so that a
/// Helm that started to would be caught behind the walls.
#[tokio::test]
async fn helm_fetches_no_dependency_value_or_lookup_with_or_without_the_walls() {
    let server = listen();
    let url = format!("http://127.0.0.1:{}", server.port);
    let chart = files(&[
        (
            "Chart.yaml",
            format!(
                "apiVersion: v2\nname: web\nversion: 0.1.0\ndependencies:\n- name: db\n  \
                 version: 1.0.0\n  repository: {url}/charts\n"
            ),
        ),
        ("values.yaml", format!("schema: {url}/values.json\n")),
        (
            "templates/web.yaml",
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: web\ndata:\n  \
             found: {{ lookup \"v1\" \"Secret\" \"kube-system\" \"\" | toJson | quote }}\n"
                .into(),
        ),
    ]);
    let values = json!({"extra": format!("{url}/extra")});
    for containment in [ContainmentMode::Off, ContainmentMode::Required] {
        let render = HelmRender {
            chart: Chart::Files(&chart),
            release: "web",
            namespace: "preview-web-pr-1",
            values: &values,
        };
        let _ = engines(containment)
            .helm_template(&render, "team/web")
            .await;
        assert_eq!(server.received(), 0, "{containment:?}");
    }
}

#[tokio::test]
async fn an_ordinary_chart_and_overlay_render_the_same_behind_the_walls() {
    let chart = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {{ .Release.Name }}\n\
                 data:\n  namespace: {{ .Release.Namespace }}\n";
    let open = template(&engines(ContainmentMode::Off), chart)
        .await
        .unwrap();
    let walled = template(&engines(ContainmentMode::Required), chart)
        .await
        .unwrap();
    assert_eq!(open, walled);
    let overlay = "resources: [web.yaml]\nconfigMapGenerator:\n- name: gen\n  literals: [a=b]\n";
    let open = build(&engines(ContainmentMode::Off), overlay)
        .await
        .unwrap();
    let walled = build(&engines(ContainmentMode::Required), overlay)
        .await
        .unwrap();
    assert_eq!(open, walled);
}
