//! The engine's batching, verification and failure handling, and the scheduler's opportunistic
//! offload, over the simulated GPU (results computed by the host build of the kernel core).

use gpu_engine::{CostModel, GpuConfig, GpuEngine, SimControl, SimulatedGpu};
use keyengine::{
    Engine, EngineMetrics, KeyEngine, KeyId, KeyKind, KeyRegistry, PrivateKey, Scheduler,
    SchedulerPolicy, SignError, SignatureAlgorithm, ThreadsEngine,
};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

mod common;
use common::{key_der, private_key, request, sign_many};

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn config() -> GpuConfig {
    GpuConfig {
        backoff_initial: ms(100),
        backoff_max: ms(1000),
        cpu_threads: 2,
        ..GpuConfig::default()
    }
}

/// A GPU engine over a simulated device with `key_der()` loaded.
fn sim_engine(launch: Duration, cfg: GpuConfig) -> (Arc<GpuEngine>, Arc<SimControl>) {
    let sim = SimulatedGpu::new(
        CostModel {
            launch,
            per_item: Duration::from_micros(5),
        },
        2,
        4096,
    );
    let control = sim.control();
    let engine = GpuEngine::with_backend(Arc::new(sim), cfg);
    let id = engine.add_key(&key_der()).unwrap();
    assert_eq!(id, private_key().id(), "same key id as the key registry");
    (Arc::new(engine), control)
}

fn metric(engine: &GpuEngine, name: &str) -> u64 {
    let text = engine.metrics_text().unwrap();
    let line = text
        .lines()
        .find(|l| l.starts_with(&format!("rampart_gpu_{name} ")))
        .unwrap_or_else(|| panic!("no {name} in\n{text}"));
    line.rsplit(' ').next().unwrap().parse::<f64>().unwrap() as u64
}

#[tokio::test]
async fn batches_follow_the_queue_and_every_signature_verifies() {
    // A 5 ms launch: a latency target that batches of a few can meet.
    let cfg = GpuConfig {
        batch_latency_target: Duration::from_secs(1),
        ..config()
    };
    let (gpu, control) = sim_engine(ms(5), cfg);
    let key = private_key();
    // One request alone is launched at once as a batch of one: no timer to fill a batch.
    let t = Instant::now();
    sign_many(&*gpu, &key, 1).await;
    assert!(t.elapsed() < ms(500), "{:?}", t.elapsed());
    assert_eq!(control.max_items.load(Ordering::SeqCst), 1);
    // A burst is taken in few batches.
    sign_many(&*gpu, &key, 120).await;
    assert_eq!(gpu.gpu_signed(), 121);
    assert_eq!(control.items.load(Ordering::SeqCst), 121);
    let batches = control.batches.load(Ordering::SeqCst);
    assert!(batches < 60, "a queue of 120 ran as {batches} batches");
    assert!(control.max_items.load(Ordering::SeqCst) > 2);
    assert_eq!(gpu.queue_depth(), 0);
    assert_eq!(gpu.cpu_reruns(), 0);
    assert_eq!(metric(&gpu, "available"), 1);
    assert_eq!(metric(&gpu, "healthy"), 1);
    assert_eq!(metric(&gpu, "signatures_total"), 121);
    assert_eq!(metric(&gpu, "batch_requests_total"), 121);
}

#[tokio::test]
async fn device_error_reruns_on_the_cpu_marks_unhealthy_and_counts() {
    let (gpu, control) = sim_engine(ms(2), config());
    gpu.set_fallback(Arc::new(ThreadsEngine::new(2, 1024)));
    let key = private_key();
    control.fail_batches.store(1, Ordering::SeqCst);
    sign_many(&*gpu, &key, 8).await;
    assert!(!gpu.healthy());
    assert_eq!(metric(&gpu, "device_errors_total"), 1);
    assert_eq!(metric(&gpu, "healthy"), 0);
    assert!(gpu.cpu_reruns() >= 1);
    assert_eq!(
        gpu.gpu_signed() + gpu.cpu_reruns(),
        8,
        "each request signed once"
    );
}

#[tokio::test]
async fn batch_past_its_deadline_is_rerun_on_the_cpu() {
    let cfg = GpuConfig {
        batch_deadline_base: ms(40),
        ..config()
    };
    let (gpu, control) = sim_engine(ms(2), cfg);
    gpu.set_fallback(Arc::new(ThreadsEngine::new(2, 1024)));
    let key = private_key();
    control.slow_batches.store(1, Ordering::SeqCst);
    sign_many(&*gpu, &key, 4).await;
    assert_eq!(metric(&gpu, "deadline_misses_total"), 1);
    assert!(!gpu.healthy());
    assert!(gpu.cpu_reruns() >= 1);
}

