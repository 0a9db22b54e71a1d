//! Stress: 100,000 ECDSA P-256 signatures (pooled nonces) and 2,000 RSA-2048 signatures
//! (kernel passes) through one batch engine from many threads: every signature verifies and
//! no ECDSA nonce is ever used twice (no r value repeats).

use keyengine::testing::{generate_ecdsa_p256_pkcs8, generate_rsa_pkcs8};
use keyengine::{BatchConfig, BatchEngine, Engine, PrivateKey, SignRequest, SignatureAlgorithm};
use std::collections::HashSet;
use std::sync::{Arc, Mutex};

/// r from a DER ECDSA-Sig-Value (SEQUENCE { INTEGER r, INTEGER s }), without leading zeros.
fn r_of(sig: &[u8]) -> Vec<u8> {
    assert_eq!(sig[0], 0x30);
    let body = if sig[1] & 0x80 == 0 {
        &sig[2..]
    } else {
        &sig[3..]
    };
    assert_eq!(body[0], 0x02);
    let len = body[1] as usize;
    let r = &body[2..2 + len];
    r.iter().skip_while(|&&b| b == 0).copied().collect()
}

fn run(
    engine: &Arc<BatchEngine>,
    key: &Arc<PrivateKey>,
    alg: SignatureAlgorithm,
    threads: usize,
    per_thread: usize,
) -> Vec<Vec<u8>> {
    let out = Arc::new(Mutex::new(Vec::with_capacity(threads * per_thread)));
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let (engine, key, out) = (engine.clone(), key.clone(), out.clone());
            std::thread::spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .build()
                    .unwrap();
                rt.block_on(async {
                    let mut done = 0;
                    while done < per_thread {
                        let n = 64.min(per_thread - done);
                        let reqs: Vec<SignRequest> = (0..n)
                            .map(|i| SignRequest {
                                key: key.id(),
                                kind: key.kind(),
                                private: Some(key.clone()),
                                algorithm: alg,
                                digest: alg.hash().digest(format!("{t}/{}", done + i).as_bytes()),
                            })
                            .collect();
                        let sigs = futures_util::future::join_all(
                            reqs.iter().map(|r| engine.submit(r.clone())),
                        )
                        .await;
                        let mut mine = Vec::with_capacity(n);
                        for (r, s) in reqs.iter().zip(sigs) {
                            let s = s.expect("signature");
                            assert!(
                                key.verify_digest(alg, &r.digest, &s),
                                "invalid signature released"
                            );
                            mine.push(s);
                        }
                        out.lock().unwrap().extend(mine);
                        done += n;
                    }
                });
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    Arc::try_unwrap(out).unwrap().into_inner().unwrap()
}

#[test]
fn a_hundred_thousand_signatures_all_valid_and_no_nonce_reused() {
    let engine = Arc::new(
        BatchEngine::new(BatchConfig {
            threads: 2,
            ..BatchConfig::default()
        })
        .unwrap(),
    );
    let ec = Arc::new(PrivateKey::from_der("PRIVATE KEY", &generate_ecdsa_p256_pkcs8()).unwrap());
    let sigs = run(&engine, &ec, SignatureAlgorithm::EcdsaP256Sha256, 8, 12_500);
    assert_eq!(sigs.len(), 100_000);
    let distinct: HashSet<Vec<u8>> = sigs.iter().map(|s| r_of(s)).collect();
    assert_eq!(distinct.len(), 100_000, "an ECDSA nonce was used twice");
    let rsa = Arc::new(PrivateKey::from_der("PRIVATE KEY", &generate_rsa_pkcs8()).unwrap());
    let sigs = run(&engine, &rsa, SignatureAlgorithm::RsaPssSha256, 4, 500);
    assert_eq!(sigs.len(), 2_000);
    let text = engine.metrics_text().unwrap();
    assert!(text.contains("rampart_batch_operations_total"), "{text}");
}
