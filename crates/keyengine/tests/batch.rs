//! The `batch` engine: opportunistic single operations at light load, kernel passes under
//! load, verification of every lane, overload shedding.

use keyengine::testing::{generate_ecdsa_p256_pkcs8, generate_rsa_pkcs8};
use keyengine::{
    BatchConfig, BatchEngine, Engine, KernelBackend, KeyKind, PrivateKey, SignError, SignRequest,
    SignatureAlgorithm,
};
use std::sync::Arc;

fn request(key: &Arc<PrivateKey>, algorithm: SignatureAlgorithm, msg: &[u8]) -> SignRequest {
    SignRequest {
        key: key.id(),
        kind: key.kind(),
        private: Some(key.clone()),
        algorithm,
        digest: algorithm.hash().digest(msg),
    }
}

fn rsa_key() -> Arc<PrivateKey> {
    Arc::new(PrivateKey::from_der("PRIVATE KEY", &generate_rsa_pkcs8()).unwrap())
}

fn queued(config: BatchConfig) -> BatchEngine {
    BatchEngine::new(BatchConfig {
        inline_when_idle: false,
        ..config
    })
    .unwrap()
}

/// Sum of the samples whose line starts with `prefix`.
fn metric(engine: &BatchEngine, prefix: &str) -> f64 {
    let text = engine.metrics_text().unwrap();
    text.lines()
        .filter(|l| l.starts_with(prefix))
        .map(|l| l.rsplit(' ').next().unwrap().parse::<f64>().unwrap())
        .sum()
}

fn by_path(engine: &BatchEngine, path: &str) -> f64 {
    let text = engine.metrics_text().unwrap();
    text.lines()
        .filter(|l| {
            l.starts_with("rampart_batch_operations_total")
                && l.contains(&format!("path=\"{path}\""))
        })
        .map(|l| l.rsplit(' ').next().unwrap().parse::<f64>().unwrap())
        .sum()
}

const ALGS: [SignatureAlgorithm; 3] = [
    SignatureAlgorithm::RsaPkcs1Sha256,
    SignatureAlgorithm::RsaPssSha256,
    SignatureAlgorithm::RsaPkcs1Sha384,
];

/// Submits `n` requests at once (so they queue together) and checks every signature.
async fn burst(
    engine: &BatchEngine,
    key: &Arc<PrivateKey>,
    n: usize,
) -> Vec<Result<Vec<u8>, SignError>> {
    let reqs: Vec<SignRequest> = (0..n)
        .map(|i| request(key, ALGS[i % 3], format!("msg {i}").as_bytes()))
        .collect();
    // Polled together, as concurrent handshakes on an event loop are.
    let results =
        futures_util::future::join_all(reqs.iter().map(|r| engine.submit(r.clone()))).await;
    let mut out = Vec::new();
    for (r, res) in reqs.iter().zip(results) {
        if let Ok(sig) = &res {
            assert!(
                key.verify_digest(r.algorithm, &r.digest, sig),
                "released signature must verify"
            );
        }
        out.push(res);
    }
    out
}

#[tokio::test]
async fn a_lone_request_is_signed_at_once_on_the_caller() {
    let engine = BatchEngine::new(BatchConfig::default()).unwrap();
    let key = rsa_key();
    let r = request(&key, SignatureAlgorithm::RsaPkcs1Sha256, b"lone");
    let sig = engine.submit(r.clone()).await.unwrap();
    assert!(key.verify_digest(r.algorithm, &r.digest, &sig));
    assert_eq!(by_path(&engine, "idle"), 1.0);
    assert_eq!(metric(&engine, "rampart_batch_pass_size_count"), 0.0);
    assert!(engine.verifies_signatures(keyengine::KeyKind::Rsa));
    assert!(!engine.verifies_signatures(keyengine::KeyKind::EcdsaP256));
}

#[tokio::test]
async fn queued_requests_share_kernel_passes_when_it_pays() {
    let engine = queued(BatchConfig::default());
    let key = rsa_key();
    let results = burst(&engine, &key, 64).await;
    assert!(results.iter().all(|r| r.is_ok()));
    let kernel = by_path(&engine, "kernel");
    if engine.backend() == KernelBackend::Portable {
        assert_eq!(
            kernel, 0.0,
            "the portable kernel never beats single operations"
        );
    } else {
        // 64 requests submitted at once: the crypto thread cuts full-width batches.
        assert!(kernel >= 32.0, "kernel signed {kernel} of 64");
        let passes = metric(&engine, "rampart_batch_pass_size_count");
        assert_eq!(metric(&engine, "rampart_batch_lanes_used_total"), kernel);
        assert!(passes >= 1.0 && passes <= kernel);
        let fill = metric(&engine, "rampart_batch_lane_fill_ratio");
        assert!(fill > 0.5 && fill <= 1.0, "fill {fill}");
    }
    assert_eq!(
        by_path(&engine, "kernel") + by_path(&engine, "single"),
        64.0
    );
    assert_eq!(engine.queue_depth(), 0);
}

