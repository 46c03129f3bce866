//! Logging set-up: `tracing` with the level from `RUST_LOG` (default `info`), as text or JSON.

use tracing_subscriber::EnvFilter;

use crate::runtime::config::LogFormat;

/// kube's client logs every non-2xx answer at ERROR, including the expected ones (a 404 we
/// handle, a starting apiserver's 500 on /readyz); previewd reports the errors that matter itself.
const DEFAULT_FILTER: &str = "info,kube_client::client::builder=off";
/// For `previewd sandbox --demo`, whose own display is the point: only problems are logged.
const QUIET_FILTER: &str = "warn,kube_client::client::builder=off";

/// Installs the global subscriber. `quiet` lowers the default level to warnings; `RUST_LOG`
/// overrides either.
pub fn init(format: LogFormat, quiet: bool) {
    let default = if quiet { QUIET_FILTER } else { DEFAULT_FILTER };
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Json => builder.json().try_init(),
        LogFormat::Text => builder.try_init(),
    };
}
