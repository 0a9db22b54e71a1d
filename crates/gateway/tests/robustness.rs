//! Bad input closes only its own connection; nothing leaks; slow key engines never block;
//! faulty signatures never leave the engine.

mod common;
use common::*;
use keyengine::testing::FaultyEngine;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

async fn curl_ok(fx: &Fixture) -> bool {
    stdout(
        &run(curl(
            fx,
            &["-o", "/dev/null", "-w", "%{http_code}", &fx.url("/")],
        ))
        .await,
    ) == "200"
}

/// Sends `bytes` and expects the server to close the connection (EOF or reset) promptly.
async fn expect_closed(fx: &Fixture, bytes: &[u8]) {
    let mut s = TcpStream::connect(fx.addr()).await.unwrap();
    s.write_all(bytes).await.unwrap();
    let _ = s.shutdown().await; // half-close: a truncated hello never completes
    let mut buf = vec![0u8; 4096];
    let closed = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => continue, // an alert may come first
            }
        }
    })
    .await;
    assert!(closed.is_ok(), "server kept a bad connection open");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_and_truncated_client_hello_close_only_that_connection() {
    let fx = start("", "").await;
    // A healthy keep-alive connection opened before the garbage must survive it.
    let bystander = tokio::spawn({
        let c = curl(
            &fx,
            &[
                "-o",
                "/dev/null",
                "-w",
                "%{http_code}",
                &fx.url("/delay/800"),
            ],
        );
        run(c)
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    expect_closed(&fx, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").await;
    expect_closed(&fx, &[0xde; 600]).await;
    // A ClientHello record header promising 512 bytes, then only 40 of them.
    let mut truncated = vec![
        0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00, 0x01, 0xfc, 0x03, 0x03,
    ];
    truncated.extend_from_slice(&[0x11; 29]);
    expect_closed(&fx, &truncated).await;
    assert_eq!(stdout(&bystander.await.unwrap()), "200");
    assert!(curl_ok(&fx).await, "the listener still serves");
    let m = fx.gw().metrics.render();
    assert!(
        metric_sum(&m, "rampart_tls_handshake_errors_total", &[]) >= 3.0,
        "{m}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_opened_and_dropped_leak_no_descriptors() {
    let fx = start("", "[listeners.tls]\nhandshake_timeout = \"2s\"").await;
    assert!(curl_ok(&fx).await);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let before = open_fds();
    let mut conns = Vec::new();
    for _ in 0..1000 {
        conns.push(TcpStream::connect(fx.addr()).await.unwrap());
    }
    // Wait until the gateway has accepted them all (each holds a descriptor on our side too).
    let m = eventually_metric(&fx, "rampart_open_connections", &[], 1000.0).await;
    let open = metric_sum(&m, "rampart_open_connections", &[]);
    assert_eq!(open, 1000.0, "exactly every idle connection was accepted");
    drop(conns);
    // A connection task closes its socket a moment before its open-connections guard drops,
    // so both are polled: the descriptors must come back and the gauge must reach zero.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let now = open_fds();
        let open = metric_sum(&fx.gw().metrics.render(), "rampart_open_connections", &[]);
        if now <= before && open == 0.0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "leaked: {before} descriptors before, {now} after; {open} connections still counted open"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(curl_ok(&fx).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn corrupted_rsa_signature_fails_the_handshake_and_is_counted() {
    let engine: Arc<dyn keyengine::Engine> = Arc::new(FaultyEngine);
    let fx = start_engine("", "", Some(vec![engine])).await;
    // Force the RSA certificate: the faulty engine corrupts RSA signatures only.
    use boring::ssl::SslSignatureAlgorithm as A;
    let r = tls_handshake_offering(fx.addr(), "localhost", Some(&[A::RSA_PSS_RSAE_SHA256])).await;
    let err = r.expect_err("a corrupted signature must never reach the client");
    // The client is told why: an internal_error alert, not a silent close.
    assert!(
        err.to_ascii_uppercase().contains("INTERNAL_ERROR"),
        "no internal_error alert: {err}"
    );
    assert_eq!(fx.gw().engine.metrics().faults_total("faulty"), 1);
    let m = fx.gw().metrics.render();
    assert_eq!(metric_sum(&m, "rampart_keyengine_faults_total", &[]), 1.0);
    // The client may read the alert before the server has counted its failure.
    eventually_metric(
        &fx,
        "rampart_tls_handshake_errors_total",
        &["reason=\"tls\""],
        1.0,
    )
    .await;
    // ECDSA handshakes through the same engine still work.
    tls_handshake_offering(fx.addr(), "localhost", Some(&[A::ECDSA_SECP256R1_SHA256]))
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_beyond_the_limit_are_shed_at_once() {
    let fx = start("", "[listeners.limits]\nmax_connections = 4").await;
    let mut held = Vec::new();
    for _ in 0..4 {
        held.push(TcpStream::connect(fx.addr()).await.unwrap());
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    while metric_sum(&fx.gw().metrics.render(), "rampart_open_connections", &[]) < 4.0 {
        assert!(Instant::now() < deadline, "connections not accepted");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // The fifth is closed without a handshake.
    let mut extra = TcpStream::connect(fx.addr()).await.unwrap();
    let mut buf = [0u8; 1];
    let r = tokio::time::timeout(Duration::from_secs(2), extra.read(&mut buf)).await;
    assert!(
        matches!(r, Ok(Ok(0)) | Ok(Err(_))),
        "shed connection is closed promptly: {r:?}"
    );
    let m = fx.gw().metrics.render();
    assert_eq!(
        metric_sum(&m, "rampart_connections_rejected_total", &[]),
        1.0
    );
    // Capacity returns when connections close.
    drop(held);
    let deadline = Instant::now() + Duration::from_secs(5);
    while metric_sum(&fx.gw().metrics.render(), "rampart_open_connections", &[]) > 0.0 {
        assert!(Instant::now() < deadline, "connections not released");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(curl_ok(&fx).await);
}
