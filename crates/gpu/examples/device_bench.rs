//! On a machine with a CUDA device: checks the kernel against the CPU build of the core, then
//! measures signs/s and batch latency against batch size, the CPU engine's single-signature
//! time, and the crossover batch size. Without a device it prints why and exits 0.
//!
//! ```text
//! cargo run --release -p gpu-engine --example device_bench -- [bits] [seconds-per-size]
//! ```

use gpu_engine::{bench_batch, crossover, GpuConfig, GpuKey};
use std::time::{Duration, Instant};

fn main() {
    let mut args = std::env::args().skip(1);
    let bits: u32 = args.next().map_or(2048, |a| a.parse().expect("bits"));
    let secs: f64 = args.next().map_or(2.0, |a| a.parse().expect("seconds"));
    match gpu_engine::probe() {
        Ok(info) => println!("device: {info}"),
        Err(e) => {
            println!("gpu engine unavailable: {e}");
            return;
        }
    }
    let t = Instant::now();
    let backend = gpu_engine::cuda_backend(&GpuConfig::default()).expect("kernel build");
    println!("NVRTC compile + load: {:?}", t.elapsed());
    let der = boring::rsa::Rsa::generate(bits)
        .unwrap()
        .private_key_to_der()
        .unwrap();
    let key = GpuKey::from_der(&der).unwrap();
    // CPU reference: one aws-lc signature on this machine.
    let alg = keyengine::SignatureAlgorithm::RsaPssSha256;
    let d = alg.hash().digest(b"x");
    let t = Instant::now();
    for _ in 0..50 {
        key.private().sign_digest(alg, &d).unwrap();
    }
    let cpu = t.elapsed() / 50;
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    println!("cpu: {cpu:?} per signature, {cores} cores");
    let mut results = Vec::new();
    let mut size = 1;
    while size <= backend.max_batch().min(65_536) {
        let r = bench_batch(&*backend, &key, size, Duration::from_secs_f64(secs))
            .expect("bench (first batch checked against the CPU core)");
        println!(
            "batch {:>6}: {:>12.0} signs/s  p50 {:>10.3?}  p99 {:>10.3?}  ({} batches)",
            r.batch, r.signs_per_sec, r.p50, r.p99, r.batches
        );
        results.push(r);
        size *= 4;
    }
    match crossover(&results, cpu, cores) {
        Some(b) => println!("crossover: GPU beats {cores} CPU cores from batch {b}"),
        None => println!("crossover: the GPU never beat {cores} CPU cores"),
    }
}
