//! Policies applied to connections and requests: access lists, rate limits, traffic split,
//! retries, and the overload manager's actions.

pub(crate) mod access;
pub(crate) mod admission;
pub(crate) mod client_key;
pub(crate) mod client_share;
pub(crate) mod overload;
pub(crate) mod ratelimit;
pub(crate) mod retry;
pub(crate) mod split;
pub mod waf;
