//! ECDSA P-256 signing rates on one thread: nonce generation per backend, burst (pool
//! pre-filled, then only signing), sustained (the same thread signs and refills whenever the
//! pool drops below its threshold), direct signing, and aws-lc's signer for reference; then
//! verification with a key's precomputed table against aws-lc's verifier.
//!
//! Run pinned to one core: `taskset -c 1 cargo run -p mbcrypto --release --example ecdsa_rate`
//! (optionally followed by a backend name and a number of seconds per figure).

use aws_lc_rs::rand::SystemRandom;
use aws_lc_rs::signature::{
    EcdsaKeyPair, KeyPair, ParsedPublicKey, ECDSA_P256_SHA256_ASN1, ECDSA_P256_SHA256_ASN1_SIGNING,
};
use mbcrypto::ecdsa::{sign, sign_direct, NoncePool, P256Key, P256PublicKey, PoolConfig};
use mbcrypto::Backend;
use std::hint::black_box;
use std::time::{Duration, Instant};

/// Runs `f` in rounds until `secs` have passed; returns operations per second.
fn rate(secs: f64, mut f: impl FnMut() -> usize) -> f64 {
    let start = Instant::now();
    let mut ops = 0;
    while start.elapsed() < Duration::from_secs_f64(secs) {
        ops += f();
    }
    ops as f64 / start.elapsed().as_secs_f64()
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let only = args.get(1).and_then(|a| Backend::from_name(a));
    let secs: f64 = args.get(2).and_then(|a| a.parse().ok()).unwrap_or(2.0);
    let backends: Vec<Backend> = match only {
        Some(b) => vec![b],
        None => Backend::all_available(),
    };

    let rng = SystemRandom::new();
    let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_ASN1_SIGNING, &rng).unwrap();
    let key = P256Key::from_der(pkcs8.as_ref()).unwrap();
    let awslc = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_ASN1_SIGNING, pkcs8.as_ref()).unwrap();
    let digest = [0x5Au8; 32];

    // The first refill builds the comb table.
    let t = Instant::now();
    NoncePool::new(PoolConfig::default(), Backend::Portable).refill(1);
    println!(
        "table build + first nonce: {:.1} ms",
        t.elapsed().as_secs_f64() * 1e3
    );

    for &backend in &backends {
        for batch in [8, 32, 64, 128, 256] {
            if batch % backend.lanes() != 0 {
                continue;
            }
            let cfg = PoolConfig {
                capacity: batch,
                refill_below: batch,
                batch,
            };
            // A fresh pool per round keeps only generation in the loop.
            let r = rate(secs / 2.0, || NoncePool::new(cfg, backend).refill(batch));
            println!(
                "{backend:>8}: nonce generation, batch {batch:>3}: {r:>9.0} nonces/s ({:.2} us each)",
                1e6 / r
            );
        }
    }

    for &backend in &backends {
        let cfg = PoolConfig::default();
        // Burst: the pool is full; only signing is timed (refills between rounds untimed).
        let pool = NoncePool::new(
            PoolConfig {
                capacity: 200_000,
                ..cfg
            },
            backend,
        );
        let mut signed = 0usize;
        let mut busy = Duration::ZERO;
        while busy < Duration::from_secs_f64(secs) {
            pool.refill(200_000 - pool.len());
            let start = Instant::now();
            for _ in 0..100_000 {
                black_box(sign(&key, &pool, black_box(&digest)).unwrap());
            }
            busy += start.elapsed();
            signed += 100_000;
        }
        assert_eq!(pool.stats().fallbacks, 0);
        let burst = signed as f64 / busy.as_secs_f64();

        // Sustained: one thread signs and refills whenever the pool needs it.
        let pool = NoncePool::new(cfg, backend);
        pool.refill(cfg.capacity);
        let sustained = rate(secs, || {
            let mut n = 0;
            for _ in 0..256 {
                if pool.needs_refill() {
                    pool.refill(cfg.batch);
                }
                black_box(sign(&key, &pool, black_box(&digest)).unwrap());
                n += 1;
            }
            n
        });
        assert_eq!(pool.stats().fallbacks, 0);
        println!("{backend:>8}: burst {burst:>9.0} signs/s   sustained {sustained:>9.0} signs/s");
    }

    let direct = rate(secs, || {
        black_box(sign_direct(&key, black_box(&digest)).unwrap());
        1
    });
    println!("  direct: {direct:>9.0} signs/s");
    let aws = rate(secs, || {
        black_box(awslc.sign(&rng, black_box(&digest)).unwrap());
        1
    });
    println!("  aws-lc: {aws:>9.0} signs/s (sign, SHA-256 of a 32-byte message included)");

    // Verification: the precomputed-table verifier against aws-lc's, the key parsed once.
    let msg = [0x5Au8; 32];
    let sig = awslc.sign(&rng, &msg).unwrap();
    let hashed = aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, &msg);
    let point = awslc.public_key().as_ref();
    let t = Instant::now();
    let public = P256PublicKey::from_sec1(point).unwrap();
    println!(
        "  verify: key table built in {:.2} ms",
        t.elapsed().as_secs_f64() * 1e3
    );
    let mine = rate(secs, || {
        assert!(public.verify(black_box(hashed.as_ref()), black_box(sig.as_ref())));
        1
    });
    let parsed = ParsedPublicKey::new(&ECDSA_P256_SHA256_ASN1, point).unwrap();
    let aws_verify = rate(secs, || {
        assert!(parsed
            .verify_digest_sig(black_box(&hashed), black_box(sig.as_ref()))
            .is_ok());
        1
    });
    println!(
        "  verify: table {mine:>9.0}/s ({:.1} us)   aws-lc {aws_verify:>9.0}/s ({:.1} us)",
        1e6 / mine,
        1e6 / aws_verify
    );
}
