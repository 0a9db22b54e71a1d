//! The `replay` engine of `rampart bench engine`: no signing at all. It answers from a thread
//! of its own, as an off-CPU engine does, with the one signature it made and checked when it
//! was built, for requests with that digest (any other is refused). A cell with it measures
//! the ceiling of everything around the signing: the harness, the facade, the queue and the
//! reply's cross-thread wake-up. An engine cannot be measured faster than this row.

use crossbeam_channel::{bounded, Receiver, Sender, TrySendError};
use keyengine::{Engine, KeyKind, PrivateKey, SignError, SignFuture, SignRequest};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use tokio::sync::oneshot;

const NAME: &str = "replay";
/// Requests answered per wake-up of the reply thread at most.
const BATCH: usize = 4096;

type Job = (Vec<u8>, oneshot::Sender<Result<Vec<u8>, SignError>>);

pub(crate) struct ReplayEngine {
    tx: Sender<Job>,
    depth: Arc<AtomicUsize>,
    kind: KeyKind,
}

impl ReplayEngine {
    /// Signs `digest` once with `key` (with `algorithm`), checks the signature, and starts the
    /// reply thread.
    pub(crate) fn new(
        key: &PrivateKey,
        algorithm: keyengine::SignatureAlgorithm,
        digest: &[u8],
    ) -> anyhow::Result<Self> {
        let signature = key.sign_digest(algorithm, digest)?;
        anyhow::ensure!(
            key.verify_digest(algorithm, digest, &signature),
            "the replayed signature failed verification"
        );
        let (tx, rx) = bounded::<Job>(1 << 20);
        let depth = Arc::new(AtomicUsize::new(0));
        let d = depth.clone();
        let expected = digest.to_vec();
        std::thread::Builder::new()
            .name("rampart-replay".into())
            .spawn(move || reply_loop(&rx, &d, &expected, &signature))?;
        Ok(Self {
            tx,
            depth,
            kind: key.kind(),
        })
    }
}

/// Answers what is queued, up to [`BATCH`] at a time, until the engine is dropped.
fn reply_loop(rx: &Receiver<Job>, depth: &AtomicUsize, digest: &[u8], signature: &[u8]) {
    let mut jobs = Vec::with_capacity(BATCH);
    while let Ok(first) = rx.recv() {
        jobs.push(first);
        while jobs.len() < BATCH {
            match rx.try_recv() {
                Ok(j) => jobs.push(j),
                Err(_) => break,
            }
        }
        depth.fetch_sub(jobs.len(), Ordering::Relaxed);
        for (d, reply) in jobs.drain(..) {
            let answer = if d == digest {
                Ok(signature.to_vec())
            } else {
                Err(SignError::Unavailable(
                    NAME,
                    "replays one digest's signature only".into(),
                ))
            };
            let _ = reply.send(answer);
        }
    }
}

impl Engine for ReplayEngine {
    fn name(&self) -> &'static str {
        NAME
    }

    fn submit(&self, request: SignRequest) -> SignFuture {
        let (reply, rx) = oneshot::channel();
        self.depth.fetch_add(1, Ordering::Relaxed);
        match self.tx.try_send((request.digest, reply)) {
            Ok(()) => Box::pin(async move { rx.await.unwrap_or(Err(SignError::Stopped(NAME))) }),
            Err(e) => {
                self.depth.fetch_sub(1, Ordering::Relaxed);
                let err = match e {
                    TrySendError::Full(_) => SignError::Overloaded(NAME),
                    TrySendError::Disconnected(_) => SignError::Stopped(NAME),
                };
                Box::pin(std::future::ready(Err(err)))
            }
        }
    }

    fn queue_depth(&self) -> usize {
        self.depth.load(Ordering::Relaxed)
    }

    fn parallelism(&self) -> usize {
        BATCH
    }

    /// Its one signature was checked against the public key when the engine was built.
    fn verifies_signatures(&self, kind: KeyKind) -> bool {
        kind == self.kind
    }
}
