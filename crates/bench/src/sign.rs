//! `rampart bench sign`: single-operation signing rate on one thread, aws-lc (the key
//! engine's single-operation path) beside the BoringSSL that `boring` vendors, in one run.
//! This is the measurement behind the key engine's choice of implementation.

use boring::hash::MessageDigest;
use boring::pkey::PKey;
use boring::rsa::Padding;
use boring::sign::{RsaPssSaltlen, Signer};
use keyengine::{PrivateKey, SignatureAlgorithm};
use serde::Serialize;
use std::time::{Duration, Instant};

#[derive(Debug, Serialize)]
pub struct SignRate {
    pub implementation: &'static str,
    pub algorithm: &'static str,
    pub signs_per_sec: f64,
}

fn rate(mut op: impl FnMut(), duration: Duration) -> f64 {
    for _ in 0..50 {
        op();
    }
    let start = Instant::now();
    let mut n = 0u64;
    while start.elapsed() < duration {
        for _ in 0..20 {
            op();
        }
        n += 20;
    }
    n as f64 / start.elapsed().as_secs_f64()
}

/// Measures each implementation for `duration` per algorithm.
pub fn measure(duration: Duration) -> anyhow::Result<Vec<SignRate>> {
    let rsa = PKey::from_rsa(boring::rsa::Rsa::generate(2048)?)?;
    let group = boring::ec::EcGroup::from_curve_name(boring::nid::Nid::X9_62_PRIME256V1)?;
    let ec = PKey::from_ec_key(boring::ec::EcKey::generate(&group)?)?;
    let mut out = Vec::new();
    for (key, alg, name) in [
        (&rsa, SignatureAlgorithm::RsaPssSha256, "rsa2048_pss_sha256"),
        (
            &ec,
            SignatureAlgorithm::EcdsaP256Sha256,
            "ecdsa_p256_sha256",
        ),
    ] {
        let engine_key = PrivateKey::from_pem(&key.private_key_to_pem_pkcs8()?)?;
        let digest = alg.hash().digest(b"benchmark transcript");
        out.push(SignRate {
            implementation: "aws-lc (keyengine inline)",
            algorithm: name,
            signs_per_sec: rate(
                || {
                    engine_key.sign_digest(alg, &digest).expect("sign");
                },
                duration,
            ),
        });
        out.push(SignRate {
            implementation: "BoringSSL (boring crate)",
            algorithm: name,
            signs_per_sec: rate(
                || {
                    let mut s = Signer::new(MessageDigest::sha256(), key).expect("signer");
                    if alg.is_rsa() {
                        s.set_rsa_padding(Padding::PKCS1_PSS).expect("pss");
                        s.set_rsa_pss_saltlen(RsaPssSaltlen::DIGEST_LENGTH)
                            .expect("salt");
                    }
                    s.update(b"benchmark transcript").expect("update");
                    s.sign_to_vec().expect("sign");
                },
                duration,
            ),
        });
    }
    Ok(out)
}
