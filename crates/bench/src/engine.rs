//! `rampart bench engine`: in-process signing throughput and latency of each key engine, per
//! algorithm and concurrency, beside the best single-operation implementations (the `inline`
//! engine's aws-lc, and BoringSSL) in the same run.
//!
//! Each cell drives one engine through the [`KeyEngine`] facade (as the gateway does, so RSA
//! results of engines that do not verify their own are verified here too) with `concurrency`
//! tasks, for `--duration`, from `--threads` current-thread runtimes (1 by default), each with
//! its share of the tasks, as the gateway's workers submit. Run the CPU engines pinned to one
//! core (`taskset -c 1`): signs per CPU-second is then signs per core-second. An engine that
//! signs off the CPU at hundreds of thousands a second needs several submitting threads; the
//! `replay` engine (no signing) gives the ceiling of the harness and the reply path.

use crate::BenchArgs;
use anyhow::{bail, Context as _};
use boring::hash::MessageDigest;
use boring::pkey::PKey;
use boring::sign::Signer;
use keyengine::testing::{generate_ecdsa_p256_pkcs8, generate_rsa_pkcs8};
use keyengine::{
    BatchConfig, BatchEngine, Engine, EngineMetrics, InlineEngine, KernelBackend, KeyEngine,
    KeyRegistry, PrivateKey, Scheduler, SchedulerPolicy, SignError, SignatureAlgorithm,
    ThreadsEngine,
};
use serde::Serialize;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// One measured cell.
#[derive(Debug, Serialize)]
pub struct EngineRun {
    pub engine: String,
    pub algorithm: &'static str,
    pub concurrency: usize,
    pub operations: u64,
    pub signs_per_sec: f64,
    pub signs_per_cpu_sec: f64,
    pub p50_us: f64,
    pub p99_us: f64,
    pub max_us: f64,
    /// Requests the engine refused as overloaded (each retried after [`SHED_BACKOFF`]): a
    /// cell past what the engine queues says so instead of ending the run.
    #[serde(skip_serializing_if = "is_zero")]
    pub shed: u64,
    /// CPU µs per signature by thread group (the thread name without its number;
    /// `bench-submit` = the submitting threads): where an engine's CPU goes.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub cpu_us_by_thread: BTreeMap<String, f64>,
    /// Set when the engine could not run here (e.g. no AVX-512 IFMA, no GPU).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unavailable: Option<String>,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// How long a task waits after its request was shed before it asks again, as a client told
/// to back off would.
const SHED_BACKOFF: Duration = Duration::from_millis(1);

/// This process's user + system CPU seconds (all threads).
fn cpu_seconds() -> f64 {
    crate::cpu::process_cpu_seconds(std::process::id()).unwrap_or(0.0)
}

/// The digest every cell signs.
fn bench_digest(algorithm: SignatureAlgorithm) -> Vec<u8> {
    algorithm.hash().digest(b"rampart bench engine")
}

fn make_engine(
    name: &str,
    der: &[u8],
    algorithm: SignatureAlgorithm,
) -> Result<Arc<dyn Engine>, String> {
    let batch = |backend: KernelBackend| -> Result<Arc<dyn Engine>, String> {
        BatchEngine::new(BatchConfig {
            backend,
            ..BatchConfig::default()
        })
        .map(|e| Arc::new(e) as Arc<dyn Engine>)
        .map_err(|e| e.to_string())
    };
    match name {
        "inline" => Ok(Arc::new(InlineEngine)),
        "threads" => Ok(Arc::new(ThreadsEngine::new(1, 65536))),
        "replay" => {
            let key = PrivateKey::from_der("PRIVATE KEY", der).map_err(|e| e.to_string())?;
            crate::replay::ReplayEngine::new(&key, algorithm, &bench_digest(algorithm))
                .map(|e| Arc::new(e) as Arc<dyn Engine>)
                .map_err(|e| e.to_string())
        }
        "batch" => batch(KernelBackend::best()),
        gpu if gpu == "gpu" || gpu.starts_with("gpu:") => {
            let config = gpu_config(gpu.strip_prefix("gpu:").unwrap_or(""))?;
            let gpu = gpu_engine::GpuEngine::new(config);
            // The kernel is built on the engine's own thread: wait for it (tens of seconds).
            if let gpu_engine::GpuStatus::Starting | gpu_engine::GpuStatus::Unavailable(_) =
                gpu.wait_started(Duration::from_secs(300))
            {
                return Err(gpu.unavailable_reason().unwrap_or_default());
            }
            // The GPU signs RSA only; in the gateway other keys go to the CPU engines beside it.
            gpu.add_key(der)
                .map_err(|e| format!("the gpu engine signs RSA keys only ({e})"))?;
            Ok(Arc::new(gpu))
        }
        other => match other.strip_prefix("batch:").and_then(KernelBackend::from_name) {
            Some(b) if b.available() => batch(b),
            Some(b) => Err(format!("kernel {b} needs AVX-512 IFMA, absent on this CPU")),
            None => Err(format!(
                "unknown engine {other:?}: inline, threads, batch, batch:ifma512, batch:ifma256, batch:portable, gpu, gpu:SHAPE, boringssl, replay"
            )),
        },
    }
}

/// The gpu engine's settings for `gpu:SHAPE`: threads per request, then `sh` (window table in
/// shared memory), `cc` (carry chains), `f` (FP64 arithmetic), `wN` (window width), `sN` (N
/// CUDA streams, batches in flight at once), `bN` (N threads per block)
/// and `p` (the device's work in a `rampart gpu-worker` process, as the gateway runs it) in any
/// order, e.g. `16shccb64`; empty for the defaults. Settings not named keep the defaults'
/// values, except `sh` and `cc`, which are off unless named.
fn gpu_config(shape: &str) -> Result<gpu_engine::GpuConfig, String> {
    let mut config = gpu_engine::GpuConfig::default();
    if shape.is_empty() {
        return Ok(config);
    }
    config.table_shared = false;
    config.carry_chains = false;
    /// A number at the start of `s`, and what follows it.
    fn number(s: &str) -> (Option<u32>, &str) {
        let digits = s.len() - s.trim_start_matches(|c: char| c.is_ascii_digit()).len();
        (s[..digits].parse().ok(), &s[digits..])
    }
    let (threads, mut rest) = number(shape);
    config.threads_per_request = threads.ok_or_else(|| {
        format!("gpu:{shape}: expected threads per request first, as in gpu:32sh")
    })?;
    while !rest.is_empty() {
        if let Some(r) = rest.strip_prefix("sh") {
            config.table_shared = true;
            rest = r;
        } else if let Some(r) = rest.strip_prefix("cc") {
            config.carry_chains = true;
            rest = r;
        } else if let Some(r) = rest
            .strip_prefix('s')
            .filter(|r| r.starts_with(|c: char| c.is_ascii_digit()))
        {
            let (streams, r) = number(r);
            config.streams = streams
                .filter(|&n| n > 0)
                .ok_or_else(|| format!("gpu:{shape}: s needs 1 or more streams, as in s3"))?
                as usize;
            rest = r;
        } else if let Some(r) = rest.strip_prefix('f') {
            config.fp64 = true;
            rest = r;
        } else if let Some(r) = rest.strip_prefix('w') {
            let (window, r) = number(r);
            config.window =
                window.ok_or_else(|| format!("gpu:{shape}: w needs a window width, as in w4"))?;
            rest = r;
        } else if let Some(r) = rest.strip_prefix('p') {
            config.worker = Some(gpu_engine::process::WorkerCommand {
                program: "/proc/self/exe".into(),
                args: vec!["gpu-worker".into()],
            });
            rest = r;
        } else if let Some(r) = rest.strip_prefix('b') {
            let (block, r) = number(r);
            config.threads_per_block = block
                .ok_or_else(|| format!("gpu:{shape}: b needs threads per block, as in b64"))?;
            rest = r;
        } else {
            return Err(format!(
                "gpu:{shape}: unknown {rest:?} (sh, cc, f, wN, sN, bN, p)"
            ));
        }
    }
    config
        .shape()
        .check(config.threads_per_block)
        .map_err(|e| format!("gpu:{shape}: {e}"))?;
    Ok(config)
}

fn percentile(sorted: &[u32], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i] as f64
}

