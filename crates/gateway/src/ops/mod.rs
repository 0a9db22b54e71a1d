//! The operator's side: the admin listener, Prometheus metrics, the access log.

pub(crate) mod access_log;
pub mod admin;
pub mod metrics;
