//! Logging set-up: `tracing` with the level from `RUST_LOG` (default `info`), as text or JSON.

use tracing_subscriber::EnvFilter;

use crate::config::LogFormat;

/// kube's client logs every non-2xx answer at ERROR, including the expected ones (a 404 we
/// handle, a starting apiserver's 500 on /readyz); previewd reports the errors that matter itself.
const DEFAULT_FILTER: &str = "info,kube_client::client::builder=off";

pub fn init(format: LogFormat) {
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(DEFAULT_FILTER));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Json => builder.json().try_init(),
        LogFormat::Text => builder.try_init(),
    };
}