/// Drives `engine` at `concurrency` for `duration` (and at most `max_ops`) from `threads`
/// submitting threads.
fn run_cell(
    engine: Arc<dyn Engine>,
    der: &[u8],
    algorithm: SignatureAlgorithm,
    load: Load,
) -> anyhow::Result<Cell> {
    let mut reg = KeyRegistry::new();
    let id = reg.insert(PrivateKey::from_der("PRIVATE KEY", der)?);
    let facade = KeyEngine::new(
        reg,
        Scheduler::new(vec![engine], &SchedulerPolicy::default())?,
        EngineMetrics::unregistered(),
    );
    let digest = bench_digest(algorithm);
    let threads = load.threads.clamp(1, load.concurrency);
    let cpu0 = cpu_seconds();
    let threads0 = crate::cpu::thread_groups_cpu();
    let start = Instant::now();
    let deadline = start + load.duration;
    let per_task = load.max_ops.div_ceil(load.concurrency as u64).max(1);
    let mut submit_cpu = 0.0;
    let all = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                // Thread t's share of the tasks: they differ by one at most.
                let tasks =
                    load.concurrency / threads + usize::from(t < load.concurrency % threads);
                let (facade, digest) = (&facade, &digest);
                std::thread::Builder::new()
                    .name(format!("bench-submit-{t}"))
                    .spawn_scoped(s, move || {
                        let lat = submit_from_thread(
                            facade, id, algorithm, digest, tasks, per_task, deadline,
                        );
                        (lat, crate::cpu::this_thread_cpu_seconds())
                    })
            })
            .collect::<Result<_, _>>()?;
        let mut all = Submitted::default();
        for h in handles {
            let (done, cpu) = h
                .join()
                .map_err(|_| anyhow::anyhow!("a submitting thread panicked"))?;
            all.add(done?);
            submit_cpu += cpu;
        }
        anyhow::Ok(all)
    })?;
    let Submitted {
        latencies: lat,
        shed,
    } = all;
    let wall = start.elapsed().as_secs_f64();
    let cpu = cpu_seconds() - cpu0;
    let n = lat.len().max(1) as f64;
    // The submitting threads have ended: they measured themselves.
    let mut by_thread: BTreeMap<String, f64> = crate::cpu::thread_groups_cpu()
        .into_iter()
        .map(|(g, t)| {
            let used = t - threads0.get(&g).copied().unwrap_or(0.0);
            (g, used * 1e6 / n)
        })
        .filter(|(_, us)| *us >= 0.05)
        .collect();
    by_thread.insert("bench-submit".into(), submit_cpu * 1e6 / n);
    Ok(Cell {
        wall,
        cpu,
        latencies: lat,
        shed,
        cpu_us_by_thread: by_thread,
    })
}

