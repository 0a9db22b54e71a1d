//! Shared by the gpu engine's integration tests: one RSA-2048 key per test binary, requests
//! on it, and a burst of them signed and checked.
#![allow(dead_code)]

use keyengine::{Engine, PrivateKey, SignRequest, SignatureAlgorithm};
use std::sync::{Arc, OnceLock};

pub fn key_der() -> Vec<u8> {
    static DER: OnceLock<Vec<u8>> = OnceLock::new();
    DER.get_or_init(|| {
        boring::rsa::Rsa::generate(2048)
            .unwrap()
            .private_key_to_der()
            .unwrap()
    })
    .clone()
}

pub fn private_key() -> Arc<PrivateKey> {
    Arc::new(PrivateKey::from_der("RSA PRIVATE KEY", &key_der()).unwrap())
}

pub fn request(key: &Arc<PrivateKey>, alg: SignatureAlgorithm, msg: &[u8]) -> SignRequest {
    SignRequest {
        key: key.id(),
        kind: key.kind(),
        private: Some(key.clone()),
        algorithm: alg,
        digest: alg.hash().digest(msg),
    }
}

pub const ALGS: [SignatureAlgorithm; 3] = [
    SignatureAlgorithm::RsaPssSha256,
    SignatureAlgorithm::RsaPkcs1Sha384,
    SignatureAlgorithm::RsaPssSha512,
];

/// Submits `n` requests at once and checks every signature with the public key.
pub async fn sign_many(engine: &dyn Engine, key: &Arc<PrivateKey>, n: usize) {
    let futs: Vec<_> = (0..n)
        .map(|i| {
            let alg = ALGS[i % ALGS.len()];
            let req = request(key, alg, format!("m{i}").as_bytes());
            let digest = req.digest.clone();
            (alg, digest, engine.submit(req))
        })
        .collect();
    for (alg, digest, f) in futs {
        let sig = f.await.expect("signed");
        assert!(key.verify_digest(alg, &digest, &sig), "{alg}");
    }
}
