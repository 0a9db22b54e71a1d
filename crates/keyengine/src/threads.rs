//! The `threads` engine: dedicated crypto threads fed by a bounded queue, so that event loops
//! never run an RSA private-key operation.

use crate::engine::{Engine, SignFuture, SignRequest};
use crate::error::SignError;
use crossbeam_channel::{bounded, Sender, TrySendError};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use tokio::sync::oneshot;

type Job = (SignRequest, oneshot::Sender<Result<Vec<u8>, SignError>>);

pub struct ThreadsEngine {
    tx: Option<Sender<Job>>,
    depth: Arc<AtomicUsize>,
    threads: Vec<JoinHandle<()>>,
}

impl ThreadsEngine {
    /// Starts `threads` crypto threads sharing a queue of `queue_capacity` requests.
    pub fn new(threads: usize, queue_capacity: usize) -> Self {
        let threads = threads.max(1);
        let (tx, rx) = bounded::<Job>(queue_capacity.max(1));
        let depth = Arc::new(AtomicUsize::new(0));
        let handles = (0..threads)
            .map(|i| {
                let rx = rx.clone();
                let depth = depth.clone();
                std::thread::Builder::new()
                    .name(format!("rampart-crypto-{i}"))
                    .spawn(move || {
                        for (req, reply) in rx.iter() {
                            let result = req.sign_locally();
                            depth.fetch_sub(1, Ordering::Relaxed);
                            // The handshake may have gone away meanwhile; nothing to do then.
                            let _ = reply.send(result);
                        }
                    })
                    .expect("spawn crypto thread")
            })
            .collect();
        ThreadsEngine {
            tx: Some(tx),
            depth,
            threads: handles,
        }
    }
}

impl Engine for ThreadsEngine {
    fn name(&self) -> &'static str {
        "threads"
    }

    fn submit(&self, request: SignRequest) -> SignFuture {
        let (reply, rx) = oneshot::channel();
        let Some(tx) = &self.tx else {
            return Box::pin(std::future::ready(Err(SignError::Stopped("threads"))));
        };
        self.depth.fetch_add(1, Ordering::Relaxed);
        match tx.try_send((request, reply)) {
            Ok(()) => {
                Box::pin(async move { rx.await.unwrap_or(Err(SignError::Stopped("threads"))) })
            }
            Err(e) => {
                self.depth.fetch_sub(1, Ordering::Relaxed);
                let err = match e {
                    TrySendError::Full(_) => SignError::Overloaded("threads"),
                    TrySendError::Disconnected(_) => SignError::Stopped("threads"),
                };
                Box::pin(std::future::ready(Err(err)))
            }
        }
    }

    fn queue_depth(&self) -> usize {
        self.depth.load(Ordering::Relaxed)
    }

    fn parallelism(&self) -> usize {
        self.threads.len()
    }
}

impl Drop for ThreadsEngine {
    fn drop(&mut self) {
        self.tx.take(); // closes the queue; threads drain it and exit
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::key::PrivateKey;
    use crate::testing::generate_rsa_pkcs8;
    use crate::SignatureAlgorithm;

    #[tokio::test]
    async fn full_queue_fails_fast_and_queue_drains() {
        let key = Arc::new(PrivateKey::from_der("PRIVATE KEY", &generate_rsa_pkcs8()).unwrap());
        let engine = ThreadsEngine::new(1, 2);
        let alg = SignatureAlgorithm::RsaPssSha256;
        let req = SignRequest {
            key: key.id(),
            kind: key.kind(),
            private: Some(key.clone()),
            algorithm: alg,
            digest: alg.hash().digest(b"x"),
        };
        // Submit far more than capacity at once: some must be rejected immediately.
        let futs: Vec<_> = (0..64).map(|_| engine.submit(req.clone())).collect();
        let results = futures_join(futs).await;
        let overloaded = results
            .iter()
            .filter(|r| matches!(r, Err(SignError::Overloaded("threads"))))
            .count();
        let ok = results.iter().filter(|r| r.is_ok()).count();
        assert!(overloaded > 0, "a bounded queue must shed load");
        assert!(ok >= 2, "accepted requests complete");
        assert_eq!(ok + overloaded, 64);
        assert_eq!(engine.queue_depth(), 0);
    }

    async fn futures_join(futs: Vec<SignFuture>) -> Vec<Result<Vec<u8>, SignError>> {
        let mut out = Vec::new();
        for f in futs {
            out.push(f.await);
        }
        out
    }
}