/// What one cell measured.
struct Cell {
    wall: f64,
    /// The process's CPU seconds over the cell.
    cpu: f64,
    /// Each signature's latency, µs.
    latencies: Vec<u32>,
    /// Requests refused as overloaded.
    shed: u64,
    cpu_us_by_thread: BTreeMap<String, f64>,
}

/// One cell's load: tasks, submitting threads, and when it stops.
#[derive(Clone, Copy)]
struct Load {
    concurrency: usize,
    threads: usize,
    duration: Duration,
    max_ops: u64,
}

/// What one submitting thread's tasks did.
#[derive(Default)]
struct Submitted {
    /// Each signature's latency, µs.
    latencies: Vec<u32>,
    /// Requests refused as overloaded.
    shed: u64,
}

impl Submitted {
    /// Takes in what other tasks or threads did.
    fn add(&mut self, other: Submitted) {
        self.latencies.extend(other.latencies);
        self.shed += other.shed;
    }
}

/// One submitting thread: a current-thread runtime running `tasks` tasks, each signing in turn
/// until `deadline` or `per_task` signatures (a shed request retried after [`SHED_BACKOFF`]).
/// Any other failure ends the cell.
fn submit_from_thread(
    facade: &Arc<KeyEngine>,
    id: keyengine::KeyId,
    algorithm: SignatureAlgorithm,
    digest: &[u8],
    tasks: usize,
    per_task: u64,
    deadline: Instant,
) -> anyhow::Result<Submitted> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async {
        let mut handles = Vec::with_capacity(tasks);
        for _ in 0..tasks {
            let facade = facade.clone();
            let digest = digest.to_vec();
            handles.push(tokio::spawn(async move {
                let mut done = Submitted::default();
                while Instant::now() < deadline && (done.latencies.len() as u64) < per_task {
                    let t = Instant::now();
                    match facade.sign(&id, algorithm, digest.clone()).await {
                        Ok(_) => done
                            .latencies
                            .push(t.elapsed().as_micros().min(u32::MAX as u128) as u32),
                        Err(SignError::Overloaded(_)) => {
                            done.shed += 1;
                            tokio::time::sleep(SHED_BACKOFF).await;
                        }
                        Err(e) => return Err(e.into()),
                    }
                }
                anyhow::Ok(done)
            }));
        }
        let mut all = Submitted::default();
        for h in handles {
            all.add(h.await??);
        }
        anyhow::Ok(all)
    })
}

