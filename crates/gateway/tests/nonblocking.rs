//! Slow key engines never block anything: 200 concurrent handshakes against an engine that
//! delays every signature by 50 ms finish in well under a second, over TCP and over QUIC.
//! Its own test binary, one test, so no other test competes for the 2 CPUs while it measures.

mod common;
use common::*;
use keyengine::testing::DelayEngine;
use std::sync::Arc;
use std::time::{Duration, Instant};

const QUIC: &str = "[listeners.quic]\nenabled = true";

async fn tcp() {
    let engine: Arc<dyn keyengine::Engine> = Arc::new(DelayEngine::new(Duration::from_millis(50)));
    let fx = start_engine("", "", Some(vec![engine])).await;
    let addr = fx.addr();
    let t = Instant::now();
    let tasks: Vec<_> = (0..200)
        .map(|_| tokio::spawn(async move { tls_handshake(addr, "localhost").await }))
        .collect();
    for task in tasks {
        task.await.unwrap().expect("handshake");
    }
    let took = t.elapsed();
    // Serialised, 200 x 50 ms would be 10 s.
    assert!(
        took < Duration::from_millis(900),
        "200 handshakes with a 50 ms engine took {took:?}"
    );
    let m = fx.gw().metrics.render();
    assert_eq!(
        metric_sum(
            &m,
            "rampart_keyengine_operations_total",
            &["engine=\"delay\"", "result=\"ok\""]
        ),
        200.0
    );
}

async fn quic() {
    use std::sync::Arc;
    let engine: Arc<dyn keyengine::Engine> = Arc::new(keyengine::testing::DelayEngine::new(
        std::time::Duration::from_millis(50),
    ));
    let fx = start_engine("", QUIC, Some(vec![engine])).await;
    let server = fx.gw().quic_listeners[0].1;
    quic_handshake(server).await.expect("warm-up handshake");
    let t = std::time::Instant::now();
    let tasks: Vec<_> = (0..200)
        .map(|_| tokio::spawn(quic_handshake(server)))
        .collect();
    for task in tasks {
        task.await.unwrap().expect("handshake");
    }
    let took = t.elapsed();
    eprintln!("200 concurrent QUIC handshakes with a 50 ms engine: {took:?}");
    // Serialised, 200 x 50 ms would be 10 s; measured here about 0.7 s (debug build, 2 cores).
    assert!(
        took < std::time::Duration::from_millis(1000),
        "200 QUIC handshakes with a 50 ms engine took {took:?}"
    );
    let m = fx.gw().metrics.render();
    assert!(
        metric_sum(
            &m,
            "rampart_keyengine_operations_total",
            &["engine=\"delay\"", "result=\"ok\""]
        ) >= 201.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handshakes_wait_for_a_slow_engine_without_blocking() {
    tcp().await;
    quic().await;
}
