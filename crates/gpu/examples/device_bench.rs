//! On a machine with a CUDA device: checks the kernel against the CPU build of the core, then
//! measures signs/s and batch latency against batch size, the CPU engine's single-signature
//! time, and the crossover batch size. Without a device it prints why and exits 0.
//!
//! ```text
//! cargo run --release -p gpu-engine --example device_bench -- [bits] [seconds-per-size]
//!     [--sizes 1,16,256] [--block 128] [--window 5] [--streams 2] [--split 1|2|8|16|32]
//!     [--table-shared | --table-local] [--carry-chains | --no-carry-chains]
//!     [--fp64 (with --split 2, 8, 16, 32)] [--kernel-dir DIR | --cubin FILE]
//! device_bench cpu-side [BITS [THREADS]]   # the CPU's share of a GPU signature (needs no
//!                                           # device), on THREADS threads at once
//! device_bench BITS fault [--cubin FILE] [--split S ...]   # a real device fault, and after
//! device_bench engine-fault [--split S ...]   # the engine over a worker process whose device
//!                                             # faults: CPU re-runs, a new worker, back on the GPU
//! device_bench --emit-ptx FILE [--kernel-dir DIR] [--window W] [--split S]   # needs NVRTC only
//!     [--define NAME=VALUE]...   # a kernel option the engine does not set
//! ```
//! `--kernel-dir` compiles `DIR/rsa_core.h` + `rsa_group.h` + `rsa_fp64.h` + `rsa_kernel.cu` instead of the built-in text:
//! a changed kernel measured without rebuilding (the self-check still compares it with the CPU
//! build of the built-in core). `--cubin` loads a module built elsewhere for this device (NVRTC
//! and ptxas on the build machine), so the device spends no time compiling; it must have been
//! built for the `--split` given.
//! Without `--sizes`: 1, 4, 16, … 65,536.