#[tokio::test]
async fn corrupted_gpu_result_is_never_released() {
    let (gpu, control) = sim_engine(ms(2), config());
    gpu.set_fallback(Arc::new(ThreadsEngine::new(1, 1024)));
    let key = private_key();
    control.corrupt_batches.store(1, Ordering::SeqCst);
    // sign_many verifies every signature it gets: the corrupted one must have been re-signed.
    sign_many(&*gpu, &key, 6).await;
    assert_eq!(metric(&gpu, "faults_total"), 1);
    assert!(!gpu.healthy());
    assert!(gpu.cpu_reruns() >= 1);
}

/// Waits (up to 2 s, for loaded CI machines) until a probe has run to completion.
async fn wait_metric(gpu: &GpuEngine, name: &str, value: u64) {
    for _ in 0..400 {
        if metric(gpu, name) >= value {
            break;
        }
        tokio::time::sleep(ms(5)).await;
    }
    assert_eq!(metric(gpu, name), value, "{name}");
}

#[tokio::test]
async fn unhealthy_engine_reprobes_after_backoff_and_backoff_doubles() {
    let (gpu, control) = sim_engine(ms(2), config());
    gpu.set_fallback(Arc::new(ThreadsEngine::new(1, 1024)));
    let key = private_key();
    control.fail_batches.store(1, Ordering::SeqCst);
    sign_many(&*gpu, &key, 1).await;
    assert!(!gpu.healthy());
    // Within the backoff: straight to the CPU, no probe.
    let signed = gpu.gpu_signed();
    sign_many(&*gpu, &key, 3).await;
    assert_eq!(gpu.gpu_signed(), signed);
    assert_eq!(metric(&gpu, "probes_total"), 0);
    // After the backoff, a request triggers a re-probe; the device is still broken: the probe
    // fails and the backoff doubles (200 ms).
    control.broken.store(true, Ordering::SeqCst);
    tokio::time::sleep(ms(130)).await;
    sign_many(&*gpu, &key, 1).await;
    wait_metric(&gpu, "probe_failures_total", 1).await;
    assert_eq!(metric(&gpu, "probes_total"), 1);
    assert!(!gpu.healthy());
    control.broken.store(false, Ordering::SeqCst);
    tokio::time::sleep(ms(100)).await;
    sign_many(&*gpu, &key, 1).await;
    assert_eq!(
        metric(&gpu, "probes_total"),
        1,
        "~120 ms < doubled backoff: no probe yet"
    );
    tokio::time::sleep(ms(120)).await;
    sign_many(&*gpu, &key, 1).await; // triggers the probe, which passes
    wait_metric(&gpu, "probes_total", 2).await;
    for _ in 0..400 {
        if gpu.healthy() {
            break;
        }
        tokio::time::sleep(ms(5)).await;
    }
    assert!(gpu.healthy());
    let signed = gpu.gpu_signed();
    sign_many(&*gpu, &key, 5).await;
    assert_eq!(gpu.gpu_signed(), signed + 5, "back on the GPU");
}

/// A key engine over `engines` holding `key_der()`.
fn facade(
    engines: Vec<Arc<dyn Engine>>,
    policy: &SchedulerPolicy,
    seed: &[Duration],
) -> (Arc<KeyEngine>, KeyId) {
    let mut reg = KeyRegistry::new();
    let id = reg.insert(PrivateKey::from_der("RSA PRIVATE KEY", &key_der()).unwrap());
    let sched = Scheduler::new(engines, policy).unwrap();
    for (slot, took) in seed.iter().enumerate() {
        sched.record(slot, KeyKind::Rsa, *took);
    }
    (
        KeyEngine::new(reg, sched, EngineMetrics::unregistered()),
        id,
    )
}

#[tokio::test]
async fn without_a_fallback_the_facade_reruns_failed_gpu_requests_on_the_cpu_engines() {
    let (gpu, control) = sim_engine(ms(2), config());
    let mut policy = SchedulerPolicy::default();
    policy.pins.insert(KeyKind::Rsa, "gpu".into());
    let (ke, id) = facade(
        vec![gpu.clone(), Arc::new(ThreadsEngine::new(1, 64))],
        &policy,
        &[],
    );
    control.fail_batches.store(1, Ordering::SeqCst);
    let alg = SignatureAlgorithm::RsaPssSha256;
    let sig = ke.sign(&id, alg, alg.hash().digest(b"m")).await.unwrap();
    assert!(private_key().verify_digest(alg, &alg.hash().digest(b"m"), &sig));
    // No fallback is set on the GPU engine and it signed nothing: the facade re-ran it.
    assert_eq!(gpu.gpu_signed(), 0);
    assert_eq!(gpu.cpu_reruns(), 1);
}

