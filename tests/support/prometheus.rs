//! A real Prometheus server (Debian's `prometheus` package, installed when missing, as the
//! sandbox installs its own packages) scraping an endpoint the test serves, every second.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running Prometheus; stopped when dropped.
pub struct Prometheus {
    child: Child,
    /// Its base URL, `http://127.0.0.1:PORT`.
    pub url: String,
    _data: tempfile::TempDir,
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The `prometheus` program, installed from Debian's packages when missing (once per process).
fn program() -> PathBuf {
    static INSTALL: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _turn = INSTALL.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(found) = previewd::sandbox::machine::which("prometheus") {
        return found;
    }
    previewd::sandbox::machine::ensure_debian_packages(
        &["prometheus"],
        &previewd::sandbox::StderrProgress,
    )
    .expect("install Debian's prometheus package");
    previewd::sandbox::machine::which("prometheus").expect("prometheus installed")
}

impl Prometheus {
    /// Starts Prometheus on a free loopback port, scraping `target`'s `/metrics` every second;
    /// returns once it is ready.
    pub async fn scraping(target: SocketAddr) -> Self {
        let program = tokio::task::spawn_blocking(program).await.unwrap();
        let data = tempfile::tempdir().unwrap();
        let config = data.path().join("prometheus.yml");
        std::fs::write(
            &config,
            format!(
                "global: {{scrape_interval: 1s, evaluation_interval: 1s}}\nscrape_configs:\n  - job_name: ingress\n    static_configs: [{{targets: [\"{target}\"]}}]\n"
            ),
        )
        .unwrap();
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let child = Command::new(program)
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                data.path().join("tsdb").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(data.path().join("prometheus.log")).unwrap())
            .spawn()
            .expect("start prometheus");
        let prometheus = Self {
            child,
            url: format!("http://127.0.0.1:{port}"),
            _data: data,
        };
        let http = reqwest::Client::new();
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let ready = http.get(format!("{}/-/ready", prometheus.url)).send().await;
            if ready.is_ok_and(|r| r.status().is_success()) {
                return prometheus;
            }
            assert!(
                Instant::now() < deadline,
                "Prometheus was not ready within 60 s"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}
