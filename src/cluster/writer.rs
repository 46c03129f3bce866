//! The one way previewd writes to the Kubernetes API: every write request (apply, delete,
//! status, Event, sleep) goes through [`Writer::write`], which counts it, bounds it with a
//! timeout, and counts how it ended (`ok`, `error`, `timeout`). An API server that accepts a
//! connection and never answers must not hold a reconcile, and a write that fails must show up
//! in `previewd_write_results_total` whichever layer made it.

use std::future::Future;
use std::time::Duration;

use super::metrics::ClusterMetrics;

/// How long one write may take. kube's client waits up to ~5 minutes for an answer; a
/// reconcile waiting that long keeps the environment's status stale for as long.
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(30);

/// A write that did not answer within the timeout.
#[derive(Debug, thiserror::Error)]
#[error("{operation}: no answer from the Kubernetes API within {after:?}")]
pub struct WriteTimedOut {
    pub operation: &'static str,
    pub after: Duration,
}

#[derive(Clone)]
pub struct Writer {
    metrics: ClusterMetrics,
    timeout: Duration,
}

impl Writer {
    pub fn new(metrics: ClusterMetrics) -> Self {
        Self::with_timeout(metrics, WRITE_TIMEOUT)
    }

    pub fn with_timeout(metrics: ClusterMetrics, timeout: Duration) -> Self {
        Self { metrics, timeout }
    }

    pub fn metrics(&self) -> &ClusterMetrics {
        &self.metrics
    }

    /// Sends the write `request` of `operation` (one of
    /// [`super::metrics::WRITE_OPERATIONS`]). A timeout is a transient error
    /// (`kube::Error::Service`), retried like an outage.
    pub async fn write<T>(
        &self,
        operation: &'static str,
        request: impl Future<Output = Result<T, kube::Error>>,
    ) -> Result<T, kube::Error> {
        self.metrics.write(operation);
        let result = match tokio::time::timeout(self.timeout, request).await {
            Ok(result) => result,
            Err(_) => {
                self.metrics.write_result(operation, "timeout");
                return Err(kube::Error::Service(Box::new(WriteTimedOut {
                    operation,
                    after: self.timeout,
                })));
            }
        };
        self.metrics
            .write_result(operation, if result.is_ok() { "ok" } else { "error" });
        result
    }

    /// Counts a write that a library sends on previewd's behalf (kube's finalizer helper), so
    /// that the total stays complete.
    pub fn counted(&self, operation: &'static str) {
        self.metrics.write(operation);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn writes_are_counted_by_how_they_ended() {
        let metrics = ClusterMetrics::new();
        let writer = Writer::with_timeout(metrics.clone(), Duration::from_millis(50));
        assert_eq!(writer.write("status", async { Ok(1) }).await.ok(), Some(1));
        let refused = writer
            .write::<()>("status", async {
                Err(kube::Error::Service("connection reset".into()))
            })
            .await;
        assert!(refused.is_err());
        let hung = writer
            .write::<()>("apply", std::future::pending())
            .await
            .expect_err("a write that never answers times out");
        assert!(hung.to_string().contains("apply: no answer"), "{hung}");
        let results = |operation: &str, result: &str| {
            metrics
                .write_results
                .with_label_values(&[operation, result])
                .get()
        };
        assert_eq!(results("status", "ok"), 1);
        assert_eq!(results("status", "error"), 1);
        assert_eq!(results("apply", "timeout"), 1);
        assert_eq!(metrics.total_writes(), 3);
    }
}
