//! The asynchronous private-key offload seam.
//!
//! A TLS handshake that needs a signature hands a *digest* to [`KeyEngine::sign`] and awaits
//! the result; it never learns which engine computed it. Engines ([`Engine`]) are pluggable:
//! `inline` signs on the caller's thread, `threads` on dedicated crypto threads behind a bounded
//! queue, `batch` on the multi-buffer kernel several requests per pass. The [`KeyEngine`] facade routes each request with a [`Scheduler`], verifies every RSA
//! signature against the public key before releasing it (fault attacks) and records metrics.
//!
//! This crate knows nothing of TLS, sockets or configuration files.

mod algorithm;
mod batch;
mod cpu_load;
mod engine;
mod error;
mod facade;
mod inline;
mod key;
mod key_id;
pub mod metrics;
mod registry;
mod scheduler;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
mod threads;

pub use algorithm::{HashAlgorithm, KeyKind, SignatureAlgorithm};
pub use batch::{BatchConfig, BatchEngine};
pub use cpu_load::CpuLoad;
pub use engine::{Engine, SignFuture, SignRequest};
pub use error::SignError;
pub use facade::KeyEngine;
pub use inline::InlineEngine;
pub use key::{KeyLoadError, PrivateKey, PublicKey};
pub use key_id::KeyId;
/// The multi-buffer kernel's lane types (which one the `batch` engine runs).
pub use mbcrypto::Backend as KernelBackend;
pub use metrics::EngineMetrics;
pub use registry::{KeyEntry, KeyRegistry};
pub use scheduler::{CpuOffload, Scheduler, SchedulerPolicy, UnknownEngine};
pub use threads::ThreadsEngine;