fn boringssl_rate(
    key: &PKey<boring::pkey::Private>,
    duration: Duration,
) -> anyhow::Result<(u64, f64, f64)> {
    let cpu0 = cpu_seconds();
    let start = Instant::now();
    let mut n = 0u64;
    while start.elapsed() < duration {
        let mut s = Signer::new(MessageDigest::sha256(), key)?;
        s.update(b"rampart bench engine")?;
        s.sign_to_vec()?;
        n += 1;
    }
    Ok((n, start.elapsed().as_secs_f64(), cpu_seconds() - cpu0))
}

pub fn run(args: &BenchArgs) -> anyhow::Result<Vec<EngineRun>> {
    let engines: Vec<String> = args
        .engines
        .split(',')
        .map(|s| s.trim().to_string())
        .collect();
    let levels: Vec<usize> = args
        .levels
        .split(',')
        .map(|s| {
            s.trim()
                .parse::<usize>()
                .context("--levels: comma-separated numbers")
        })
        .collect::<Result<_, _>>()?;
    if levels.contains(&0) {
        bail!("--levels: concurrency must be at least 1");
    }
    let rsa_der = generate_rsa_pkcs8();
    let ec_der = generate_ecdsa_p256_pkcs8();
    let keys = [
        (
            "rsa2048",
            SignatureAlgorithm::RsaPkcs1Sha256,
            rsa_der.clone(),
            PKey::private_key_from_der(&rsa_der)?,
        ),
        (
            "ecdsa_p256",
            SignatureAlgorithm::EcdsaP256Sha256,
            ec_der.clone(),
            PKey::private_key_from_der(&ec_der)?,
        ),
    ];
    let max_ops = args.requests.unwrap_or(u64::MAX);
    let mut out = Vec::new();
    for (alg_name, alg, key, boring_key) in &keys {
        for name in &engines {
            if name == "boringssl" {
                let (n, wall, cpu) = boringssl_rate(boring_key, args.duration)?;
                let r = EngineRun {
                    engine: "boringssl".into(),
                    algorithm: alg_name,
                    concurrency: 1,
                    operations: n,
                    signs_per_sec: n as f64 / wall,
                    signs_per_cpu_sec: n as f64 / cpu.max(1e-9),
                    p50_us: wall * 1e6 / n.max(1) as f64,
                    p99_us: 0.0,
                    max_us: 0.0,
                    shed: 0,
                    cpu_us_by_thread: BTreeMap::new(),
                    unavailable: None,
                };
                report(args, &r)?;
                out.push(r);
                continue;
            }
            for &c in &levels {
                let r = match make_engine(name, key, *alg) {
                    Err(reason) => EngineRun {
                        engine: name.clone(),
                        algorithm: alg_name,
                        concurrency: c,
                        operations: 0,
                        signs_per_sec: 0.0,
                        signs_per_cpu_sec: 0.0,
                        p50_us: 0.0,
                        p99_us: 0.0,
                        max_us: 0.0,
                        shed: 0,
                        cpu_us_by_thread: BTreeMap::new(),
                        unavailable: Some(reason),
                    },
                    Ok(engine) => {
                        let load = Load {
                            concurrency: c,
                            threads: args.threads,
                            duration: args.duration,
                            max_ops,
                        };
                        let cell = run_cell(engine, key, *alg, load)?;
                        let (n, wall, cpu, mut lat) = (
                            cell.latencies.len() as u64,
                            cell.wall,
                            cell.cpu,
                            cell.latencies,
                        );
                        lat.sort_unstable();
                        EngineRun {
                            engine: name.clone(),
                            algorithm: alg_name,
                            concurrency: c,
                            operations: n,
                            signs_per_sec: n as f64 / wall,
                            signs_per_cpu_sec: n as f64 / cpu.max(1e-9),
                            p50_us: percentile(&lat, 0.5),
                            p99_us: percentile(&lat, 0.99),
                            max_us: lat.last().copied().unwrap_or(0) as f64,
                            shed: cell.shed,
                            cpu_us_by_thread: cell.cpu_us_by_thread,
                            unavailable: None,
                        }
                    }
                };
                report(args, &r)?;
                out.push(r);
            }
        }
    }
    Ok(out)
}

