//! The model: previewd's custom resources and the pure vocabulary around them (names, durations,
//! labels and annotations, who a request's client is). Every other layer builds on it; it imports none of them and does no
//! I/O.

pub mod ceiling;
pub mod clients;
pub mod clock;
pub mod crd;
pub mod durations;
pub mod footprint;
pub mod grants;
pub mod kinds;
pub mod metadata;
pub mod naming;
pub mod placement;
pub mod pod_kinds;
pub mod quantity;
pub mod quota;
pub mod rbac;
pub mod refusal;