#[tokio::test]
async fn engine_without_a_device_is_unavailable_and_says_so() {
    let gpu = GpuEngine::new(GpuConfig::default());
    match gpu_engine::probe() {
        Err(e) => {
            assert!(!gpu.available());
            assert_eq!(gpu.unavailable_reason(), Some(e.to_string()));
            let key = private_key();
            let err = gpu
                .submit(request(&key, SignatureAlgorithm::RsaPssSha256, b"m"))
                .await
                .unwrap_err();
            assert!(matches!(err, SignError::Unavailable("gpu", _)), "{err}");
            assert_eq!(metric(&gpu, "available"), 0);
        }
        Ok(info) => assert!(
            gpu.available(),
            "device {info} found but engine unavailable"
        ),
    }
    // And the facade fails over to a CPU engine.
    let unavailable: Arc<dyn Engine> = Arc::new(GpuEngine::unavailable("no libcuda".into()));
    let mut policy = SchedulerPolicy::default();
    policy.pins.insert(KeyKind::Rsa, "gpu".into());
    let (ke, id) = facade(
        vec![unavailable, Arc::new(ThreadsEngine::new(1, 8))],
        &policy,
        &[],
    );
    let alg = SignatureAlgorithm::RsaPkcs1Sha256;
    ke.sign(&id, alg, alg.hash().digest(b"m")).await.unwrap();
}

#[tokio::test]
async fn keys_not_on_the_gpu_go_to_the_cpu() {
    let (gpu, _) = sim_engine(ms(2), config());
    gpu.set_fallback(Arc::new(ThreadsEngine::new(1, 8)));
    let other = Arc::new(
        PrivateKey::from_der("PRIVATE KEY", &keyengine::testing::generate_rsa_pkcs8()).unwrap(),
    );
    sign_many(&*gpu, &other, 2).await;
    assert_eq!(gpu.gpu_signed(), 0);
    assert_eq!(metric(&gpu, "not_on_gpu_total"), 2);
}

/// The CPU engine's real single-signature time on this machine.
fn cpu_sign_time() -> Duration {
    let key = private_key();
    let alg = SignatureAlgorithm::RsaPssSha256;
    let d = alg.hash().digest(b"warm");
    key.sign_digest(alg, &d).unwrap();
    let t = Instant::now();
    for _ in 0..5 {
        key.sign_digest(alg, &d).unwrap();
    }
    t.elapsed() / 5
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn light_load_stays_on_the_cpu_and_a_deep_queue_goes_to_the_gpu() {
    // The GPU's service time is a 20 ms launch, far above a CPU signature: the scheduler's
    // estimate keeps one-at-a-time traffic on the CPU engine.
    let launch = ms(20);
    let cfg = GpuConfig {
        batch_latency_target: Duration::from_secs(1), // a 20 ms launch is within it
        ..config()
    };
    let (gpu, control) = sim_engine(launch, cfg);
    let threads: Arc<dyn Engine> = Arc::new(ThreadsEngine::new(2, 4096));
    let (ke, id) = facade(
        vec![threads, gpu.clone()],
        &SchedulerPolicy::default(),
        &[cpu_sign_time(), launch],
    );
    let alg = SignatureAlgorithm::RsaPssSha256;
    for i in 0..30 {
        let d = alg.hash().digest(format!("light {i}").as_bytes());
        ke.sign(&id, alg, d).await.unwrap();
    }
    assert_eq!(
        control.batches.load(Ordering::SeqCst),
        0,
        "light load waited for the GPU"
    );
    assert_eq!(metric(&gpu, "requests_total"), 0);
    // A burst deeper than the CPU engine can finish within one GPU launch: the GPU takes work.
    let mut set = tokio::task::JoinSet::new();
    for i in 0..300 {
        let ke = ke.clone();
        set.spawn(async move {
            let d = alg.hash().digest(format!("burst {i}").as_bytes());
            ke.sign(&id, alg, d).await
        });
    }
    let mut ok = 0;
    while let Some(r) = set.join_next().await {
        r.unwrap().unwrap(); // the facade verified it
        ok += 1;
    }
    assert_eq!(ok, 300);
    assert!(gpu.gpu_signed() > 0, "deep queue never reached the GPU");
    assert!(
        control.max_items.load(Ordering::SeqCst) > 1,
        "GPU work came in batches"
    );
    assert!(
        gpu.gpu_signed() < 300,
        "the CPU engine kept a share of the burst"
    );
}

/// The kernel builds on a thread of its own: until it is loaded the engine is `Starting`,
/// unavailable to the scheduler (requests answered `Unavailable`, so the facade fails over);
/// then it signs. A build that fails leaves the engine unavailable with the build's error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_kernel_builds_in_the_background_and_the_engine_joins_when_it_is_loaded() {
    use gpu_engine::{GpuError, GpuStatus};
    let (release, wait) = std::sync::mpsc::channel::<()>();
    let engine = GpuEngine::starting(config(), move || {
        wait.recv().unwrap(); // the "compile" ends when the test says so
        let sim = SimulatedGpu::new(
            CostModel {
                launch: ms(1),
                per_item: Duration::from_micros(5),
            },
            2,
            64,
        );
        Ok(Arc::new(sim) as Arc<dyn gpu_engine::BatchBackend>)
    });
    engine.add_key(&key_der()).unwrap();
    let key = private_key();
    assert_eq!(engine.status(), GpuStatus::Starting);
    assert!(!engine.available() && !Engine::available(&engine));
    let text = engine.metrics_text().unwrap();
    assert!(
        text.contains("rampart_gpu_available 0") && text.contains("rampart_gpu_starting 1"),
        "{text}"
    );
    let early = engine
        .submit(request(&key, SignatureAlgorithm::RsaPssSha256, b"early"))
        .await;
    assert!(
        matches!(&early, Err(SignError::Unavailable(_, why)) if why.contains("starting")),
        "{early:?}"
    );
    release.send(()).unwrap();
    assert_eq!(
        engine.wait_started(Duration::from_secs(10)),
        GpuStatus::Ready
    );
    assert!(engine.available());
    let text = engine.metrics_text().unwrap();
    assert!(
        text.contains("rampart_gpu_available 1") && text.contains("rampart_gpu_starting 0"),
        "{text}"
    );
    sign_many(&engine, &key, 8).await;
    assert_eq!(engine.gpu_signed(), 8);

    let failed = GpuEngine::starting(config(), || Err(GpuError::Compile("no good".into())));
    match failed.wait_started(Duration::from_secs(10)) {
        GpuStatus::Unavailable(why) => assert!(why.contains("no good"), "{why}"),
        other => panic!("{other:?}"),
    }
    assert!(!failed.available());
    let r = failed
        .submit(request(&key, SignatureAlgorithm::RsaPssSha256, b"late"))
        .await;
    assert!(
        matches!(&r, Err(SignError::Unavailable(_, why)) if why.contains("no good")),
        "{r:?}"
    );
}

