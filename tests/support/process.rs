//! A real `previewd` process (the binary under test) for tests that need several of them or a
//! different identity: killed when dropped, so a failing test leaves nothing behind.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use super::webhooks::{SECRET, metric_sum, metric_value, post_github, post_gitlab};

pub struct PreviewdProcess {
    pub name: String,
    pub base: String,
    pub child: Child,
    log: PathBuf,
}

impl PreviewdProcess {
    /// `previewd --log-format json run --kubeconfig KUBECONFIG --listen 127.0.0.1:<free port>`
    /// followed by `args`, with `env` added; stderr goes to `<logs>/<name>.log`.
    pub fn start(
        name: &str,
        kubeconfig: &Path,
        args: &[&str],
        env: &[(String, String)],
        logs: &Path,
    ) -> Self {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let log = logs.join(format!("{name}.log"));
        let mut command = Command::new(env!("CARGO_BIN_EXE_previewd"));
        heaptrack(&mut command, name);
        let child = command
            .args(["--log-format", "json", "run", "--kubeconfig"])
            .arg(kubeconfig)
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .args(args)
            .env("RUST_LOG", "info")
            .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("start previewd");
        Self {
            name: name.to_string(),
            base: format!("http://127.0.0.1:{port}"),
            child,
            log,
        }
    }

    pub async fn wait_ready(&self, http: &reqwest::Client) {
        super::webhooks::wait_until_ready(http, &self.base).await;
    }

    /// Sends a GitHub delivery signed with the tests' secret; expects 202.
    pub async fn send(&self, http: &reqwest::Client, event: &str, delivery: &str, body: &[u8]) {
        let signature = Some(previewd::forge::github::sign(SECRET.as_bytes(), body));
        let (status, answer) =
            post_github(http, &self.base, event, delivery, body, signature).await;
        assert_eq!(status, 202, "{} answered {answer}", self.name);
    }

    /// Sends a GitLab delivery with the tests' token; expects 202.
    pub async fn send_gitlab(
        &self,
        http: &reqwest::Client,
        event: &str,
        delivery: &str,
        body: &[u8],
    ) {
        let (status, answer) = post_gitlab(http, &self.base, event, delivery, body, SECRET).await;
        assert_eq!(status, 202, "{} answered {answer}", self.name);
    }

    /// Its `/metrics` text (`None` when it does not answer).
    pub async fn metrics_text(&self, http: &reqwest::Client) -> Option<String> {
        let response = http.get(format!("{}/metrics", self.base)).send().await;
        response.ok()?.text().await.ok()
    }

    /// The value of one series of its `/metrics`.
    pub async fn metric(&self, http: &reqwest::Client, series: &str) -> Option<f64> {
        metric_value(&self.metrics_text(http).await?, series)
    }

    /// The sum of every series of counter `name` in its `/metrics` (`None`: no answer).
    #[allow(dead_code)] // not every test binary sums a counter
    pub async fn metric_total(&self, http: &reqwest::Client, name: &str) -> Option<f64> {
        Some(metric_sum(&self.metrics_text(http).await?, name))
    }

    pub fn signal(&self, signal: libc::c_int) {
        // SAFETY: kill(2) on our own child's pid.
        unsafe { libc::kill(self.child.id() as libc::pid_t, signal) };
    }

    pub fn log_lines(&self) -> Vec<String> {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .map(str::to_string)
            .collect()
    }
}

impl Drop for PreviewdProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// With `PREVIEWD_TEST_HEAPTRACK=<folder>` set, previewd runs under heaptrack's preload library
/// and its raw allocation record goes to `<folder>/<name>.heaptrack.raw`; read it with
/// `/usr/lib/heaptrack/libexec/heaptrack_interpret < FILE | zstd > FILE.zst` and
/// `heaptrack_print FILE.zst`. Only previewd is profiled, not the test around it.
fn heaptrack(command: &mut Command, name: &str) {
    let Some(folder) = std::env::var_os("PREVIEWD_TEST_HEAPTRACK") else {
        return;
    };
    command
        .env("LD_PRELOAD", "/usr/lib/heaptrack/libheaptrack_preload.so")
        .env(
            "DUMP_HEAPTRACK_OUTPUT",
            Path::new(&folder).join(format!("{name}.heaptrack.raw")),
        );
}