#[tokio::test]
async fn a_corrupted_lane_is_caught_resigned_and_counted() {
    if KernelBackend::best() == KernelBackend::Portable {
        return; // no kernel passes on this CPU; mbcrypto's own tests cover the portable lanes
    }
    let engine = queued(BatchConfig::default());
    let key = rsa_key();
    key.batch_rsa().unwrap().inject_fault_once();
    let results = burst(&engine, &key, 32).await;
    assert!(
        results.iter().all(|r| r.is_ok()),
        "the faulty lane is re-signed, not failed"
    );
    assert_eq!(metric(&engine, "rampart_batch_faults_total"), 1.0);
    assert_eq!(by_path(&engine, "resign"), 1.0);
}

#[tokio::test]
async fn ecdsa_p256_signs_with_pooled_nonces_where_ifma_exists() {
    let engine = queued(BatchConfig::default());
    let key = Arc::new(PrivateKey::from_der("PRIVATE KEY", &generate_ecdsa_p256_pkcs8()).unwrap());
    assert_eq!(key.kind(), KeyKind::EcdsaP256);
    for i in 0..20 {
        let r = request(
            &key,
            SignatureAlgorithm::EcdsaP256Sha256,
            format!("{i}").as_bytes(),
        );
        let sig = engine.submit(r.clone()).await.unwrap();
        assert!(key.verify_digest(r.algorithm, &r.digest, &sig));
    }
    // With IFMA, P-256 signs with pooled nonces; elsewhere on aws-lc's single path.
    let (pool, single) = (by_path(&engine, "pool"), by_path(&engine, "single"));
    assert_eq!(pool + single, 20.0);
    if KernelBackend::Ifma512.available() {
        assert_eq!(pool, 20.0);
        assert!(metric(&engine, "rampart_batch_nonces_generated_total") >= 20.0);
    }
}

#[tokio::test]
async fn a_full_queue_sheds_load_with_overloaded() {
    let engine = queued(BatchConfig {
        queue_capacity: 2,
        ..BatchConfig::default()
    });
    let key = rsa_key();
    let results = burst(&engine, &key, 40).await;
    let shed = results
        .iter()
        .filter(|r| matches!(r, Err(SignError::Overloaded("batch"))))
        .count();
    assert!(
        shed > 0,
        "a queue of 2 must shed some of 40 simultaneous requests"
    );
    assert!(results
        .iter()
        .all(|r| r.is_ok() || matches!(r, Err(SignError::Overloaded(_)))));
    assert_eq!(
        metric(&engine, "rampart_batch_overload_rejections_total"),
        shed as f64
    );
}

#[test]
fn an_unavailable_backend_is_a_clear_error() {
    if KernelBackend::Ifma512.available() {
        return;
    }
    let err = BatchEngine::new(BatchConfig {
        backend: KernelBackend::Ifma512,
        ..BatchConfig::default()
    })
    .err()
    .unwrap();
    assert!(err.to_string().contains("AVX-512 IFMA"), "{err}");
}

#[test]
fn many_threads_get_valid_signatures() {
    let engine = Arc::new(
        BatchEngine::new(BatchConfig {
            threads: 2,
            ..BatchConfig::default()
        })
        .unwrap(),
    );
    let key = rsa_key();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .build()
        .unwrap();
    let total = rt.block_on(async {
        let mut tasks = Vec::new();
        for t in 0..16 {
            let engine = engine.clone();
            let key = key.clone();
            tasks.push(tokio::spawn(async move {
                for i in 0..40 {
                    let alg = ALGS[i % 3];
                    let r = request(&key, alg, format!("{t}/{i}").as_bytes());
                    let sig = engine.submit(r.clone()).await.unwrap();
                    assert!(key.verify_digest(r.algorithm, &r.digest, &sig));
                }
                40
            }));
        }
        let mut n = 0;
        for t in tasks {
            n += t.await.unwrap();
        }
        n
    });
    assert_eq!(total, 640);
}

#[test]
fn idle_crypto_threads_fill_the_nonce_pool_to_capacity() {
    if !KernelBackend::Ifma512.available() {
        return; // no pool without IFMA (aws-lc signs faster than the portable generator)
    }
    let engine = BatchEngine::new(BatchConfig {
        nonce_pool: Some(mbcrypto::ecdsa::PoolConfig {
            capacity: 512,
            refill_below: 128,
            batch: 64,
        }),
        ..BatchConfig::default()
    })
    .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let size = metric(&engine, "rampart_batch_nonce_pool_size");
        if size >= 512.0 {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "pool stuck at {size}");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert_eq!(
        metric(&engine, "rampart_batch_nonces_generated_total"),
        512.0
    );
}

#[tokio::test]
async fn a_request_dropped_before_it_runs_leaves_the_engine_idle() {
    let engine = BatchEngine::new(BatchConfig::default()).unwrap();
    let key = rsa_key();
    let r = request(&key, SignatureAlgorithm::RsaPkcs1Sha256, b"dropped");
    let fut = engine.submit(r.clone());
    assert_eq!(engine.queue_depth(), 1);
    drop(fut); // the handshake went away before its signature was started
    assert_eq!(engine.queue_depth(), 0);
    // Still idle: the next lone request is signed at once on the caller.
    engine.submit(r).await.unwrap();
    assert_eq!(by_path(&engine, "idle"), 1.0);
}
