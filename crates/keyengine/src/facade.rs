//! [`KeyEngine`]: the one object the TLS layer talks to.

use crate::algorithm::SignatureAlgorithm;
use crate::engine::SignRequest;
use crate::error::SignError;
#[cfg(test)]
use crate::key::PrivateKey;
use crate::key_id::KeyId;
use crate::metrics::EngineMetrics;
use crate::registry::{KeyEntry, KeyRegistry};
use crate::scheduler::Scheduler;
use std::future::Future;
use std::sync::{Arc, RwLock};
use std::time::Instant;

/// Looks keys up, routes requests through the scheduler, verifies every RSA signature against
/// the public key before release, and records metrics.
pub struct KeyEngine {
    keys: RwLock<Generations>,
    scheduler: Scheduler,
    metrics: EngineMetrics,
}

/// The keys in force and, after [`KeyEngine::replace_keys`], the ones they replaced: a
/// handshake that picked a certificate just before the swap still finds its key. The
/// generation before that is dropped (and its private keys wiped with it).
struct Generations {
    current: Arc<KeyRegistry>,
    previous: Option<Arc<KeyRegistry>>,
}

impl KeyEngine {
    pub fn new(registry: KeyRegistry, scheduler: Scheduler, metrics: EngineMetrics) -> Arc<Self> {
        Arc::new(KeyEngine {
            keys: RwLock::new(Generations {
                current: Arc::new(registry),
                previous: None,
            }),
            scheduler,
            metrics,
        })
    }

    /// The keys in force.
    pub fn registry(&self) -> Arc<KeyRegistry> {
        self.keys
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .current
            .clone()
    }

    /// Puts `registry` in force (certificates reloaded). Each engine is offered the new RSA
    /// keys' DER first ([`crate::Engine::prepare_rsa_key`]), so a signature on a new key
    /// never reaches an engine that has not seen it. The keys replaced stay known, as a
    /// fallback, until the next replacement.
    pub fn replace_keys(&self, registry: KeyRegistry, rsa_key_ders: &[Vec<u8>]) {
        for der in rsa_key_ders {
            for engine in self.scheduler.engines() {
                engine.prepare_rsa_key(der);
            }
        }
        let mut keys = self.keys.write().unwrap_or_else(|e| e.into_inner());
        let current = std::mem::replace(&mut keys.current, Arc::new(registry));
        keys.previous = Some(current);
    }

    pub fn metrics(&self) -> &EngineMetrics {
        &self.metrics
    }

    /// Every engine's own metrics (see [`crate::Engine::metrics`]).
    pub fn engines_metrics(&self) -> Vec<prometheus::proto::MetricFamily> {
        let mut all: Vec<_> = self.scheduler.engines().flat_map(|e| e.metrics()).collect();
        all.extend(self.scheduler.metrics());
        all
    }

    /// [`KeyEngine::engines_metrics`] in Prometheus text format (tests, tools).
    pub fn engines_metrics_text(&self) -> String {
        crate::metrics::encode(&self.engines_metrics())
    }