/// The gateway's allocator (crates/rampart), so the CPU side is measured as the engine runs it.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

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
    // This program as the engine's worker process (`engine-fault` starts it so).
    if std::env::args().nth(1).as_deref() == Some("gpu-worker") {
        let args: Vec<String> = std::env::args().skip(2).collect();
        std::process::exit(gpu_engine::process::worker::run(&args));
    }
    let mut positional = Vec::new();
    let mut config = GpuConfig::default();
    let mut sizes: Option<Vec<usize>> = None;
    let mut kernel_dir: Option<String> = None;
    let mut cubin: Option<String> = None;
    let mut emit_ptx: Option<String> = None;
    let mut defines = String::new();
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
            // The engine's defaults are a shared table and carry chains: the negative flags
            // measure the other shapes.
            "--table-shared" => config.table_shared = true,
            "--table-local" => config.table_shared = false,
            "--carry-chains" => config.carry_chains = true,
            "--no-carry-chains" => config.carry_chains = false,
            "--fp64" => config.fp64 = true,
            "--kernel-dir" => kernel_dir = Some(value("--kernel-dir")),
            "--cubin" => cubin = Some(value("--cubin")),
            "--emit-ptx" => emit_ptx = Some(value("--emit-ptx")),
            "--define" => {
                let d = value("--define");
                let (name, val) = d.split_once('=').expect("--define NAME=VALUE");
                defines += &format!("#define {name} {val}\n");
            }
            _ => positional.push(a),
        }
    }
    let read_dir = |dir: &str| {
        let read = |f: &str| {
            std::fs::read_to_string(format!("{dir}/{f}")).unwrap_or_else(|e| panic!("{f}: {e}"))
        };
        read("rsa_core.h") + &read("rsa_group.h") + &read("rsa_fp64.h") + &read("rsa_kernel.cu")
    };
    if positional.first().map(String::as_str) == Some("cpu-side") {
        // The CPU's share of a GPU signature (no device needed).
        // `cpu-side BITS` for one size (the CPU build computing the outputs of the larger
        // ones, untimed, takes most of a minute).
        // `cpu-side BITS THREADS`: that many threads at once (CPU time per signature).
        let only: Option<u32> = positional.get(1).map(|b| b.parse().expect("bits"));
        let threads: usize = positional.get(2).map_or(1, |t| t.parse().expect("threads"));
        for bits in [2048u32, 3072, 4096]
            .into_iter()
            .filter(|b| only.is_none_or(|o| o == *b))
        {
            let key = rsa_key(bits);
            let alg = keyengine::SignatureAlgorithm::RsaPssSha256;
            let (prepare, finish) = gpu_engine::bench_cpu_side(&key, alg, 2000, threads);
            let on = if threads > 1 {
                format!(" (CPU time, {threads} threads at once)")
            } else {
                String::new()
            };
            println!("RSA-{bits}: prepare (PSS, blinding) {prepare:?}, finish (unblinding, verification) {finish:?}{on}");
        }
        return;
    }
    if let Some(file) = emit_ptx {
        // For sm_90 (H100, H200); ptxas turns it into a cubin for `--cubin`.
        let source = defines.clone()
            + &kernel_dir
                .as_deref()
                .map_or_else(gpu_engine::cuda::kernel_source, read_dir);
        let ptx =
            gpu_engine::cuda::compile_kernel_source(source, (9, 0), config.shape()).expect("NVRTC");
        std::fs::write(&file, ptx.to_src()).expect("write PTX");
        return;
    }
    if positional.first().map(String::as_str) == Some("engine-fault") {
        engine_fault(config);
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

/// The engine over a worker process (this program as `gpu-worker`) whose device faults on its
/// fifth batch (an illegal address): rounds of 2,048 RSA-2048 requests, each round's GPU
/// signatures, CPU re-runs, health and workers started, until the engine is back on the GPU
/// for two rounds (at most 40 rounds).
fn engine_fault(mut config: GpuConfig) {
    use gpu_engine::process::{ProcessBackend, WorkerCommand};
    use keyengine::{Engine, PrivateKey, SignRequest, SignatureAlgorithm, ThreadsEngine};
    let cache = std::env::temp_dir().join(format!("rampart-engine-fault-{}", std::process::id()));
    config.kernel_cache = Some(cache.clone());
    config.backoff_initial = Duration::from_millis(200);
    let command = WorkerCommand {
        program: std::env::current_exe().expect("own path"),
        args: vec!["gpu-worker".into()],
    };
    let t = Instant::now();
    let backend = match ProcessBackend::start_with_fault(command, &config, Some(5)) {
        Ok(b) => std::sync::Arc::new(b),
        Err(e) => {
            println!("gpu engine unavailable: {e}");
            return;
        }
    };
    println!(
        "worker ready after {:?}: {}",
        t.elapsed(),
        gpu_engine::BatchBackend::describe(&*backend)
    );
    let der = boring::rsa::Rsa::generate(2048)
        .unwrap()
        .private_key_to_der()
        .unwrap();
    let key = std::sync::Arc::new(PrivateKey::from_der("RSA PRIVATE KEY", &der).unwrap());
    let engine = gpu_engine::GpuEngine::with_backend(backend.clone(), config);
    engine.add_key(&der).unwrap();
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    engine.set_fallback(std::sync::Arc::new(ThreadsEngine::new(cores, 1 << 20)));
    let rt = tokio::runtime::Runtime::new().unwrap();
    let alg = SignatureAlgorithm::RsaPssSha256;
    let mut back_rounds = 0;
    for round in 1..=40 {
        let (gpu0, cpu0) = (engine.gpu_signed(), engine.cpu_reruns());
        let t = Instant::now();
        let failed = rt.block_on(async {
            let futs: Vec<_> = (0..2048)
                .map(|i| {
                    let digest = alg.hash().digest(format!("{round}/{i}").as_bytes());
                    engine.submit(SignRequest {
                        key: key.id(),
                        kind: key.kind(),
                        private: Some(key.clone()),
                        algorithm: alg,
                        digest,
                    })
                })
                .collect();
            let mut failed = 0;
            for f in futs {
                if f.await.is_err() {
                    failed += 1;
                }
            }
            failed
        });
        println!(
            "round {round:>2}: {:>7.1?}  gpu {:>5}  cpu re-runs {:>5}  failed {failed}  healthy {}  workers started {}",
            t.elapsed(),
            engine.gpu_signed() - gpu0,
            engine.cpu_reruns() - cpu0,
            engine.healthy(),
            backend.workers_started()
        );
        if backend.workers_started() > 1 && engine.gpu_signed() - gpu0 == 2048 {
            back_rounds += 1;
            if back_rounds == 2 {
                break;
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let _ = std::fs::remove_dir_all(cache);
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
