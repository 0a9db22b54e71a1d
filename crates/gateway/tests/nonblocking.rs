//! Slow key engines never block anything: 200 concurrent handshakes against an engine that
//! delays every signature by 50 ms overlap their waits, over TCP and over QUIC.
//!
//! Serialised, 200 waits of 50 ms would add 10 s. Each protocol runs the same 200 handshakes
//! twice, against a 0 ms engine and against the 50 ms one, and the test asserts that the 50 ms
//! engine added well under a second to the wall time (so at least ten waits overlapped on
//! average) and that many signatures waited at once. Comparing with a run on the same machine
//! in the same test keeps the assertion about waiting, not about how fast the machine runs
//! 200 debug-build handshakes (on a loaded 2-core CI runner, about a second by themselves).
//! Its own test binary, one test, so no other test competes for the 2 CPUs while it measures.

mod common;
use common::*;
use keyengine::testing::DelayEngine;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

const QUIC: &str = "[listeners.quic]\nenabled = true";
const HANDSHAKES: usize = 200;
const DELAY: Duration = Duration::from_millis(50);
/// The most the 50 ms engine may add to the wall time of 200 concurrent handshakes.
const ADDED_AT_MOST: Duration = Duration::from_millis(1000);
/// The fewest signatures that must have waited at once. A gateway that blocked a worker
/// thread on each signature would have at most one per worker (two here).
const PEAK_AT_LEAST: usize = 10;

struct Run {
    took: Duration,
    peak_in_flight: usize,
}

/// Starts a gateway (`listener_extra` added to its listener) whose only engine delays each
/// signature by `delay`, runs `warm_up` once, then 200 concurrent `handshake`s.
async fn run<F, Fut, T>(listener_extra: &str, delay: Duration, quic: bool, handshake: F) -> Run
where
    F: Fn(SocketAddr) -> Fut,
    Fut: Future<Output = Result<T, String>> + Send + 'static,
    T: Send + 'static,
{
    let engine = Arc::new(DelayEngine::new(delay));
    let fx = start_engine(
        "",
        listener_extra,
        Some(vec![engine.clone() as Arc<dyn keyengine::Engine>]),
    )
    .await;
    let addr = if quic {
        fx.gw().quic_listeners[0].1
    } else {
        fx.addr()
    };
    // One handshake first, so that one-time set-up (session caches, lazy statics) is
    // not in the measured run.
    handshake(addr).await.expect("warm-up handshake");
    let t = Instant::now();
    let tasks: Vec<_> = (0..HANDSHAKES)
        .map(|_| tokio::spawn(handshake(addr)))
        .collect();
    for task in tasks {
        task.await.unwrap().expect("handshake");
    }
    let took = t.elapsed();
    let m = fx.gw().metrics.render();
    assert_eq!(
        metric_sum(
            &m,
            "rampart_keyengine_operations_total",
            &["engine=\"delay\"", "result=\"ok\""]
        ),
        (HANDSHAKES + 1) as f64,
        "every handshake signed through the engine"
    );
    Run {
        took,
        peak_in_flight: engine.peak_in_flight(),
    }
}

/// Runs both engines for one protocol and asserts that the slow one's waits overlapped.
async fn check<F, Fut, T>(protocol: &str, listener_extra: &str, quic: bool, handshake: F)
where
    F: Fn(SocketAddr) -> Fut + Copy,
    Fut: Future<Output = Result<T, String>> + Send + 'static,
    T: Send + 'static,
{
    let fast = run(listener_extra, Duration::ZERO, quic, handshake).await;
    let slow = run(listener_extra, DELAY, quic, handshake).await;
    let added = slow.took.saturating_sub(fast.took);
    eprintln!(
        "{protocol}: {HANDSHAKES} concurrent handshakes took {:?} with a 0 ms engine, {:?} with a \
         50 ms engine (added {added:?}); at most {} signatures waited at once",
        fast.took, slow.took, slow.peak_in_flight
    );
    assert!(
        added < ADDED_AT_MOST,
        "{protocol}: the 50 ms engine added {added:?} to {HANDSHAKES} concurrent handshakes \
         ({:?} against {:?}); serialised it would add {:?}",
        slow.took,
        fast.took,
        DELAY * HANDSHAKES as u32
    );
    assert!(
        slow.peak_in_flight >= PEAK_AT_LEAST,
        "{protocol}: only {} signatures waited at once",
        slow.peak_in_flight
    );
}

async fn tls(addr: SocketAddr) -> Result<(), String> {
    tls_handshake(addr, "localhost").await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handshakes_wait_for_a_slow_engine_without_blocking() {
    check("TCP", "", false, tls).await;
    check("QUIC", QUIC, true, quic_handshake).await;
}
