//! The cluster layer: everything that talks to the Kubernetes API on previewd's behalf, below
//! both the webhook side and the reconciler.
//!
//! * [`applier`]: server-side apply with the per-object skip cache;
//! * [`observed`]: one watch per resource kind, keeping each object's content (compact JSON),
//!   its hash and its health;
//! * [`recall`]: what previewd last applied, read back from the cluster after a restart;
//! * [`health`]: the health of one object (pure);
//! * [`caches`]: the template and environment caches the webhook side and the reconciler read;
//! * [`records`]: creating, waking and deleting `PreviewEnvironment`s (with a reason);
//! * [`secrets`]: reading the Secrets templates name, cached briefly;
//! * [`storage_classes`]: which storage classes keep their volumes, read when a plan has claims;
//! * [`target_client`]: a client for a registered target cluster, from inline credentials only;
//! * [`client`]: building clients, each with a bound on the API requests it has in flight;
//! * [`errors`]: API errors in words for conditions and comments;
//! * [`metrics`]: applies and write requests, counted whichever layer writes;
//! * [`writer`]: the one path of every write, with a timeout and result counters.

pub mod applier;
pub mod caches;
pub mod client;
pub mod errors;
pub(crate) mod health;
pub mod installed_crds;
pub mod metrics;
pub mod observed;
pub(crate) mod recall;
pub mod records;
pub mod secrets;
pub mod storage_classes;
pub mod target_client;
pub mod writer;
