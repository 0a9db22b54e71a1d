//! Test engines and key generators shared by this crate's tests and other crates' tests
//! (feature `testing`). Not for production configurations.

use crate::engine::{Engine, SignFuture, SignRequest};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

/// A fresh RSA-2048 key as PKCS#8 DER.
pub fn generate_rsa_pkcs8() -> Vec<u8> {
    use aws_lc_rs::encoding::AsDer;
    let k =
        aws_lc_rs::rsa::KeyPair::generate(aws_lc_rs::rsa::KeySize::Rsa2048).expect("rsa keygen");
    k.as_der().expect("pkcs8").as_ref().to_vec()
}

/// A fresh ECDSA P-256 key as PKCS#8 DER.
pub fn generate_ecdsa_p256_pkcs8() -> Vec<u8> {
    let rng = aws_lc_rs::rand::SystemRandom::new();
    aws_lc_rs::signature::EcdsaKeyPair::generate_pkcs8(
        &aws_lc_rs::signature::ECDSA_P256_SHA256_ASN1_SIGNING,
        &rng,
    )
    .expect("ec keygen")
    .as_ref()
    .to_vec()
}

/// Signs correctly, but only after a timer: stands in for a slow offload (a remote key server,
/// a GPU batch). Proves that handshakes wait without blocking anything.
pub struct DelayEngine {
    pub delay: Duration,
    in_flight: std::sync::Arc<AtomicUsize>,
    peak_in_flight: std::sync::Arc<AtomicUsize>,
}

impl DelayEngine {
    pub fn new(delay: Duration) -> Self {
        DelayEngine {
            delay,
            in_flight: Default::default(),
            peak_in_flight: Default::default(),
        }
    }

    /// The most signatures that were waiting at once since this engine was made: how many
    /// handshakes overlapped their waits. A caller that blocked on each signature sees 1.
    pub fn peak_in_flight(&self) -> usize {
        self.peak_in_flight.load(Ordering::Relaxed)
    }
}

impl Engine for DelayEngine {
    fn name(&self) -> &'static str {
        "delay"
    }

    fn submit(&self, request: SignRequest) -> SignFuture {
        let delay = self.delay;
        let in_flight = self.in_flight.clone();
        let now = in_flight.fetch_add(1, Ordering::Relaxed) + 1;
        self.peak_in_flight.fetch_max(now, Ordering::Relaxed);
        Box::pin(async move {
            tokio::time::sleep(delay).await;
            in_flight.fetch_sub(1, Ordering::Relaxed);
            request.sign_locally()
        })
    }

    fn queue_depth(&self) -> usize {
        self.in_flight.load(Ordering::Relaxed)
    }

    fn parallelism(&self) -> usize {
        usize::MAX
    }
}

/// Signs, then flips a bit in every RSA signature: a hardware or lane fault.
#[derive(Default)]
pub struct FaultyEngine;

impl Engine for FaultyEngine {
    fn name(&self) -> &'static str {
        "faulty"
    }

    fn submit(&self, request: SignRequest) -> SignFuture {
        let mut result = request.sign_locally();
        if let (Ok(sig), true) = (&mut result, request.algorithm.is_rsa()) {
            let i = sig.len() / 2;
            sig[i] ^= 0x01;
        }
        Box::pin(std::future::ready(result))
    }

    fn queue_depth(&self) -> usize {
        0
    }
}