fn report(args: &BenchArgs, r: &EngineRun) -> anyhow::Result<()> {
    if args.json {
        println!("{}", serde_json::to_string(r)?);
    } else if let Some(why) = &r.unavailable {
        println!(
            "{:<16} {:<11} c={:<4} unavailable: {why}",
            r.engine, r.algorithm, r.concurrency
        );
    } else {
        println!(
            "{:<16} {:<11} c={:<4} {:>9.0} signs/s {:>9.0} signs/cpu-s  p50 {:>7.0} us  p99 {:>7.0} us  max {:>7.0} us",
            r.engine, r.algorithm, r.concurrency, r.signs_per_sec, r.signs_per_cpu_sec, r.p50_us, r.p99_us, r.max_us
        );
        if r.shed > 0 {
            println!(
                "    shed (refused as overloaded, retried after {} ms): {}",
                SHED_BACKOFF.as_millis(),
                r.shed
            );
        }
        if !r.cpu_us_by_thread.is_empty() {
            let mut groups: Vec<_> = r.cpu_us_by_thread.iter().collect();
            groups.sort_by(|a, b| b.1.total_cmp(a.1));
            let parts: Vec<String> = groups
                .iter()
                .map(|(g, us)| format!("{g} {us:.2}"))
                .collect();
            println!("    cpu us/sign by thread: {}", parts.join(", "));
        }
    }
    Ok(())
}

