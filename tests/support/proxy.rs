//! A TCP proxy between a previewd process and the API server that a test can cut: every open
//! connection (watches included) is dropped and new ones are refused until it is healed. TLS
//! passes through untouched (the server's certificate is for 127.0.0.1, any port).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

pub struct CuttableProxy {
    pub address: SocketAddr,
    cut: watch::Sender<bool>,
    task: JoinHandle<()>,
}

impl CuttableProxy {
    pub async fn start(upstream: SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let (cut, cut_signal) = watch::channel(false);
        let task = tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                let mut cut_signal = cut_signal.clone();
                if *cut_signal.borrow() {
                    continue; // refused: dropped at once
                }
                tokio::spawn(async move {
                    let Ok(mut outbound) = TcpStream::connect(upstream).await else {
                        return;
                    };
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
                        _ = cut_signal.wait_for(|cut| *cut) => {}
                    }
                });
            }
        });
        Self { address, cut, task }
    }

    /// Drops every connection and refuses new ones.
    pub fn cut(&self) {
        self.cut.send_replace(true);
    }

    pub fn heal(&self) {
        self.cut.send_replace(false);
    }

    /// A proxy in front of the server of `kubeconfig`, and a copy of that kubeconfig in `dir`
    /// that goes through it.
    pub async fn in_front_of(kubeconfig: &Path, dir: &Path) -> (Self, PathBuf) {
        let text = std::fs::read_to_string(kubeconfig).unwrap();
        let server = text
            .lines()
            .find_map(|line| line.trim().strip_prefix("server: "))
            .expect("a server in the kubeconfig")
            .trim_matches('"')
            .to_string();
        let upstream: SocketAddr = server
            .strip_prefix("https://")
            .expect("an https server")
            .parse()
            .expect("server is IP:port");
        let proxy = Self::start(upstream).await;
        let proxied = text.replace(&server, &format!("https://{}", proxy.address));
        let path = dir.join("kubeconfig-through-proxy");
        std::fs::write(&path, proxied).unwrap();
        (proxy, path)
    }
}

impl Drop for CuttableProxy {
    fn drop(&mut self) {
        self.task.abort();
        self.cut();
    }
}
