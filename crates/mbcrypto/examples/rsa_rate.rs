//! Quick RSA rate probe: signs/s per backend on the calling core, beside aws-lc single-op.
//! `taskset -c 1 cargo run -p mbcrypto --release --example rsa_rate -- [bits] [secs]`
use mbcrypto::rsa::{sign_batch, RsaKey, Scheme, SignJob};
use mbcrypto::{Backend, Hash};
use std::time::{Duration, Instant};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let bits: u32 = args.get(1).map(|s| s.parse().unwrap()).unwrap_or(2048);
    let secs: f64 = args.get(2).map(|s| s.parse().unwrap()).unwrap_or(2.0);
    let rsa = boring::rsa::Rsa::generate(bits).unwrap();
    let der = rsa.private_key_to_der().unwrap();
    let key = RsaKey::from_der(&der).unwrap();
    let digest = [7u8; 32];
    let aws = aws_lc_rs::signature::RsaKeyPair::from_der(&der).unwrap();
    let budget = Duration::from_secs_f64(secs);
    let start = Instant::now();
    let mut n = 0u64;
    let mut sig = vec![0u8; aws.public_modulus_len()];
    let rng = aws_lc_rs::rand::SystemRandom::new();
    while start.elapsed() < budget {
        aws.sign(
            &aws_lc_rs::signature::RSA_PKCS1_SHA256,
            &rng,
            &digest,
            &mut sig,
        )
        .unwrap();
        n += 1;
    }
    let base = n as f64 / start.elapsed().as_secs_f64();
    println!("aws-lc single-op RSA-{bits}: {base:.0} signs/s");
    let only = args.get(3).and_then(|s| Backend::from_name(s));
    for backend in Backend::all_available() {
        if only.is_some_and(|o| o != backend) {
            continue;
        }
        let jobs: Vec<SignJob> = (0..backend.lanes())
            .map(|_| SignJob {
                key: &key,
                scheme: Scheme::Pkcs1(Hash::Sha256),
                digest: &digest,
            })
            .collect();
        let _ = sign_batch(backend, &jobs);
        let start = Instant::now();
        let mut n = 0u64;
        while start.elapsed() < budget {
            for r in sign_batch(backend, &jobs) {
                r.unwrap();
            }
            n += jobs.len() as u64;
        }
        let rate = n as f64 / start.elapsed().as_secs_f64();
        println!(
            "mbcrypto {backend:>8} RSA-{bits}: {rate:.0} signs/s ({:.2}x aws-lc)",
            rate / base
        );
    }
}
