//! On a machine with a CUDA device: checks the kernel against the CPU build of the core, then
//! measures signs/s and batch latency against batch size, the CPU engine's single-signature
//! time, and the crossover batch size. Without a device it prints why and exits 0.
//!
//! ```text
//! cargo run --release -p gpu-engine --example device_bench -- [bits] [seconds-per-size]
//!     [--sizes 1,16,256] [--block 128] [--window 5] [--streams 2] [--split 1|2|8|16|32]
//!     [--table-shared] [--carry-chains]
//!     [--kernel-dir DIR | --cubin FILE]
//! device_bench cpu-side    # the CPU's share of a GPU signature (needs no device)
//! device_bench BITS fault [--cubin FILE] [--split S ...]   # a real device fault, and after
//! device_bench --emit-ptx FILE [--kernel-dir DIR] [--window W] [--split S]   # needs NVRTC only
//! ```
//! `--kernel-dir` compiles `DIR/rsa_core.h` + `DIR/rsa_group.h` + `DIR/rsa_kernel.cu` instead of the built-in text:
//! a changed kernel measured without rebuilding (the self-check still compares it with the CPU
//! build of the built-in core). `--cubin` loads a module built elsewhere for this device (NVRTC
//! and ptxas on the build machine), so the device spends no time compiling; it must have been
//! built for the `--split` given.
//! Without `--sizes`: 1, 4, 16, … 65,536.

use gpu_engine::{bench_batch, crossover, GpuConfig, GpuKey};
use std::time::{Duration, Instant};

/// A fresh RSA key of `bits`, prepared for the GPU.
fn rsa_key(bits: u32) -> GpuKey {
    let der = boring::rsa::Rsa::generate(bits)
        .unwrap()
        .private_key_to_der()
        .unwrap();
    GpuKey::from_der(&der).unwrap()
}

fn main() {
    let mut positional = Vec::new();
    let mut config = GpuConfig::default();
    let mut sizes: Option<Vec<usize>> = None;
    let mut kernel_dir: Option<String> = None;
    let mut cubin: Option<String> = None;
    let mut emit_ptx: Option<String> = None;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut value = |name: &str| {
            args.next()
                .unwrap_or_else(|| panic!("{name} needs a value"))
        };
        match a.as_str() {
            "--sizes" => {
                sizes = Some(
                    value("--sizes")
                        .split(',')
                        .map(|s| s.parse().expect("--sizes: numbers"))
                        .collect(),
                )
            }
            "--block" => config.threads_per_block = value("--block").parse().expect("--block"),
            "--window" => config.window = value("--window").parse().expect("--window"),
            "--streams" => config.streams = value("--streams").parse().expect("--streams"),
            "--split" => config.threads_per_request = value("--split").parse().expect("--split"),
            "--table-shared" => config.table_shared = true,
            "--carry-chains" => config.carry_chains = true,
            "--kernel-dir" => kernel_dir = Some(value("--kernel-dir")),
            "--cubin" => cubin = Some(value("--cubin")),
            "--emit-ptx" => emit_ptx = Some(value("--emit-ptx")),
            _ => positional.push(a),
        }
    }
    let read_dir = |dir: &str| {
        let read = |f: &str| {
            std::fs::read_to_string(format!("{dir}/{f}")).unwrap_or_else(|e| panic!("{f}: {e}"))
        };
        read("rsa_core.h") + &read("rsa_group.h") + &read("rsa_kernel.cu")
    };
    if positional.first().map(String::as_str) == Some("cpu-side") {
        // The CPU's share of a GPU signature (no device needed).
        for bits in [2048u32, 3072, 4096] {
            let key = rsa_key(bits);
            let alg = keyengine::SignatureAlgorithm::RsaPssSha256;
            let (prepare, finish) = gpu_engine::bench_cpu_side(&key, alg, 2000);
            println!("RSA-{bits}: prepare (PSS, blinding) {prepare:?}, finish (unblinding, verification) {finish:?}");
        }
        return;
    }
    if let Some(file) = emit_ptx {
        // For sm_90 (H100, H200); ptxas turns it into a cubin for `--cubin`.
        let source = kernel_dir
            .as_deref()
            .map_or_else(gpu_engine::cuda::kernel_source, read_dir);
        let ptx =
            gpu_engine::cuda::compile_kernel_source(source, (9, 0), config.shape()).expect("NVRTC");
        std::fs::write(&file, ptx.to_src()).expect("write PTX");
        return;
    }
    let bits: u32 = positional
        .first()
        .map_or(2048, |a| a.parse().expect("bits"));
    let secs: f64 = positional
        .get(1)
        .filter(|a| *a != "fault")
        .map_or(2.0, |a| a.parse().expect("seconds"));
    match gpu_engine::probe() {
        Ok(info) => println!("device: {info}"),
        Err(e) => {
            println!("gpu engine unavailable: {e}");
            return;
        }
    }
    let t = Instant::now();
    let backend: std::sync::Arc<dyn gpu_engine::BatchBackend> = match (&kernel_dir, &cubin) {
        (_, Some(file)) => {
            println!("module from {file}");
            std::sync::Arc::new(
                gpu_engine::cuda::CudaBackend::with_module(&config, module(&config, Some(file)))
                    .expect("module load"),
            )
        }
        (None, None) => gpu_engine::cuda_backend(&config).expect("kernel build"),
        (Some(dir), None) => {
            let source = read_dir(dir);
            println!("kernel from {dir}");
            std::sync::Arc::new(
                gpu_engine::cuda::CudaBackend::with_source(&config, source).expect("kernel build"),
            )
        }
    };
    println!(
        "NVRTC compile + load: {:?}; RSA-{bits}, {:?}, {} per block, {} streams",
        t.elapsed(),
        config.shape(),
        config.threads_per_block,
        backend.streams()
    );
    let key = rsa_key(bits);
    if positional.get(1).map(String::as_str) == Some("fault") {
        fault(backend, &config, cubin.as_deref(), &key);
        return;
    }
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
    let sizes = sizes.unwrap_or_else(|| {
        std::iter::successors(Some(1usize), |s| Some(s * 4))
            .take_while(|&s| s <= backend.max_batch().min(65_536))
            .collect()
    });
    let mut results = Vec::new();
    for size in sizes {
        let r = bench_batch(&*backend, &key, size, Duration::from_secs_f64(secs))
            .expect("bench (first batch checked against the CPU core)");
        println!(
            "batch {:>6}: {:>12.0} signs/s  p50 {:>10.3?}  p99 {:>10.3?}  ({} batches)",
            r.batch, r.signs_per_sec, r.p50, r.p99, r.batches
        );
        results.push(r);
    }
    match crossover(&results, cpu, cores) {
        Some(b) => println!("crossover: GPU beats {cores} CPU cores from batch {b}"),
        None => println!("crossover: the GPU never beat {cores} CPU cores"),
    }
}