    pub fn engine_names(&self) -> Vec<&'static str> {
        self.scheduler.engines().map(|e| e.name()).collect()
    }

    /// The registry entry for `key`, if known (public half always, private half if held):
    /// from the keys in force, else from the ones they replaced.
    pub fn key(&self, key: &KeyId) -> Option<KeyEntry> {
        let keys = self.keys.read().unwrap_or_else(|e| e.into_inner());
        keys.current
            .get(key)
            .or_else(|| keys.previous.as_ref().and_then(|p| p.get(key)))
            .cloned()
    }

    /// Signs `digest` with `key` under `algorithm`. The returned future owns everything it
    /// needs, never blocks its poller, and yields only signatures that verified.
    pub fn sign(
        self: &Arc<Self>,
        key: &KeyId,
        algorithm: SignatureAlgorithm,
        digest: Vec<u8>,
    ) -> impl Future<Output = Result<Vec<u8>, SignError>> + Send + 'static {
        let this = self.clone();
        let entry = self.key(key).ok_or(SignError::KeyNotFound(*key));
        async move {
            let entry = entry?;
            let public = &entry.public;
            if algorithm.key_kind() != public.kind() {
                return Err(SignError::UnsupportedAlgorithm(algorithm));
            }
            let kind = public.kind();
            let Some((slot, engine)) = this.scheduler.pick(kind, entry.private.is_some()) else {
                // Only a public key here, and no engine that signs elsewhere.
                return Err(SignError::KeyNotFound(public.id()));
            };
            let name = engine.name();
            let m = &this.metrics;
            let start = Instant::now();
            let request = SignRequest {
                key: public.id(),
                kind,
                private: entry.private.clone(),
                algorithm,
                digest,
            };
            // Every signature is verified before release, RSA and ECDSA alike: a faulty
            // ECDSA signature can reveal the key as surely as a faulty RSA one.
            let digest_for_check = Some(request.digest.clone());
            // A copy for failing over is only worth making when another engine could take it.
            let can_fail_over =
                entry.private.is_some() && this.scheduler.engines().nth(1).is_some();
            let fallback = can_fail_over.then(|| request.clone());
            let fut = engine.submit(request);
            m.queue_depth
                .with_label_values(&[name])
                .set(engine.queue_depth() as i64);
            let mut result = fut.await;
            let mut producer = engine.clone();
            // An engine that could not take the request (a remote one with every key server
            // down, a full queue) hands it to another engine when this process holds the key.
            if let (
                Err(SignError::Unavailable(..) | SignError::Stopped(_) | SignError::Overloaded(_)),
                Some(req),
            ) = (&result, fallback)
            {
                if let Some((_, alt)) = this.scheduler.pick_except(kind, true, Some(slot)) {
                    producer = alt.clone();
                    tracing::debug!(
                        from = name,
                        to = alt.name(),
                        "failing over to another engine"
                    );
                    m.failovers.with_label_values(&[name, alt.name()]).inc();
                    result = alt.submit(req).await;
                }
            }
            m.queue_depth.with_label_values(&[name]).set(
                this.scheduler
                    .engines()
                    .nth(slot)
                    .map_or(0, |e| e.queue_depth()) as i64,
            );
            let result = result.and_then(|sig| match &digest_for_check {
                Some(d)
                    if !producer.verifies_signatures(kind)
                        && !public.verify_digest(algorithm, d, &sig) =>
                {
                    m.faults
                        .with_label_values(&[name, algorithm.as_str()])
                        .inc();
                    tracing::error!(engine = name, key = %public.id(), %algorithm,
                        "signature failed verification against the public key; not released");
                    Err(SignError::FaultDetected(name))
                }
                _ => Ok(sig),
            });
            let took = start.elapsed();
            match &result {
                Ok(_) => {
                    this.scheduler.record(slot, kind, took);
                    m.sign_seconds
                        .with_label_values(&[name, algorithm.as_str()])
                        .observe(took.as_secs_f64());
                }
                Err(SignError::Overloaded(_)) => m.overload.with_label_values(&[name]).inc(),
                Err(_) => {}
            }
            let label = match &result {
                Ok(_) => "ok",
                Err(e) => e.kind(),
            };
            m.operations
                .with_label_values(&[name, algorithm.as_str(), label])
                .inc();
            result
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{generate_rsa_pkcs8, FaultyEngine};
    use crate::{Engine, InlineEngine, SchedulerPolicy, SignRequest};

    fn engine_with(e: Arc<dyn Engine>) -> (Arc<KeyEngine>, KeyId) {
        engines_with(vec![e], &SchedulerPolicy::default())
    }

    /// A key engine over `engines` holding one fresh RSA key.
    fn engines_with(
        engines: Vec<Arc<dyn Engine>>,
        policy: &SchedulerPolicy,
    ) -> (Arc<KeyEngine>, KeyId) {
        let mut reg = KeyRegistry::new();
        let id = reg.insert(PrivateKey::from_der("PRIVATE KEY", &generate_rsa_pkcs8()).unwrap());
        let sched = Scheduler::new(engines, policy).unwrap();
        (
            KeyEngine::new(reg, sched, EngineMetrics::unregistered()),
            id,
        )
    }

    #[tokio::test]
    async fn signs_and_counts() {
        let (ke, id) = engine_with(Arc::new(InlineEngine));
        let alg = SignatureAlgorithm::RsaPssSha256;
        let sig = ke.sign(&id, alg, alg.hash().digest(b"m")).await.unwrap();
        assert!(ke
            .key(&id)
            .unwrap()
            .public
            .verify_digest(alg, &alg.hash().digest(b"m"), &sig));
        let ok = ke
            .metrics()
            .operations
            .with_label_values(&["inline", alg.as_str(), "ok"])
            .get();
        assert_eq!(ok, 1);
    }

    #[tokio::test]
    async fn corrupted_rsa_signature_is_caught_and_counted() {
        let (ke, id) = engine_with(Arc::new(FaultyEngine));
        let alg = SignatureAlgorithm::RsaPkcs1Sha256;
        let err = ke
            .sign(&id, alg, alg.hash().digest(b"m"))
            .await
            .unwrap_err();
        assert_eq!(err, SignError::FaultDetected("faulty"));
        assert_eq!(ke.metrics().faults_total("faulty"), 1);
    }

    /// Signs, then changes s by one in every ECDSA signature (still valid DER): a fault in
    /// the last step of a signature, the kind that reveals the key.
    struct FaultyEcdsa;

    impl Engine for FaultyEcdsa {
        fn name(&self) -> &'static str {
            "faulty-ecdsa"
        }

        fn submit(&self, request: SignRequest) -> crate::SignFuture {
            let mut result = request.sign_locally();
            if let Ok(sig) = &mut result {
                let last = sig.len() - 1;
                sig[last] ^= 0x01;
            }
            Box::pin(std::future::ready(result))
        }

        fn queue_depth(&self) -> usize {
            0
        }
    }

    #[tokio::test]
    async fn corrupted_ecdsa_signature_is_caught_and_counted() {
        let mut reg = KeyRegistry::new();
        let id = reg.insert(
            PrivateKey::from_der("PRIVATE KEY", &crate::testing::generate_ecdsa_p256_pkcs8())
                .unwrap(),
        );
        let sched =
            Scheduler::new(vec![Arc::new(FaultyEcdsa)], &SchedulerPolicy::default()).unwrap();
        let ke = KeyEngine::new(reg, sched, EngineMetrics::unregistered());
        let alg = SignatureAlgorithm::EcdsaP256Sha256;
        let err = ke
            .sign(&id, alg, alg.hash().digest(b"m"))
            .await
            .unwrap_err();
        assert_eq!(err, SignError::FaultDetected("faulty-ecdsa"));
        assert_eq!(ke.metrics().faults_total("faulty-ecdsa"), 1);
    }

    #[tokio::test]
    async fn unknown_key_and_wrong_algorithm_are_errors() {
        let (ke, id) = engine_with(Arc::new(InlineEngine));
        let missing = KeyId([7; 20]);
        let alg = SignatureAlgorithm::RsaPssSha256;
        assert_eq!(
            ke.sign(&missing, alg, vec![0; 32]).await.unwrap_err(),
            SignError::KeyNotFound(missing)
        );
        let ec = SignatureAlgorithm::EcdsaP256Sha256;
        assert_eq!(
            ke.sign(&id, ec, vec![0; 32]).await.unwrap_err(),
            SignError::UnsupportedAlgorithm(ec)
        );
    }

    /// Signs inline and records the RSA keys it is offered ahead.
    #[derive(Default)]
    struct PreparingEngine {
        prepared: std::sync::Mutex<Vec<Vec<u8>>>,
    }
    impl Engine for PreparingEngine {
        fn name(&self) -> &'static str {
            "preparing"
        }
        fn submit(&self, request: SignRequest) -> crate::SignFuture {
            InlineEngine.submit(request)
        }
        fn queue_depth(&self) -> usize {
            0
        }
        fn prepare_rsa_key(&self, der: &[u8]) {
            self.prepared.lock().unwrap().push(der.to_vec());
        }
    }

    #[tokio::test]
    async fn replaced_keys_sign_and_the_keys_they_replaced_last_one_more_replacement() {
        let preparing = Arc::new(PreparingEngine::default());
        let (ke, first) = engine_with(preparing.clone());
        let alg = SignatureAlgorithm::RsaPssSha256;
        let digest = alg.hash().digest(b"m");
        let generation = |ke: &KeyEngine| {
            let der = generate_rsa_pkcs8();
            let mut reg = KeyRegistry::new();
            let id = reg.insert(PrivateKey::from_der("PRIVATE KEY", &der).unwrap());
            ke.replace_keys(reg, std::slice::from_ref(&der));
            (id, der)
        };

        let (second, second_der) = generation(&ke);
        assert_eq!(*preparing.prepared.lock().unwrap(), vec![second_der]);
        assert_eq!(ke.registry().len(), 1);
        assert!(ke.registry().get(&second).is_some());
        for id in [second, first] {
            let sig = ke.sign(&id, alg, digest.clone()).await.unwrap();
            assert!(ke
                .key(&id)
                .unwrap()
                .public
                .verify_digest(alg, &digest, &sig));
        }

        // A second replacement drops the first generation.
        let (third, _) = generation(&ke);
        assert!(ke.sign(&third, alg, digest.clone()).await.is_ok());
        assert!(ke.sign(&second, alg, digest.clone()).await.is_ok());
        assert_eq!(
            ke.sign(&first, alg, digest.clone()).await.unwrap_err(),
            SignError::KeyNotFound(first)
        );
        assert!(ke.key(&first).is_none());
    }

    /// Stands in for a remote engine whose key servers are all down.
    struct DownEngine;
    impl Engine for DownEngine {
        fn name(&self) -> &'static str {
            "down"
        }
        fn submit(&self, _: SignRequest) -> crate::SignFuture {
            Box::pin(std::future::ready(Err(SignError::Unavailable(
                "down",
                "no server".into(),
            ))))
        }
        fn queue_depth(&self) -> usize {
            0
        }
        fn needs_private_key(&self) -> bool {
            false
        }
    }

    #[tokio::test]
    async fn unavailable_engine_fails_over_to_a_local_engine_when_the_key_is_held() {
        let mut policy = SchedulerPolicy::default();
        policy.pins.insert(crate::KeyKind::Rsa, "down".into());
        let (ke, id) = engines_with(vec![Arc::new(DownEngine), Arc::new(InlineEngine)], &policy);
        let alg = SignatureAlgorithm::RsaPssSha256;
        let sig = ke.sign(&id, alg, alg.hash().digest(b"m")).await.unwrap();
        assert!(ke
            .key(&id)
            .unwrap()
            .public
            .verify_digest(alg, &alg.hash().digest(b"m"), &sig));
        assert_eq!(
            ke.metrics()
                .failovers
                .with_label_values(&["down", "inline"])
                .get(),
            1
        );
    }

    #[tokio::test]
    async fn public_only_key_without_a_remote_engine_is_key_not_found() {
        let mut reg = KeyRegistry::new();
        let key = PrivateKey::from_der("PRIVATE KEY", &generate_rsa_pkcs8()).unwrap();
        let id = reg.insert_public(key.public_key());
        let sched =
            Scheduler::new(vec![Arc::new(InlineEngine)], &SchedulerPolicy::default()).unwrap();
        let ke = KeyEngine::new(reg, sched, EngineMetrics::unregistered());
        let alg = SignatureAlgorithm::RsaPssSha256;
        assert_eq!(
            ke.sign(&id, alg, vec![0; 32]).await.unwrap_err(),
            SignError::KeyNotFound(id)
        );
    }
}