/// `rampart bench ct-rsa`: the dudect timing-leak check of the RSA-2048 kernel.
pub fn ct_rsa(args: &BenchArgs) -> anyhow::Result<()> {
    let backend = match args.engines.strip_prefix("batch:") {
        Some(name) => KernelBackend::from_name(name).context("--engines batch:KERNEL")?,
        None => KernelBackend::best(),
    };
    if !backend.available() {
        bail!("kernel {backend} needs AVX-512 IFMA, absent on this CPU");
    }
    let n = args.requests.unwrap_or(4000) as usize;
    let key = mbcrypto::rsa::RsaKey::from_der(&generate_rsa_pkcs8())?;
    let started = Instant::now();
    let r = mbcrypto::rsa::dudect(backend, &key, n, 0x5eed);
    let verdict = if r.max_abs_t() < 4.5 {
        "no leak detected"
    } else {
        "LEAK SUSPECTED"
    };
    if args.json {
        println!(
            "{}",
            serde_json::json!({
                "kernel": backend.as_str(), "measurements": n, "fixed": r.fixed, "random": r.random,
                "mean_ns_fixed": r.mean_ns[0], "mean_ns_random": r.mean_ns[1],
                "t": r.t.iter().map(|(p, t)| serde_json::json!({"crop": p, "t": t})).collect::<Vec<_>>(),
                "max_abs_t": r.max_abs_t(), "verdict": verdict,
            })
        );
    } else {
        println!(
            "kernel {backend}: {} fixed-exponent and {} random-exponent passes in {:.1}s",
            r.fixed,
            r.random,
            started.elapsed().as_secs_f64()
        );
        println!(
            "mean pass: fixed {:.0} ns, random {:.0} ns",
            r.mean_ns[0], r.mean_ns[1]
        );
        for (p, t) in &r.t {
            println!("  crop {:>4.0}%: t = {t:+.2}", p * 100.0);
        }
        println!("max |t| = {:.2} (threshold 4.5): {verdict}", r.max_abs_t());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{gpu_config, make_engine, run_cell, Load};
    use keyengine::testing::generate_rsa_pkcs8;
    use keyengine::{KeyKind, PrivateKey, SignRequest, SignatureAlgorithm};
    use std::time::Duration;

    /// A cell's load bounded by its count (the time bound far off).
    fn counted(concurrency: usize, threads: usize, max_ops: u64) -> Load {
        Load {
            concurrency,
            threads,
            duration: Duration::from_secs(60),
            max_ops,
        }
    }

    #[test]
    fn a_cell_splits_its_tasks_over_the_submitting_threads() {
        let der = generate_rsa_pkcs8();
        let alg = SignatureAlgorithm::RsaPssSha256;
        let engine = make_engine("replay", &der, alg).unwrap();
        let load = counted(8, 3, 800);
        // 8 tasks over 3 threads (3, 3, 2), 100 signatures each; every one answered.
        let cell = run_cell(engine, &der, alg, load).unwrap();
        assert_eq!(cell.latencies.len(), 800);
        // The submitting threads and the replay thread did the work, and say so.
        let by = &cell.cpu_us_by_thread;
        assert!(by.get("bench-submit").is_some_and(|us| *us > 0.0), "{by:?}");
    }

    #[test]
    fn a_shed_request_is_counted_and_asked_again_not_the_end_of_the_run() {
        let der = generate_rsa_pkcs8();
        let alg = SignatureAlgorithm::RsaPssSha256;
        // One signing thread and room for one request: 8 tasks at once must be shed.
        let engine = std::sync::Arc::new(keyengine::ThreadsEngine::new(1, 1));
        let cell = run_cell(engine, &der, alg, counted(8, 1, 40)).unwrap();
        assert_eq!(cell.latencies.len(), 40, "every task got its share signed");
        assert!(cell.shed > 0, "nothing was shed");
    }

    #[tokio::test]
    async fn replay_answers_its_one_digest_only() {
        let der = generate_rsa_pkcs8();
        let alg = SignatureAlgorithm::RsaPkcs1Sha256;
        let engine = make_engine("replay", &der, alg).unwrap();
        let key = PrivateKey::from_der("PRIVATE KEY", &der).unwrap();
        let request = |digest: Vec<u8>| SignRequest {
            key: key.id(),
            kind: KeyKind::Rsa,
            private: None,
            algorithm: alg,
            digest,
        };
        let digest = super::bench_digest(alg);
        let sig = engine.submit(request(digest.clone())).await.unwrap();
        assert!(key.verify_digest(alg, &digest, &sig));
        let other = alg.hash().digest(b"another message");
        assert!(engine.submit(request(other)).await.is_err());
    }

    #[test]
    fn gpu_shapes_parse_and_bad_ones_say_why() {
        let c = gpu_config("16shccb64").unwrap();
        assert_eq!(
            (
                c.threads_per_request,
                c.table_shared,
                c.carry_chains,
                c.threads_per_block
            ),
            (16, true, true, 64)
        );
        let c = gpu_config("32w4").unwrap();
        assert_eq!(
            (c.threads_per_request, c.window, c.table_shared),
            (32, 4, false)
        );
        assert_eq!(gpu_config("16shccw5").unwrap().window, 5);
        assert!(gpu_config("16w").unwrap_err().contains("window width"));
        assert!(gpu_config("16w9").unwrap_err().contains("window width 9"));
        assert!(gpu_config("16x").unwrap_err().contains("unknown"));
        assert!(gpu_config("sh")
            .unwrap_err()
            .contains("threads per request first"));
        assert!(gpu_config("16b48").unwrap_err().contains("multiple of 32"));
        assert_eq!(gpu_config("").unwrap().threads_per_request, 16);
        // Streams after `sh` (no confusion), and FP64 with its local table.
        let c = gpu_config("16shccs3").unwrap();
        assert_eq!((c.streams, c.table_shared), (3, true));
        assert!(gpu_config("16s0")
            .unwrap_err()
            .contains("1 or more streams"));
        let c = gpu_config("16shf").unwrap();
        assert!(c.fp64 && c.shape().fp64 && !c.shape().table_shared);
    }
}