/// A real device fault (an illegal address on the backend's context), then what still works:
/// batches on either backend sharing the device, and a backend built afresh once both are
/// dropped. (On an H100 with driver 580 nothing does: the fault lasts as long as the process;
/// resetting the primary context and loading the kernel again failed too.)
fn fault(
    backend: std::sync::Arc<dyn gpu_engine::BatchBackend>,
    config: &GpuConfig,
    cubin: Option<&str>,
    key: &GpuKey,
) {
    let short = Duration::from_millis(300);
    let batch = |b: &dyn gpu_engine::BatchBackend, when: &str| match bench_batch(b, key, 256, short)
    {
        Ok(r) => println!("{when}: batch of 256 ok ({:.0} signs/s)", r.signs_per_sec),
        Err(e) => println!("{when}: batch failed: {e}"),
    };
    batch(&*backend, "before the fault");
    let cuda = gpu_engine::cuda::CudaBackend::with_module(config, module(config, cubin))
        .expect("a second backend on the same device");
    let t = Instant::now();
    println!("fault injected: {:?}", cuda.inject_illegal_address());
    batch(&*backend, "after the fault, the other backend");
    batch(&cuda, "after the fault, the faulting backend");
    drop(cuda);
    drop(backend);
    match gpu_engine::cuda::CudaBackend::with_module(config, module(config, cubin)) {
        Ok(fresh) => batch(&fresh, "backend built afresh"),
        Err(e) => println!("backend built afresh: failed: {e}"),
    }
    println!("recovery attempt took {:?}", t.elapsed());
}

/// The module to load: the prebuilt cubin, else the built-in kernel compiled by NVRTC.
fn module(config: &GpuConfig, cubin: Option<&str>) -> gpu_engine::cuda::Ptx {
    match cubin {
        Some(file) => gpu_engine::cuda::Ptx::from_binary(
            std::fs::read(file).unwrap_or_else(|e| panic!("{file}: {e}")),
        ),
        None => gpu_engine::cuda::compile_kernel((9, 0), config.shape()).expect("NVRTC"),
    }
}
