//! The asynchronous private-key offload seam.
//!
//! A TLS handshake that needs a signature hands a *digest* to [`KeyEngine::sign`] and awaits
//! the result; it never learns which engine computed it. Engines ([`Engine`]) are pluggable:
//! `inline` signs on the caller's thread, `threads` on dedicated crypto threads behind a bounded
//! queue. The [`KeyEngine`] facade routes each request with a [`Scheduler`], verifies every RSA
//! signature against the public key before releasing it (fault attacks) and records metrics.
//!
//! This crate knows nothing of TLS, sockets or configuration files.

mod algorithm;
mod engine;
mod facade;
mod inline;
mod key;
mod metrics;
mod registry;
mod scheduler;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
mod threads;

pub use algorithm::{HashAlgorithm, KeyKind, SignatureAlgorithm};
pub use engine::{Engine, SignError, SignFuture, SignRequest};
pub use facade::KeyEngine;
pub use inline::InlineEngine;
pub use key::{KeyId, KeyLoadError, PrivateKey, PublicKey};
pub use metrics::EngineMetrics;
pub use registry::{KeyEntry, KeyRegistry};
pub use scheduler::{Scheduler, SchedulerPolicy, UnknownEngine};
pub use threads::ThreadsEngine;