/// The batch-size controller as the engine runs it: with a latency target no batch can meet
/// (1 µs), the metrics say so for that key size, batches still form (within twice the fastest
/// measured), and every request is signed on the device.
#[tokio::test]
async fn an_unreachable_latency_target_is_reported_and_signing_goes_on() {
    let cfg = GpuConfig {
        batch_latency_target: Duration::from_micros(1),
        ..config()
    };
    let (gpu, _control) = sim_engine(ms(1), cfg);
    let key = private_key();
    let met = "batch_latency_target_met{bits=\"2048\"}";
    assert_eq!(metric(&gpu, met), 1, "nothing measured yet");
    sign_many(&*gpu, &key, 40).await;
    assert_eq!(metric(&gpu, met), 0);
    assert_eq!(
        metric(&gpu, "batch_latency_target_met{bits=\"4096\"}"),
        1,
        "no 4096 batch yet"
    );
    assert!(metric(&gpu, "batch_limit{bits=\"2048\"}") >= 1);
    sign_many(&*gpu, &key, 20).await;
    assert_eq!(gpu.gpu_signed(), 60);
    assert_eq!(gpu.cpu_reruns(), 0);
}

/// The engine over a simulated device that computes with the FP64 kernel (one thread per CRT
/// half, emulated; the group shapes are slow to emulate): every signature verifies and none
/// goes back to the CPU.
#[tokio::test]
async fn the_fp64_kernel_signs_through_the_engine() {
    let shape = GpuConfig {
        threads_per_request: 2,
        fp64: true,
        ..GpuConfig::default()
    }
    .shape();
    assert!(shape.fp64 && !shape.table_shared);
    let sim = SimulatedGpu::new(
        CostModel {
            launch: ms(1),
            per_item: Duration::from_micros(5),
        },
        2,
        4096,
    )
    .with_kernel(shape);
    let control = sim.control();
    let engine = GpuEngine::with_backend(Arc::new(sim), config());
    engine.add_key(&key_der()).unwrap();
    let key = private_key();
    sign_many(&engine, &key, 16).await;
    assert_eq!(engine.gpu_signed(), 16);
    assert_eq!(engine.cpu_reruns(), 0);
    assert_eq!(control.items.load(Ordering::SeqCst), 16);
}
