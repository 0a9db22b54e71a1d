//! The engine over a worker process (`gpu-worker --simulated`, the same code the gateway runs as
//! `rampart gpu-worker`): batches run in the child through shared memory, and a worker that
//! dies mid-batch costs that batch a CPU re-run; the next probe starts a fresh worker and the
//! engine is back on the "device".

use gpu_engine::process::{ProcessBackend, WorkerCommand};
use gpu_engine::{BatchBackend, GpuConfig, GpuEngine};
use keyengine::{PrivateKey, ThreadsEngine};
use std::sync::Arc;
use std::time::Duration;

mod common;
use common::{key_der, sign_many};

fn worker(extra: &[&str]) -> WorkerCommand {
    WorkerCommand {
        program: env!("CARGO_BIN_EXE_gpu-worker").into(),
        args: extra.iter().map(|s| s.to_string()).collect(),
    }
}

fn config() -> GpuConfig {
    GpuConfig {
        backoff_initial: Duration::from_millis(50),
        backoff_max: Duration::from_millis(200),
        cpu_threads: 2,
        max_batch: 4096,
        ..GpuConfig::default()
    }
}

fn engine_over(backend: ProcessBackend) -> (Arc<GpuEngine>, Arc<ProcessBackend>) {
    let backend = Arc::new(backend);
    let gpu = GpuEngine::with_backend(backend.clone(), config());
    gpu.add_key(&key_der()).unwrap();
    gpu.set_fallback(Arc::new(ThreadsEngine::new(2, 1024)));
    (Arc::new(gpu), backend)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_run_in_the_worker_and_a_dead_worker_is_replaced() {
    let key = Arc::new(PrivateKey::from_der("RSA PRIVATE KEY", &key_der()).unwrap());
    // The first worker aborts in its third batch, as a process whose device faulted would die.
    let backend =
        ProcessBackend::start_with_fault(worker(&["--simulated", "200:2000"]), &config(), Some(3))
            .unwrap();
    assert!(backend.describe().contains("worker process"));
    let (gpu, backend) = engine_over(backend);
    // One request at a time: one batch each.
    for _ in 0..2 {
        sign_many(&*gpu, &key, 1).await;
    }
    assert_eq!(gpu.gpu_signed(), 2, "both batches ran in the worker");
    assert_eq!(backend.workers_started(), 1);
    // The third batch dies with its worker: re-run on the CPU, nothing lost.
    sign_many(&*gpu, &key, 16).await;
    assert!(!gpu.healthy());
    assert!(gpu.cpu_reruns() >= 1);
    assert_eq!(
        gpu.gpu_signed() + gpu.cpu_reruns(),
        18,
        "each request signed once"
    );
    // After the backoff a probe starts a new worker, and signing is back in a worker.
    let mut back = false;
    for _ in 0..200 {
        tokio::time::sleep(Duration::from_millis(20)).await;
        sign_many(&*gpu, &key, 2).await;
        if gpu.healthy() {
            back = true;
            break;
        }
    }
    assert!(back, "the engine came back after the worker died");
    assert_eq!(backend.workers_started(), 2);
    let signed = gpu.gpu_signed();
    sign_many(&*gpu, &key, 16).await;
    assert_eq!(
        gpu.gpu_signed(),
        signed + 16,
        "back on the device, in the new worker"
    );
}

#[test]
fn a_worker_that_cannot_start_says_why() {
    let err = ProcessBackend::start(worker(&["--simulated", "fast"]), &config())
        .err()
        .expect("refused");
    assert!(err.to_string().contains("did not start"), "{err}");
    let missing = WorkerCommand {
        program: "/nonexistent/rampart".into(),
        args: vec![],
    };
    let err = ProcessBackend::start(missing, &config())
        .err()
        .expect("refused");
    assert!(err.to_string().contains("/nonexistent/rampart"), "{err}");
}
