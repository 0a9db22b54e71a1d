//! The engine interface every signing backend implements.

use crate::algorithm::{KeyKind, SignatureAlgorithm};
use crate::error::SignError;
use crate::key::PrivateKey;
use crate::key_id::KeyId;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

/// One signing request: sign `digest` with key `key` under `algorithm`. `private` is the
/// private key when this process holds it; engines that sign elsewhere (remote key servers)
/// need only the id.
#[derive(Clone)]
pub struct SignRequest {
    pub key: KeyId,
    pub kind: KeyKind,
    pub private: Option<Arc<PrivateKey>>,
    pub algorithm: SignatureAlgorithm,
    pub digest: Vec<u8>,
}

impl SignRequest {
    /// Signs at once on this thread with the held private key.
    pub fn sign_locally(&self) -> Result<Vec<u8>, SignError> {
        match &self.private {
            Some(k) => k.sign_digest(self.algorithm, &self.digest),
            None => Err(SignError::KeyNotFound(self.key)),
        }
    }
}

/// The future an engine returns. It must not block the thread that polls it.
pub type SignFuture = Pin<Box<dyn Future<Output = Result<Vec<u8>, SignError>> + Send>>;

/// A signing backend. The [`crate::KeyEngine`] facade verifies every signature of engines
/// that do not verify their own ([`Engine::verifies_signatures`]).
pub trait Engine: Send + Sync + 'static {
    /// A stable name, used in configuration, metrics and logs.
    fn name(&self) -> &'static str;

    /// Starts signing. A full queue must fail fast with [`SignError::Overloaded`], never queue
    /// without bound.
    fn submit(&self, request: SignRequest) -> SignFuture;

    /// Requests accepted but not yet finished.
    fn queue_depth(&self) -> usize;

    /// How many operations the engine runs at once (threads, lanes, ...). The scheduler uses it
    /// with the measured service time to estimate completion.
    fn parallelism(&self) -> usize {
        1
    }

    /// Whether the engine needs the private key in this process (false for engines that
    /// sign elsewhere, by key id).
    fn needs_private_key(&self) -> bool {
        true
    }

    /// The engine's own estimate of how long a request of `kind` submitted now would take to
    /// finish, for engines whose cost is not `queue / parallelism × service time` (batching
    /// engines: a pass costs about the same for one request as for a full set of lanes).
    /// `None` lets the scheduler use that generic estimate.
    fn expected_completion(&self, _kind: KeyKind) -> Option<std::time::Duration> {
        None
    }

    /// Whether the engine's private-key work runs off this process's CPU (a GPU: the CPU only
    /// pads, blinds and checks). While the CPU is saturated the scheduler prefers such engines
    /// ([`crate::SchedulerPolicy::offload`]).
    fn offloads_cpu(&self) -> bool {
        false
    }

    /// Whether the engine can sign at all here (false for a GPU engine without a device). The
    /// scheduler never routes to an unavailable engine; its metrics are still exported.
    fn available(&self) -> bool {
        true
    }

    /// Whether the engine checks every signature with keys of `kind` against the public key
    /// itself before returning it (the facade then does not check again).
    fn verifies_signatures(&self, kind: crate::KeyKind) -> bool {
        let _ = kind;
        false
    }

    /// Offered each RSA private key (PKCS#1 or PKCS#8 DER) this process comes to hold after
    /// start (certificates reloaded), before any request for it. Engines that prepare keys
    /// ahead (the GPU's key records) take it here; the others find the key in each
    /// [`SignRequest`]. A key the engine cannot take must still be signed: it is handed back
    /// to the CPU, as a key it never saw is.
    fn prepare_rsa_key(&self, _der: &[u8]) {}

    /// Engine-specific metrics (e.g. per key server), read when `/metrics` is scraped and
    /// encoded with the gateway's own. Names must start with `rampart_`.
    fn metrics(&self) -> Vec<prometheus::proto::MetricFamily> {
        Vec::new()
    }

    /// [`Engine::metrics`] in Prometheus text format (tests, tools).
    fn metrics_text(&self) -> Option<String> {
        let families = self.metrics();
        (!families.is_empty()).then(|| crate::metrics::encode(&families))
    }
}
