//! HTTP/3 through the gateway with an independent client (Python aioquic) to a real upstream.

mod common;
use common::*;
use std::time::Duration;

fn h3(fx: &Fixture, args: &[&str]) -> std::process::Command {
    h3_at(quic_port(fx), args)
}

fn quic_port(fx: &Fixture) -> u16 {
    fx.gw().quic_listeners[0].1.port()
}

/// The fixture's QUIC listener, on loopback.
fn quic_addr(fx: &Fixture) -> std::net::SocketAddr {
    std::net::SocketAddr::from(([127, 0, 0, 1], quic_port(fx)))
}

/// The HTTP/3 test client against a QUIC port (for when the fixture's gateway is shutting down).
fn h3_at(port: u16, args: &[&str]) -> std::process::Command {
    let mut c = std::process::Command::new("python3");
    c.arg(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/h3_client.py"))
        .args(["--port", &port.to_string()])
        .args(args);
    c
}

/// The client's connection attempt was refused at once with CONNECTION_REFUSED (0x2).
fn assert_refused(out: &std::process::Output) {
    assert!(!out.status.success(), "the connection was served");
    let why = String::from_utf8_lossy(&out.stderr);
    assert!(
        why.contains("error_code=0x2"),
        "not CONNECTION_REFUSED: {why}"
    );
}

/// A new HTTP/3 client is refused with CONNECTION_REFUSED within `within`, and the refusal
/// is counted as shed.
async fn assert_refused_at_once(fx: &Fixture, within: Duration) {
    let t0 = std::time::Instant::now();
    assert_refused(&run(h3(fx, &["--path", "/"])).await);
    assert!(
        t0.elapsed() < within,
        "refused only after {:?}",
        t0.elapsed()
    );
    let m = fx.gw().metrics.render();
    let shed = metric_sum(
        &m,
        "rampart_connections_rejected_total",
        &["listener=\"https/quic\""],
    );
    assert!(shed >= 1.0, "{m}");
}

fn json_lines(out: &std::process::Output) -> Vec<serde_json::Value> {
    assert!(
        out.status.success(),
        "h3 client failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout(out)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

const QUIC: &str = "[listeners.quic]\nenabled = true";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h3_get_and_post_through_the_gateway() {
    let fx = start("", QUIC).await;
    let r = json_lines(&run(h3(&fx, &["--path", "/headers", "--path", "/bytes/1000"])).await);
    assert_eq!(r[0]["status"], 200);
    let seen: serde_json::Value = serde_json::from_str(r[0]["body"].as_str().unwrap()).unwrap();
    assert_eq!(seen["via"], "3 rampart", "{seen}");
    assert_eq!(seen["x-forwarded-proto"], "https");
    assert_eq!(r[1]["body_len"], 1000);
    let r = json_lines(
        &run(h3(
            &fx,
            &["--method", "POST", "--path", "/echo", "--body-size", "5000"],
        ))
        .await,
    );
    assert_eq!(
        (r[0]["status"].clone(), r[0]["body_len"].clone()),
        (200.into(), 5000.into())
    );
    assert_eq!(r[0]["body_sha256"], r[0]["sent_sha256"]);
    // TCP responses advertise HTTP/3.
    let out = stdout(&run(curl(&fx, &["-D", "-", "-o", "/dev/null", &fx.url("/")])).await);
    let port = fx.gw().quic_listeners[0].1.port();
    assert!(out.contains(&format!("alt-svc: h3=\":{port}\"")), "{out}");
    let m = fx.gw().metrics.render();
    assert!(
        metric_sum(&m, "rampart_quic_connections_total", &[]) >= 2.0,
        "{m}"
    );
    assert!(
        metric_sum(
            &m,
            "rampart_tls_handshake_duration_seconds_count",
            &["protocol=\"quic\""]
        ) >= 2.0,
        "{m}"
    );
    assert!(
        m.contains("rampart_udp_receive_buffer_errors_total "),
        "{m}"
    );
    let h3_requests = metric_sum(&m, "rampart_http_requests_total", &["status=\"200\""]);
    assert!(h3_requests >= 3.0, "{m}");
    // QUIC handshakes by version and 0-RTT outcome, with their cipher suite.
    assert!(
        metric_sum(
            &m,
            "rampart_quic_handshakes_total",
            &["version=\"1\"", "resumed=\"false\""]
        ) >= 2.0,
        "{m}"
    );
    assert!(
        metric_sum(
            &m,
            "rampart_tls_handshakes_total",
            &["protocol=\"quic\"", "cipher=\"TLS_AES_"]
        ) >= 1.0,
        "{m}"
    );
    // Closed connections add their packet counts; no request stream stays counted open.
    let m = eventually_metric(&fx, "rampart_quic_packets_total", &["kind=\"sent\""], 1.0).await;
    assert_eq!(metric_sum(&m, "rampart_quic_open_streams", &[]), 0.0, "{m}");
    for kind in ["lost", "spurious_lost", "retransmitted"] {
        assert!(
            m.contains(&format!("rampart_quic_packets_total{{kind=\"{kind}\"")),
            "{kind}: {m}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h3_large_download_and_upload_stream() {
    let fx = start("", QUIC).await;
    let size = 50 * 1024 * 1024;
    let r = json_lines(&run(h3(&fx, &["--path", &format!("/bytes/{size}")])).await);
    assert_eq!(
        (r[0]["status"].clone(), r[0]["body_len"].clone()),
        (200.into(), size.into())
    );
    // Path MTU discovery (on by default) took the loopback path to the 1,452-byte ceiling.
    assert_eq!(r[0]["largest_datagram"], 1452, "{}", r[0]);
    let r = json_lines(
        &run(h3(
            &fx,
            &[
                "--method",
                "POST",
                "--path",
                "/echo",
                "--body-size",
                &(8 * 1024 * 1024).to_string(),
            ],
        ))
        .await,
    );
    assert_eq!(r[0]["body_len"], 8 * 1024 * 1024);
    // The echoed body is the one sent, byte for byte: the response is sealed straight from the
    // stream buffers, so a misplaced range would show here.
    assert_eq!(r[0]["body_sha256"], r[0]["sent_sha256"]);
    // Closed connections record the path MTU they reached.
    let m = eventually_metric(&fx, "rampart_quic_path_mtu_bytes_count", &[], 2.0).await;
    assert_eq!(
        metric_sum(&m, "rampart_quic_path_mtu_bytes_bucket", &["le=\"1350\""]),
        0.0,
        "{m}"
    );
    assert!(
        metric_sum(&m, "rampart_quic_path_mtu_bytes_bucket", &["le=\"1452\""]) >= 2.0,
        "{m}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_pmtu_discovery_packets_keep_the_fixed_size() {
    let fx = start("", &format!("{QUIC}\npmtu_discovery = false")).await;
    let r = json_lines(&run(h3(&fx, &["--path", "/bytes/300000"])).await);
    assert_eq!(r[0]["body_len"], 300000);
    assert_eq!(r[0]["largest_datagram"], 1350, "{}", r[0]);
    let fx = start("", &format!("{QUIC}\nmax_udp_payload = 1300")).await;
    let r = json_lines(&run(h3(&fx, &["--path", "/bytes/300000"])).await);
    assert_eq!(r[0]["body_len"], 300000);
    assert_eq!(r[0]["largest_datagram"], 1300, "{}", r[0]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quic_lb_connection_ids_carry_the_server_id() {
    let key = "8f95f09245765f80256934e50c66207f";
    let fx = start(
        "",
        &format!("{QUIC}\n[listeners.quic.lb]\nrotation = 1\nserver_id = \"0a0b0c\"\nnonce_len = 8\nkey = \"{key}\""),
    )
    .await;
    let r = json_lines(&run(h3(&fx, &["--print-cid", "--path", "/"])).await);
    assert_eq!(r[0]["status"], 200);
    let cid: Vec<u8> = (0..r[0]["server_cid"].as_str().unwrap().len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&r[0]["server_cid"].as_str().unwrap()[i..i + 2], 16).unwrap())
        .collect();
    // The balancer's view: decode with the shared configuration.
    let cfg = quiclb::Config {
        rotation: 1,
        server_id_len: 3,
        nonce_len: 8,
        key: Some(
            (0..16)
                .map(|i| u8::from_str_radix(&key[2 * i..2 * i + 2], 16).unwrap())
                .collect::<Vec<_>>()
                .try_into()
                .unwrap(),
        ),
        self_encode_length: true,
    };
    let decoder = quiclb::Decoder::new(vec![cfg]).unwrap();
    assert_eq!(
        cid.len(),
        20,
        "padded to the 20 bytes tokio-quiche routes by"
    );
    assert_eq!(cid[0] >> 5, 1, "config rotation bits");
    assert_eq!(decoder.server_id(&cid), Some(vec![0x0a, 0x0b, 0x0c]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_datagrams_and_unknown_versions_disturb_nothing() {
    let fx = start("", QUIC).await;
    let server = fx.gw().quic_listeners[0].1;
    let sock = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
    // Random datagrams of assorted sizes.
    let mut x = 0x9e3779b97f4a7c15u64;
    for i in 0..200 {
        let len = 1 + (i * 37) % 1400;
        let d: Vec<u8> = (0..len)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect();
        sock.send_to(&d, server).await.unwrap();
    }
    // A truncated Initial: long header, version 1, lengths that run past the datagram.
    sock.send_to(
        &[0xc3, 0, 0, 0, 1, 8, 1, 2, 3, 4, 5, 6, 7, 8, 8, 9, 9],
        server,
    )
    .await
    .unwrap();
    // An unknown version (reserved 0x?a?a?a?a): answered with Version Negotiation.
    let mut pkt = vec![0xc0, 0x1a, 0x2a, 0x3a, 0x4a, 8];
    pkt.extend_from_slice(&[0x11; 8]);
    pkt.push(8);
    pkt.extend_from_slice(&[0x22; 8]);
    pkt.resize(1200, 0);
    sock.send_to(&pkt, server).await.unwrap();
    // Random datagrams that look like long headers may get their own negotiation packets:
    // find the one answering ours (it echoes our SCID as its DCID).
    let mut buf = [0u8; 1500];
    let found = tokio::time::timeout(std::time::Duration::from_secs(3), async {
        loop {
            let (n, _) = sock.recv_from(&mut buf).await.unwrap();
            if n >= 14
                && buf[0] & 0x80 != 0
                && buf[1..5] == [0, 0, 0, 0]
                && buf[5] == 8
                && buf[6..14] == [0x22; 8]
            {
                return;
            }
        }
    })
    .await;
    assert!(
        found.is_ok(),
        "no Version Negotiation answered the unknown version"
    );
    // Everything still works.
    let r = json_lines(&run(h3(&fx, &["--path", "/"])).await);
    assert_eq!(r[0]["status"], 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zero_rtt_get_is_answered_and_post_is_not_forwarded_early() {
    let fx = start_logged(&format!("{QUIC}\nearly_data = true")).await;
    let ticket = fx.dir.path().join("ticket.pickle");
    let t = ticket.to_str().unwrap();
    // A full handshake leaves a session ticket (and waits a moment for it to arrive).
    let r = json_lines(&run(h3(&fx, &["--session-file", t, "--path", "/delay/200"])).await);
    assert_eq!(r[0]["status"], 200);
    assert!(ticket.exists(), "no session ticket was issued");
    // Resumed with 0-RTT: a GET in early data is answered and marked upstream.
    let r = json_lines(
        &run(h3(
            &fx,
            &["--session-file", t, "--zero-rtt", "--path", "/headers"],
        ))
        .await,
    );
    assert_eq!(r[0]["status"], 200);
    assert_eq!(r[0]["resumed"], true, "{:?}", r[0]);
    assert_eq!(r[0]["early_data_accepted"], true, "{:?}", r[0]);
    let seen: serde_json::Value = serde_json::from_str(r[0]["body"].as_str().unwrap()).unwrap();
    assert_eq!(seen["early-data"], "1", "forwarded from early data: {seen}");
    // A POST in early data is not forwarded: 425 Too Early.
    let r = json_lines(
        &run(h3(
            &fx,
            &[
                "--session-file",
                t,
                "--zero-rtt",
                "--method",
                "POST",
                "--path",
                "/echo",
                "--body-size",
                "10",
            ],
        ))
        .await,
    );
    assert_eq!(r[0]["status"], 425, "{:?}", r[0]);
    let m = fx.gw().metrics.render();
    assert_eq!(
        metric_sum(&m, "rampart_quic_early_data_requests_total", &[]),
        1.0
    );
    assert_eq!(
        metric_sum(&m, "rampart_quic_early_data_rejected_total", &[]),
        1.0
    );
    // The 0-RTT outcome of each handshake: none offered on the first, accepted on the two
    // resumed ones.
    assert_eq!(
        metric_sum(
            &m,
            "rampart_quic_handshakes_total",
            &["resumed=\"true\"", "early_data=\"accepted\""]
        ),
        2.0,
        "{m}"
    );
    assert_eq!(
        metric_sum(&m, "rampart_quic_handshakes_total", &["resumed=\"false\""]),
        1.0,
        "{m}"
    );
    // The access log marks h3 and early-data requests, with the connection's server name and
    // resumption (known only once the QUIC handshake reports them).
    let log = access_log(&fx, 3).await;
    let facts = |r: &serde_json::Value| {
        (
            r["protocol"].clone(),
            r["sni"].clone(),
            r["tls_resumed"].clone(),
            r["early_data"].clone(),
            r["status"].clone(),
        )
    };
    assert_eq!(
        log.iter().map(facts).collect::<Vec<_>>(),
        [
            (
                "h3".into(),
                "localhost".into(),
                false.into(),
                false.into(),
                200.into()
            ),
            (
                "h3".into(),
                "localhost".into(),
                true.into(),
                true.into(),
                200.into()
            ),
            (
                "h3".into(),
                "localhost".into(),
                true.into(),
                true.into(),
                425.into()
            ),
        ],
        "{log:?}"
    );
    assert_eq!(
        metric_sum(
            &m,
            "rampart_tls_handshake_duration_seconds_count",
            &["protocol=\"quic\"", "resumed=\"true\""]
        ),
        2.0,
        "{m}"
    );
}

/// One connection: a small request, then a 5 MB download a megabyte into which the client
/// moves to a new UDP port, closing the old one (what the server had in flight to it is lost
/// and must be sent again: quiche patch 34); the rest of the body and the next request arrive
/// at the new address.
async fn download_while_moving(fx: &Fixture) {
    let big = format!("/bytes/{}", 5 * 1024 * 1024);
    let args = ["--path", "/", "--path", &big, "--path", "/headers"];
    let moving = ["--migrate-after-bytes", "1048576", "--timeout", "60"];
    let r = json_lines(&run(h3(fx, &[&args[..], &moving[..]].concat())).await);
    assert_eq!(r.len(), 3);
    assert_ne!(
        r[0]["local_port"], r[1]["local_port"],
        "the client moved to a new port"
    );
    assert!(r[1]["migrated_at"].as_u64().unwrap() >= 1 << 20, "{}", r[1]);
    assert_eq!(
        (r[1]["status"].clone(), r[1]["body_len"].clone()),
        (200.into(), (5 * 1024 * 1024).into())
    );
    assert_eq!(r[2]["status"], 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_survives_a_client_port_change_mid_transfer() {
    let fx = start("", QUIC).await;
    download_while_moving(&fx).await;
    // Counted when the connection closes.
    eventually_metric(&fx, "rampart_quic_path_migrations_total", &[], 1.0).await;
}

/// Address validation: `always` sends every new client a Retry first (quiche and aioquic both
/// follow it); `when_busy` sends Retries only while more handshakes than the threshold are
/// pending, here pushed there by a key engine that takes 100 ms per signature.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_always_and_only_while_many_handshakes_are_pending() {
    let fx = start("", &format!("{QUIC}\nretry = \"always\"")).await;
    let server = fx.gw().quic_listeners[0].1;
    quic_handshake(server)
        .await
        .expect("quiche handshake after a Retry");
    let r = json_lines(&run(h3(&fx, &["--path", "/bytes/10"])).await);
    assert_eq!(r[0]["status"], 200);
    let m = fx.gw().metrics.render();
    // One Retry per Initial datagram without a token: a ClientHello with a post-quantum key
    // share spans two.
    let retries = metric_sum(&m, "rampart_quic_retries_total", &[]);
    assert!((2.0..=4.0).contains(&retries), "retries {retries}\n{m}");

    let engine: std::sync::Arc<dyn keyengine::Engine> = std::sync::Arc::new(
        keyengine::testing::DelayEngine::new(std::time::Duration::from_millis(100)),
    );
    let fx = start_engine(
        "",
        &format!("{QUIC}\nretry = \"when_busy\"\nretry_pending_above = 4"),
        Some(vec![engine]),
    )
    .await;
    let server = fx.gw().quic_listeners[0].1;
    quic_handshake(server).await.expect("a lone handshake");
    let m = fx.gw().metrics.render();
    assert_eq!(
        metric_sum(&m, "rampart_quic_retries_total", &[]),
        0.0,
        "{m}"
    );
    let tasks: Vec<_> = (0..40)
        .map(|_| tokio::spawn(quic_handshake(server)))
        .collect();
    for t in tasks {
        t.await.unwrap().expect("handshake in a burst");
    }
    let m = fx.gw().metrics.render();
    let retries = metric_sum(&m, "rampart_quic_retries_total", &[]);
    // The first five are accepted outright (pending 1..=5 > 4 only from the sixth on); each
    // later client gets at most one Retry per Initial datagram.
    assert!((1.0..=80.0).contains(&retries), "retries {retries}\n{m}");
    eprintln!("retries during a burst of 40: {retries}");
    // Every handshake completes, so none stays pending.
    for _ in 0..100 {
        let m = fx.gw().metrics.render();
        if metric_sum(&m, "rampart_quic_handshakes_pending", &[]) == 0.0 {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    panic!("handshakes still pending: {}", fx.gw().metrics.render());
}

/// Trailers in both directions: a request trailer section from the client (a HEADERS frame
/// after the body) reaches the upstream (h2c, which carries trailers), whose /echo endpoint
/// returns the body and its trailers, and those come back to the client as HTTP/3 trailers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_and_response_trailers_pass_through() {
    let fx = start("protocol = \"h2c\"", QUIC).await;
    let r = json_lines(
        &run(h3(
            &fx,
            &[
                "--method",
                "POST",
                "--path",
                "/echo",
                "--body-size",
                "3000",
                "--trailer",
                "x-checksum: abc123",
                "--trailer",
                "grpc-status: 0",
            ],
        ))
        .await,
    );
    assert_eq!(
        (r[0]["status"].clone(), r[0]["body_len"].clone()),
        (200.into(), 3000.into())
    );
    let headers = &r[0]["headers"];
    assert_eq!(headers["x-checksum"], "abc123", "{headers}");
    assert_eq!(headers["grpc-status"], "0", "{headers}");
}

/// HTTP/3 runs on every worker. With two, new connections land on both (the last byte of the
/// client's random Initial connection ID picks one); a client that moves to a new port
/// mid-transfer stays with the worker that holds its connection, because the kernel steers
/// by the connection ID that worker issued, not by address.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quic_connections_spread_over_workers_and_migrations_stay_on_theirs() {
    let fx = start_edited(QUIC, |text, _| {
        text.replace("[server]\n", "[server]\nworker_threads = 2\n")
    })
    .await;
    // 16 clients at once, one connection each: all on one worker has odds of 2 in 65,536.
    let clients = (0..16).map(|_| run(h3(&fx, &["--path", "/bytes/100"])));
    for out in futures_util::future::join_all(clients).await {
        assert_eq!(json_lines(&out)[0]["body_len"], 100);
    }
    let m = fx.gw().metrics.render();
    let on = |w: &str| {
        metric_sum(
            &m,
            "rampart_quic_connections_total",
            &[&format!("worker=\"{w}\"")],
        )
    };
    assert_eq!(on("0") + on("1"), 16.0, "{m}");
    assert!(
        on("0") >= 1.0 && on("1") >= 1.0,
        "both workers serve QUIC: {m}"
    );
    // Clients moving mid-transfer stay with the worker that holds their connection.
    for _ in 0..4 {
        download_while_moving(&fx).await;
    }
}

/// Load shedding: at `limits.max_connections` open QUIC connections a new attempt is refused
/// at once with CONNECTION_REFUSED (a stateless Initial, no handshake), not left to time out;
/// once the open connection ends, new ones are served again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quic_connections_beyond_the_limit_are_refused_at_once() {
    let fx = start(
        "",
        &format!("[listeners.limits]\nmax_connections = 1\n{QUIC}"),
    )
    .await;
    let holder = tokio::spawn(run(h3(&fx, &["--path", "/delay/3000"])));
    eventually_metric(
        &fx,
        "rampart_open_connections",
        &["listener=\"https/quic\""],
        1.0,
    )
    .await;
    assert_refused_at_once(&fx, Duration::from_secs(5)).await;
    assert_eq!(json_lines(&holder.await.unwrap())[0]["status"], 200);
    let mut served = false;
    for _ in 0..50 {
        let out = run(h3(&fx, &["--path", "/"])).await;
        if out.status.success() {
            served = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert!(served, "no connection served after the first one closed");
}

/// Graceful shutdown over HTTP/3: a request in flight when shutdown starts is answered in full,
/// the connection is then closed by the server (H3_NO_ERROR) as soon as the response is
/// delivered, not left to the idle timeout, new connection attempts are refused at once, and
/// shutdown reports everything drained well within the grace period.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn graceful_shutdown_drains_h3_connections() {
    let mut fx = start("", QUIC).await;
    let port = quic_port(&fx);
    // The client keeps its connection open afterwards until the server closes it (or 20 s).
    let in_flight = tokio::spawn(run(h3_at(
        port,
        &["--path", "/delay/1500", "--linger-ms", "20000"],
    )));
    // A download on its own connection; if it is still running at shutdown, closing once its
    // request finished (the body handed to the QUIC stack) rather than once it was delivered
    // would cut it short.
    let download = tokio::spawn(run(h3_at(
        port,
        &["--path", "/bytes/20000000", "--linger-ms", "20000"],
    )));
    // Both clients are connected (a loaded machine may take longer than a fixed pause to start
    // two Python clients), then shutdown starts while the delayed request is still upstream.
    eventually_metric(&fx, "rampart_quic_connections_total", &[], 2.0).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let t0 = std::time::Instant::now();
    let done = tokio::spawn(fx.gw.take().unwrap().shutdown());
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_refused(&run(h3_at(port, &["--path", "/"])).await);

    let out = in_flight.await.unwrap();
    let r = json_lines(&out);
    assert_eq!(r[0]["status"], 200);
    assert_eq!(r[0]["body"], "slept 1500 ms\n");
    let closed = String::from_utf8_lossy(&out.stderr);
    assert!(
        closed.contains("error_code=0x100"),
        "the server did not close the drained connection with H3_NO_ERROR: {closed}"
    );
    let out = download.await.unwrap();
    assert_eq!(json_lines(&out)[0]["body_len"], 20_000_000);
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("error_code=0x100"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        done.await.unwrap(),
        "shutdown reported undrained connections"
    );
    assert!(
        t0.elapsed() < Duration::from_secs(4),
        "shutdown took {:?} (grace 5 s): the drained connection was not closed at once",
        t0.elapsed()
    );
}

/// When the grace period runs out with a request still in flight, the server closes the
/// connection (the client learns at once instead of at its idle timeout) and shutdown says it
/// did not drain.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_closes_h3_connections_still_busy_after_the_grace_period() {
    let mut fx = start_edited(QUIC, |text, _| {
        text.replace("shutdown_grace = \"5s\"", "shutdown_grace = \"1s\"")
    })
    .await;
    let port = quic_port(&fx);
    let slow = tokio::spawn(run(h3_at(port, &["--path", "/delay/8000"])));
    tokio::time::sleep(Duration::from_millis(800)).await;
    let t0 = std::time::Instant::now();
    let drained = fx.gw.take().unwrap().shutdown().await;
    assert!(!drained, "a request 7 s from done counted as drained");
    let out = slow.await.unwrap();
    let waited = t0.elapsed();
    assert!(!out.status.success(), "the slow request was answered");
    let why = String::from_utf8_lossy(&out.stderr);
    assert!(
        why.contains("error_code=0x100"),
        "not closed by the server: {why}"
    );
    assert!(
        waited < Duration::from_secs(4),
        "the client learnt of the close only after {waited:?}"
    );
}

/// A client that sends its first Initial and then goes silent holds its connection only for
/// the listener's `tls.handshake_timeout`, as over TCP, not for the idle timeout (60 s); failed
/// Starts a QUIC handshake with `server` (a quiche client's first flight, its connection ID
/// filled with `id`) and says no more: the server answers and waits for the rest, which never
/// comes. The socket is returned so the client's address stays bound.
async fn stalled_handshake(server: std::net::SocketAddr, id: u8) -> tokio::net::UdpSocket {
    use tokio_quiche::quiche;
    let mut cfg = quiche::Config::new(quiche::PROTOCOL_VERSION).unwrap();
    cfg.verify_peer(false);
    cfg.set_application_protos(&[b"h3"]).unwrap();
    let sock = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let local = sock.local_addr().unwrap();
    let scid = quiche::ConnectionId::from_vec(vec![id; 16]);
    let mut conn = quiche::connect(Some("localhost"), &scid, local, server, &mut cfg).unwrap();
    let mut first = [0u8; 1500];
    while let Ok((n, _)) = conn.send(&mut first) {
        sock.send_to(&first[..n], server).await.unwrap();
    }
    sock
}

/// A flood of Initials holds bounded memory: past `max_pending_handshakes` new attempts are
/// refused at once (counted as shed), whatever the Retry policy, and served again once the
/// pending ones have timed out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pending_quic_handshakes_are_bounded() {
    let fx = start(
        "",
        &format!(
            "[listeners.tls]\nhandshake_timeout = \"5s\"\n{QUIC}\nretry = \"never\"\nmax_pending_handshakes = 2"
        ),
    )
    .await;
    let server: std::net::SocketAddr = ([127, 0, 0, 1], quic_port(&fx)).into();
    let _held = [
        stalled_handshake(server, 1).await,
        stalled_handshake(server, 2).await,
    ];
    eventually_metric(&fx, "rampart_quic_handshakes_pending", &[], 2.0).await;
    assert_refused_at_once(&fx, Duration::from_secs(5)).await;
    // Once the stalled ones time out, handshakes are served again.
    let mut served = false;
    for _ in 0..50 {
        if quic_handshake(server).await.is_ok() {
            served = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        served,
        "no handshake served after the pending ones timed out"
    );
}

/// QUIC handshakes are counted by reason, as TCP ones are.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_quic_handshakes_end_at_the_handshake_timeout_and_are_counted() {
    let fx = start(
        "",
        &format!("[listeners.tls]\nhandshake_timeout = \"1s\"\n{QUIC}"),
    )
    .await;
    let server: std::net::SocketAddr = ([127, 0, 0, 1], quic_port(&fx)).into();
    let _stalled = stalled_handshake(server, 7).await;
    let open = ["listener=\"https/quic\""];
    eventually_metric(&fx, "rampart_open_connections", &open, 1.0).await;
    let t0 = std::time::Instant::now();
    while metric_sum(&fx.gw().metrics.render(), "rampart_open_connections", &open) > 0.0 {
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "the stalled handshake still holds a connection after {:?}",
            t0.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let m = eventually_metric(
        &fx,
        "rampart_tls_handshake_errors_total",
        &["listener=\"https/quic\"", "reason=\"timeout\""],
        1.0,
    )
    .await;
    assert_eq!(
        metric_sum(&m, "rampart_tls_handshake_errors_total", &[]),
        1.0,
        "{m}"
    );
    // A handshake that fails in TLS (no protocol in common: the no_application_protocol
    // alert) counts as `tls`.
    assert!(quic_handshake_alpn(server, b"h2").await.is_err());
    eventually_metric(
        &fx,
        "rampart_tls_handshake_errors_total",
        &["listener=\"https/quic\"", "reason=\"tls\""],
        1.0,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_response_cut_short_upstream_resets_the_stream_and_the_connection_serves_on() {
    let (fx, _ended) = start_with_faulty_upstream(QUIC).await;
    let r = json_lines(&run(h3(&fx, &["--path", CUT_PATH, "--path", "/bytes/1000"])).await);
    // A clean end would pass a truncated body off as whole: the stream must be reset.
    assert_eq!(r[0]["status"], 200, "{}", r[0]);
    assert!(
        r[0]["reset"].is_u64(),
        "the short body ended cleanly: {}",
        r[0]
    );
    assert!(
        r[0]["body_len"].as_u64().unwrap() <= CUT_SENT as u64,
        "{}",
        r[0]
    );
    // The same connection goes on serving.
    assert_eq!(
        (r[1]["status"].clone(), r[1]["body_len"].clone()),
        (200.into(), 1000.into())
    );
    assert_eq!(r[0]["local_port"], r[1]["local_port"]);
    let m = fx.gw().metrics.render();
    let body_errors = &["cluster=\"faulty\"", "kind=\"body\""];
    assert_eq!(
        metric_sum(&m, "rampart_upstream_errors_total", body_errors),
        1.0,
        "{m}"
    );
    let log = access_log(&fx, 2).await;
    assert_eq!(
        (log[0]["protocol"].as_str(), log[0]["response_end"].as_str()),
        (Some("h3"), Some("upstream_error"))
    );
    assert_eq!(log[1]["response_end"], "complete");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_h3_download_frees_its_upstream_connection() {
    let (fx, mut ended) = start_with_faulty_upstream(QUIC).await;
    let out = run(h3(
        &fx,
        &[
            "--path",
            ENDLESS_PATH,
            "--stop-after",
            "1000000",
            "--path",
            "/bytes/1000",
        ],
    ))
    .await;
    let r = json_lines(&out);
    assert_eq!(r[0]["stopped"], true, "{}", r[0]);
    assert_eq!(
        (r[1]["status"].clone(), r[1]["body_len"].clone()),
        (200.into(), 1000.into())
    );
    assert!(
        next_report(&mut ended).await == Some(FaultReport::EndlessClosed),
        "the upstream connection was still open 5 s after the client stopped reading"
    );
    // No request stream stays counted open.
    let m = eventually_metric(&fx, "rampart_http_requests_total", &[], 2.0).await;
    assert_eq!(metric_sum(&m, "rampart_quic_open_streams", &[]), 0.0, "{m}");
    assert_eq!(
        metric_sum(&m, "rampart_http_responses_abandoned_total", &[]),
        1.0,
        "{m}"
    );
    let log = access_log(&fx, 2).await;
    assert_eq!(
        (log[0]["path"].as_str(), log[0]["response_end"].as_str()),
        (Some(ENDLESS_PATH), Some("abandoned"))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upload_the_client_resets_never_reaches_the_upstream_as_whole() {
    // Every body streamed (none buffered first), so each case reaches the upstream cut short.
    let listener = format!("[listeners.limits]\nbuffer_body_bytes = 0\n{QUIC}");
    let (fx, mut reports) = start_with_faulty_upstream(&listener).await;
    // 300 KB of a 1 MB body, no content-length (a streamed upload), then RESET_STREAM.
    let out = run(h3(
        &fx,
        &[
            "--method",
            "POST",
            "--path",
            UPLOAD_PATH,
            "--body-size",
            "1000000",
            "--reset-upload-after",
            "300000",
        ],
    ))
    .await;
    let r = json_lines(&out);
    assert_eq!(r[0]["upload_reset"], true, "{}", r[0]);
    // What answer reaches the client (its receiving side is still open): 400, not a 502.
    assert!(
        matches!(r[0]["status"].as_u64(), Some(400) | Some(0)),
        "{}",
        r[0]
    );
    let bytes = assert_upload_cut_short(&mut reports, "RESET_STREAM").await;
    assert!(bytes <= 300_000, "{bytes}");
    // An upload that is not reset arrives whole.
    let out = run(h3(
        &fx,
        &[
            "--method",
            "POST",
            "--path",
            UPLOAD_PATH,
            "--body-size",
            "300000",
        ],
    ))
    .await;
    assert_eq!(json_lines(&out)[0]["status"], 200);
    assert_eq!(
        next_report(&mut reports).await,
        Some(FaultReport::Upload {
            complete: true,
            bytes: 300_000
        })
    );
    // A body that ends short of its content-length is malformed: refused, not passed on whole.
    let out = run(h3(
        &fx,
        &[
            "--method",
            "POST",
            "--path",
            UPLOAD_PATH,
            "--body-size",
            "500",
            "--header",
            "content-length: 1000",
        ],
    ))
    .await;
    assert_eq!(json_lines(&out)[0]["status"], 400);
    assert_upload_cut_short(&mut reports, "short of its content-length").await;
    assert_no_upstream_errors(&fx);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn route_access_lists_refuse_clients_with_403_over_tcp_and_quic() {
    let routes = "\n[[routes]]\npath_prefix = \"/bytes/\"\ncluster = \"app\"\ndeny = [\"127.0.0.0/8\"]\n\
                  \n[[routes]]\npath_prefix = \"/headers\"\ncluster = \"app\"\nallow = [\"192.0.2.0/24\", \"::1\"]\n\
                  \n[[routes]]\npath_prefix = \"/delay/\"\ncluster = \"app\"\nallow = [\"127.0.0.0/8\"]\n";
    let fx = start(routes, QUIC).await;
    for (path, want) in [
        ("/bytes/10", 403),
        ("/headers", 403),
        ("/delay/1", 200),
        ("/", 200),
    ] {
        let got = curl_status(&fx, &[&fx.url(path)]).await;
        assert_eq!(got, want.to_string(), "TCP {path}");
        let r = json_lines(&run(h3(&fx, &["--path", path])).await);
        assert_eq!(r[0]["status"], want, "QUIC {path}: {}", r[0]);
    }
    let m = fx.gw().metrics.render();
    assert_eq!(
        metric_sum(&m, "rampart_http_requests_total", &["status=\"403\""]),
        4.0,
        "{m}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listener_access_lists_turn_clients_away_before_any_handshake() {
    let fx = start("", &format!("deny = [\"127.0.0.0/8\"]\n{QUIC}")).await;
    let out = run(curl(&fx, &["-o", "/dev/null", &fx.url("/")])).await;
    assert!(!out.status.success(), "a denied client was served over TCP");
    assert_refused(&run(h3(&fx, &["--path", "/"])).await);
    let m = fx.gw().metrics.render();
    for listener in ["https", "https/quic"] {
        let label = format!("listener=\"{listener}\"");
        assert!(
            metric_sum(&m, "rampart_connections_denied_total", &[&label]) >= 1.0,
            "{m}"
        );
    }
    assert_eq!(
        metric_sum(&m, "rampart_tls_handshakes_total", &[]),
        0.0,
        "{m}"
    );

    // Allowed by address (the QUIC client's IPv4-mapped address included).
    let fx = start("", &format!("allow = [\"127.0.0.1\"]\n{QUIC}")).await;
    assert_eq!(curl_status(&fx, &[&fx.url("/")]).await, "200");
    assert_eq!(
        json_lines(&run(h3(&fx, &["--path", "/"])).await)[0]["status"],
        200
    );
}

/// `limits.new_connections_per_address`: past its burst, a client address's new connections
/// are turned away, over TCP (closed at accept) and QUIC (closed with H3_EXCESSIVE_LOAD once
/// the handshake has validated the address), from one budget the listener's transports
/// share, and counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_address_opening_connections_too_fast_is_turned_away() {
    let limits =
        "[listeners.limits]\nnew_connections_per_address = { per_second = 0.01, burst = 3 }";
    let fx = start("", &format!("{limits}\n{QUIC}")).await;
    assert_eq!(curl_status(&fx, &[&fx.url("/")]).await, "200");
    assert_eq!(curl_status(&fx, &[&fx.url("/")]).await, "200");
    assert_eq!(
        json_lines(&run(h3(&fx, &["--path", "/"])).await)[0]["status"],
        200,
        "the third connection, over QUIC, is within the burst"
    );
    let out = run(curl(&fx, &["-o", "/dev/null", &fx.url("/")])).await;
    assert!(
        !out.status.success(),
        "a fourth connection was served over TCP"
    );
    // QUIC is charged once the handshake has validated the address (an Initial's can be
    // forged): the connection is then closed with H3_EXCESSIVE_LOAD.
    let out = run(h3(&fx, &["--path", "/"])).await;
    assert!(
        !out.status.success(),
        "a fifth connection was served over QUIC"
    );
    let why = String::from_utf8_lossy(&out.stderr);
    assert!(
        why.contains("error_code=0x107"),
        "not H3_EXCESSIVE_LOAD: {why}"
    );
    let m = fx.gw().metrics.render();
    for listener in ["https", "https/quic"] {
        let label = format!("listener=\"{listener}\"");
        assert_eq!(
            metric_sum(&m, "rampart_connections_rate_limited_total", &[&label]),
            1.0,
            "{m}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rate_limited_route_answers_429_with_retry_after_over_tcp_and_quic() {
    // Two workers share the route's buckets: 3 at once, then one every 4 s (slow enough that
    // a slow machine's requests do not earn tokens back during the test).
    let routes = "\n[[routes]]\npath_prefix = \"/bytes/\"\ncluster = \"app\"\n\
                  rate_limit = { per_second = 0.25, burst = 3 }\n";
    let fx = start_edited(QUIC, |text, _| {
        text.replace("[server]\n", "[server]\nworker_threads = 2\n") + routes
    })
    .await;
    let mut codes = Vec::new();
    for _ in 0..5 {
        codes.push(curl_status(&fx, &[&fx.url("/bytes/10")]).await);
    }
    assert_eq!(codes[..3], ["200", "200", "200"], "{codes:?}");
    assert_eq!(codes[3..], ["429", "429"], "{codes:?}");
    let out = stdout(
        &run(curl(
            &fx,
            &["-D", "-", "-o", "/dev/null", &fx.url("/bytes/10")],
        ))
        .await,
    );
    let retry_after: u64 = out
        .lines()
        .find_map(|l| {
            l.to_ascii_lowercase()
                .strip_prefix("retry-after: ")
                .map(str::to_string)
        })
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no retry-after: {out}"));
    assert!((1..=4).contains(&retry_after), "{out}");
    // The same client over QUIC draws on the same bucket; other routes are not limited.
    let r = json_lines(&run(h3(&fx, &["--path", "/bytes/10", "--path", "/"])).await);
    assert_eq!(
        (r[0]["status"].clone(), r[1]["status"].clone()),
        (429.into(), 200.into())
    );
    assert!(r[0]["headers"]["retry-after"].is_string(), "{}", r[0]);
    // After the wait it named there is a token again.
    tokio::time::sleep(Duration::from_millis(retry_after * 1000 + 100)).await;
    assert_eq!(curl_status(&fx, &[&fx.url("/bytes/10")]).await, "200");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn routes_rewrite_request_and_response_headers_over_tcp_and_quic() {
    let hsts = "max-age=63072000; includeSubDomains";
    let routes = format!(
        "\n[[routes]]\npath_prefix = \"/headers\"\ncluster = \"app\"\n\
         request_headers = {{ set = {{ \"x-env\" = \"prod\" }}, remove = [\"user-agent\"] }}\n\
         response_headers = {{ set = {{ \"strict-transport-security\" = \"{hsts}\" }} }}\n\
         \n[[routes]]\npath_prefix = \"/bytes/\"\ncluster = \"app\"\ndeny = [\"127.0.0.0/8\"]\n\
         response_headers = {{ set = {{ \"strict-transport-security\" = \"{hsts}\" }}, remove = [\"x-request-id\"] }}\n"
    );
    let fx = start(&routes, QUIC).await;
    // TCP: the upstream saw the rewritten request; the response carries the set header.
    let out = stdout(&run(curl(&fx, &["-D", "-", &fx.url("/headers")])).await);
    let (head, body) = out.split_once("\r\n\r\n").unwrap();
    assert!(
        head.contains(&format!("strict-transport-security: {hsts}")),
        "{head}"
    );
    let seen: serde_json::Value = serde_json::from_str(body).unwrap();
    assert_eq!(seen["x-env"], "prod", "{seen}");
    assert!(seen.get("user-agent").is_none(), "{seen}");
    // QUIC, and the gateway's own 403 on a route that sets and removes headers.
    let r = json_lines(&run(h3(&fx, &["--path", "/headers", "--path", "/bytes/10"])).await);
    assert_eq!(
        r[0]["headers"]["strict-transport-security"], hsts,
        "{}",
        r[0]
    );
    let seen: serde_json::Value = serde_json::from_str(r[0]["body"].as_str().unwrap()).unwrap();
    assert_eq!(seen["x-env"], "prod", "{seen}");
    assert_eq!(r[1]["status"], 403);
    assert_eq!(
        r[1]["headers"]["strict-transport-security"], hsts,
        "{}",
        r[1]
    );
    assert!(r[1]["headers"].get("x-request-id").is_none(), "{}", r[1]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_compressing_route_gzips_text_for_clients_that_accept_it() {
    let routes = "\n[[routes]]\npath_prefix = \"/text/\"\ncluster = \"app\"\ncompress = true\n\
                  \n[[routes]]\npath_prefix = \"/bytes/\"\ncluster = \"app\"\ncompress = true\n";
    let fx = start(routes, QUIC).await;
    let fetch = |args: &[&str], path: &str| {
        let mut all = vec!["-D", "-", "-o", "/dev/null", "-w", "size=%{size_download}"];
        all.extend_from_slice(args);
        let url = fx.url(path);
        let cmd = curl(&fx, &[&all[..], &[url.as_str()]].concat());
        async move { stdout(&run(cmd).await).to_ascii_lowercase() }
    };
    // curl --compressed asks for gzip and decodes it; the bytes on the wire are far fewer.
    let out = fetch(&["--compressed"], "/text/200000").await;
    assert!(
        out.contains("content-encoding: gzip") && out.contains("vary: accept-encoding"),
        "{out}"
    );
    assert!(!out.contains("content-length:"), "{out}");
    let wire: usize = out.rsplit("size=").next().unwrap().trim().parse().unwrap();
    assert!(wire < 20_000, "{wire} bytes on the wire");
    // Decoded, it is the upstream's text, whole.
    let text = stdout(&run(curl(&fx, &["--compressed", &fx.url("/text/200000")])).await);
    assert_eq!(text.len(), 200_000);
    assert!(text.starts_with("The quick brown fox jumps over the lazy dog. The quick"));
    // Not asked for, or not text: as the upstream sent it.
    let out = fetch(&[], "/text/200000").await;
    assert!(
        !out.contains("content-encoding") && out.contains("size=200000"),
        "{out}"
    );
    let out = fetch(&["--compressed"], "/bytes/200000").await;
    assert!(
        !out.contains("content-encoding") && out.contains("size=200000"),
        "{out}"
    );
    // HTTP/3 too.
    let r = json_lines(
        &run(h3(
            &fx,
            &[
                "--path",
                "/text/200000",
                "--header",
                "accept-encoding: gzip",
            ],
        ))
        .await,
    );
    assert_eq!(r[0]["headers"]["content-encoding"], "gzip", "{}", r[0]);
    assert!(r[0]["body_len"].as_u64().unwrap() < 20_000, "{}", r[0]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gzipped_response_keeps_its_trailers_after_the_compressed_body() {
    // An h2c upstream echoing a text upload with its trailers, through a compressing route.
    let fx = start_edited(QUIC, |text, _| {
        text.replace(
            "[[routes]]\ncluster = \"app\"",
            "[[routes]]\ncluster = \"app\"\ncompress = true",
        )
        .replace("endpoints = [", "protocol = \"h2c\"\nendpoints = [")
    })
    .await;
    let r = json_lines(
        &run(h3(
            &fx,
            &[
                "--method",
                "POST",
                "--path",
                "/echo",
                "--body-size",
                "5000",
                "--header",
                "content-type: text/plain",
                "--header",
                "accept-encoding: gzip",
                "--trailer",
                "x-checksum: abc123",
            ],
        ))
        .await,
    );
    assert_eq!(r[0]["status"], 200, "{}", r[0]);
    assert_eq!(r[0]["headers"]["content-encoding"], "gzip", "{}", r[0]);
    assert_eq!(r[0]["decoded_sha256"], r[0]["sent_sha256"], "{}", r[0]);
    assert_eq!(r[0]["headers"]["x-checksum"], "abc123", "{}", r[0]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gateways_sharing_a_ticket_key_file_resume_each_others_sessions_with_0rtt() {
    let keys = tempfile::tempdir().unwrap();
    let file = |name: &str, key_byte: u8| {
        let path = keys.path().join(name);
        std::fs::write(
            &path,
            format!("# fleet\n{}\n", format!("{key_byte:02x}").repeat(80)),
        )
        .unwrap();
        path
    };
    let (shared, other) = (file("fleet.keys", 0x5a), file("other.keys", 0xa5));
    let listener = |path: &std::path::Path| {
        format!(
            "tls.ticket_key_file = \"{}\"\n{QUIC}\nearly_data = true",
            path.display()
        )
    };
    let a = start("", &listener(&shared)).await;
    let b = start("", &listener(&shared)).await;
    let c = start("", &listener(&other)).await;

    // TCP: a ticket from gateway a resumes on b (same keys), not on c.
    let sess = keys.path().join("sess.pem");
    assert_sessions_shared(&a, &b, &c, &sess).await;

    // QUIC: a ticket from a, and 0-RTT early data accepted on b.
    let ticket = keys.path().join("ticket.pickle");
    let t = ticket.to_str().unwrap();
    let r = json_lines(&run(h3(&a, &["--session-file", t, "--path", "/delay/200"])).await);
    assert_eq!(r[0]["status"], 200);
    let r = json_lines(
        &run(h3(
            &b,
            &["--session-file", t, "--zero-rtt", "--path", "/headers"],
        ))
        .await,
    );
    assert_eq!(r[0]["status"], 200);
    assert_eq!(
        (r[0]["resumed"].clone(), r[0]["early_data_accepted"].clone()),
        (true.into(), true.into()),
        "{}",
        r[0]
    );
}

/// Finding 3 of the hardening issue, over QUIC: a client that keeps its connection alive with
/// PINGs but sends no request is closed at `first_request_timeout`, and one that has made a
/// request and then only pings is closed at `idle_timeout` (QUIC's own idle timeout restarts
/// with every packet, so it alone would keep both for ever). Both are counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pinging_h3_connections_without_requests_are_closed() {
    let limits = "[listeners.limits]\nfirst_request_timeout = \"1s\"\nidle_timeout = \"2s\"";
    let fx = start("", &format!("{limits}\n{QUIC}")).await;
    let closed_after = |args: &[&str]| {
        let mut args = args.to_vec();
        args.extend(["--idle-ping-ms", "200"]);
        let out = run(h3(&fx, &args));
        async move {
            let r = json_lines(&out.await);
            let last = r.last().unwrap();
            assert_eq!(last["error_code"], 0x100, "H3_NO_ERROR: {last}");
            last["closed_after_ms"]
                .as_u64()
                .unwrap_or_else(|| panic!("still open after 15 s of pings: {last}"))
        }
    };
    let ms = closed_after(&["--no-request"]).await;
    assert!(
        (900..5000).contains(&ms),
        "closed {ms} ms after the handshake"
    );
    let ms = closed_after(&["--path", "/bytes/10"]).await;
    assert!(
        (1900..6000).contains(&ms),
        "closed {ms} ms after the response"
    );
    let m = fx.gw().metrics.render();
    for reason in ["no_request", "idle"] {
        let labels = ["listener=\"https/quic\"", &format!("reason=\"{reason}\"")];
        assert_eq!(
            metric_sum(&m, "rampart_connections_closed_total", &labels),
            1.0,
            "{reason}: {m}"
        );
    }
}

/// Near the QUIC listener's cap (more than 3/4 of `max_connections` open), a connection idle
/// after its request closes at `idle_timeout_under_pressure`, as TCP ones do, even when the
/// pressure arises after its request ended (the limit is asked again every few seconds).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn near_the_quic_cap_idle_connections_close_sooner() {
    let limits = "[listeners.limits]\nmax_connections = 2\nidle_timeout = \"30s\"\nidle_timeout_under_pressure = \"1s\"";
    let fx = start("", &format!("{limits}\n{QUIC}")).await;
    let open = ["listener=\"https/quic\""];
    // One connection makes its request and then only pings: 1 of 2 open, no pressure.
    let idle = tokio::spawn(run(h3(
        &fx,
        &["--path", "/bytes/10", "--idle-ping-ms", "200"],
    )));
    eventually_metric(&fx, "rampart_open_connections", &open, 1.0).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    // A second one, busy with a slow request for longer than the test, makes 2 of 2.
    let busy = tokio::spawn(run(h3(&fx, &["--path", "/delay/9000"])));
    eventually_metric(&fx, "rampart_open_connections", &open, 2.0).await;
    let r = json_lines(&idle.await.unwrap());
    let last = r.last().unwrap();
    let ms = last["closed_after_ms"]
        .as_u64()
        .unwrap_or_else(|| panic!("still open after 15 s: {last}"));
    assert!(
        ms < 10_000,
        "closed {ms} ms after the response, not at the pressed limit"
    );
    let m = fx.gw().metrics.render();
    let labels = ["listener=\"https/quic\"", "reason=\"idle\""];
    assert_eq!(
        metric_sum(&m, "rampart_connections_closed_total", &labels),
        1.0,
        "{m}"
    );
    // The busy one is not idle: it is answered.
    assert_eq!(json_lines(&busy.await.unwrap())[0]["status"], 200);
}

/// Relays a QUIC client to `to` and back, and sends a copy of the client's first datagrams
/// (its first flight: the ClientHello and the 0-RTT packets) to `copy_to` 300 ms later, as an
/// attacker who captured them would. Returns the relay's port.
async fn replaying_relay(to: std::net::SocketAddr, copy_to: std::net::SocketAddr) -> u16 {
    use tokio::net::UdpSocket;
    let front = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let port = front.local_addr().unwrap().port();
    let back = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let copier = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    tokio::spawn(async move {
        let (mut client, mut first_at) = (None, None::<std::time::Instant>);
        let mut captured: Vec<Vec<u8>> = Vec::new();
        let mut copied = false;
        let (mut a, mut b) = ([0u8; 2048], [0u8; 2048]);
        let end = std::time::Instant::now() + Duration::from_secs(20);
        while std::time::Instant::now() < end {
            tokio::select! {
                r = front.recv_from(&mut a) => {
                    let (n, from) = r.unwrap();
                    client = Some(from);
                    let at = *first_at.get_or_insert_with(std::time::Instant::now);
                    if at.elapsed() < Duration::from_millis(50) {
                        captured.push(a[..n].to_vec());
                    }
                    let _ = back.send_to(&a[..n], to).await;
                }
                r = back.recv_from(&mut b) => {
                    let (n, _) = r.unwrap();
                    if let Some(c) = client {
                        let _ = front.send_to(&b[..n], c).await;
                    }
                }
                _ = tokio::time::sleep(Duration::from_millis(20)) => {}
            }
            if !copied && first_at.is_some_and(|t| t.elapsed() > Duration::from_millis(300)) {
                copied = true;
                for d in &captured {
                    let _ = copier.send_to(d, copy_to).await;
                }
            }
        }
    });
    port
}

/// 0-RTT anti-replay across the fleet: a client's 0-RTT attempt on gateway a is recorded in
/// Redis and accepted; the same first flight replayed to gateway b (which can open the
/// ticket: the fleet shares its ticket keys) has its early data rejected there. With Redis
/// gone, early data is rejected (the safe side) and the handshake completes as 1-RTT.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replayed_0rtt_attempt_has_its_early_data_rejected_on_another_gateway() {
    let mut redis = common::redis::Redis::start();
    // A deadline a busy test machine meets (past it the early data would be refused as
    // unanswered: the safe side, but not what this test looks at until Redis is gone).
    let fleet = format!("{}\ndeadline = \"100ms\"", redis.fleet_section());
    let listener = format!("tls.fleet_ticket_keys = true\n{QUIC}\nearly_data = true");
    let gateway = || fleet_gateway(&fleet, &listener);
    let (a, b) = (gateway().await, gateway().await);
    // Both read the fleet's ticket keys.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let dir = tempfile::tempdir().unwrap();
    let ticket = dir.path().join("ticket.pickle");
    let t = ticket.to_str().unwrap();
    let r = json_lines(&run(h3(&a, &["--session-file", t, "--path", "/headers"])).await);
    assert_eq!(r[0]["status"], 200);

    let checks = |fx: &Fixture, result: &str| {
        metric_sum(
            &fx.gw().metrics.render(),
            "rampart_early_data_replay_checks_total",
            &[&format!("result=\"{result}\"")],
        )
    };
    let relay = replaying_relay(quic_addr(&a), quic_addr(&b)).await;
    let r = json_lines(
        &run(h3_at(
            relay,
            &["--session-file", t, "--zero-rtt", "--path", "/headers"],
        ))
        .await,
    );
    assert_eq!(r[0]["status"], 200, "{}", r[0]);
    assert_eq!(
        r[0]["early_data_accepted"], true,
        "the first attempt: {}",
        r[0]
    );
    assert_eq!(checks(&a, "first"), 1.0);
    let name = "rampart_early_data_replay_checks_total";
    eventually_metric(&b, name, &["result=\"replay\""], 1.0).await;
    assert_eq!(
        checks(&b, "replay"),
        1.0,
        "the replayed copy was seen as one"
    );
    assert_eq!(checks(&b, "first"), 0.0);

    // Without Redis no record can be made: early data is rejected, the request still served.
    redis.kill();
    let r = json_lines(
        &run(h3(
            &b,
            &["--session-file", t, "--zero-rtt", "--path", "/headers"],
        ))
        .await,
    );
    assert_eq!(r[0]["status"], 200, "{}", r[0]);
    assert_eq!(
        (r[0]["resumed"].clone(), r[0]["early_data_accepted"].clone()),
        (true.into(), false.into()),
        "{}",
        r[0]
    );
    assert!(checks(&b, "unanswered") >= 1.0);
}

/// Relays a QUIC client to `first` until `first` answers with a Retry, then to `then` (and
/// back), as an L4 balancer that does not pin a client to the server it reached first would.
/// Returns the relay's port.
async fn switching_relay(first: std::net::SocketAddr, then: std::net::SocketAddr) -> u16 {
    use tokio::net::UdpSocket;
    let front = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let port = front.local_addr().unwrap().port();
    let back = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    tokio::spawn(async move {
        let (mut client, mut to) = (None, first);
        let (mut a, mut b) = ([0u8; 2048], [0u8; 2048]);
        let end = std::time::Instant::now() + Duration::from_secs(20);
        while std::time::Instant::now() < end {
            tokio::select! {
                r = front.recv_from(&mut a) => {
                    let (n, from) = r.unwrap();
                    client = Some(from);
                    let _ = back.send_to(&a[..n], to).await;
                }
                r = back.recv_from(&mut b) => {
                    let (n, _) = r.unwrap();
                    // A long-header packet of type Retry (QUIC v1: 0b11 in bits 4-5).
                    if n > 0 && b[0] & 0x80 != 0 && (b[0] & 0x30) == 0x30 {
                        to = then;
                    }
                    if let Some(c) = client {
                        let _ = front.send_to(&b[..n], c).await;
                    }
                }
                _ = tokio::time::sleep(Duration::from_millis(50)) => {}
            }
        }
    });
    port
}

/// `quic.fleet_retry_keys`: a Retry issued by gateway a is accepted by gateway b (both sign
/// with the fleet's keys), so a client an L4 balancer moves after its Retry still connects;
/// to a gateway with keys of its own the same move fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_from_one_gateway_is_accepted_by_another_with_fleet_retry_keys() {
    let redis = common::redis::Redis::start();
    let (fleet, retry) = (redis.fleet_section(), format!("{QUIC}\nretry = \"always\""));
    let shared = format!("{retry}\nfleet_retry_keys = true");
    let (a, b, c) = (
        fleet_gateway(&fleet, &shared).await,
        fleet_gateway(&fleet, &shared).await,
        fleet_gateway(&fleet, &retry).await,
    );
    // Both shared-key gateways read the fleet's keys.
    redis.wait_for_key("rampart:retry:https").await;
    tokio::time::sleep(Duration::from_millis(1000)).await;

    let relay = switching_relay(quic_addr(&a), quic_addr(&b)).await;
    let r = json_lines(&run(h3_at(relay, &["--path", "/headers"])).await);
    assert_eq!(r[0]["status"], 200, "{}", r[0]);
    let accepted = |fx: &Fixture| {
        metric_sum(
            &fx.gw().metrics.render(),
            "rampart_quic_handshakes_total",
            &[],
        )
    };
    assert_eq!(accepted(&a), 0.0, "a only sent the Retry");
    assert!(accepted(&b) >= 1.0, "b completed the handshake");

    // To a gateway with a key of its own, the token is not valid: no connection.
    let relay = switching_relay(quic_addr(&a), quic_addr(&c)).await;
    let mut cmd = std::process::Command::new("timeout");
    cmd.arg("5").arg("python3");
    cmd.arg(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/h3_client.py"))
        .args(["--port", &relay.to_string(), "--path", "/headers"]);
    let out = run(cmd).await;
    assert!(
        !out.status.success(),
        "connected with a token c cannot have signed"
    );
    assert_eq!(accepted(&c), 0.0);
}

/// Connects a quiche client to `first` through a relay, then turns the relay to `then` (as an
/// L4 balancer does when `first` stops) and sends a PING: whether the client was reset within
/// 2 s. Its idle timeout is 30 s, so a close sooner is the reset.
async fn reset_after_move(first: std::net::SocketAddr, then: std::net::SocketAddr) -> bool {
    use std::sync::atomic::{AtomicBool, Ordering};
    use tokio::net::UdpSocket;
    use tokio_quiche::quiche;
    let front = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let relay = front.local_addr().unwrap();
    let back = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let moved = std::sync::Arc::new(AtomicBool::new(false));
    let relay_task = tokio::spawn({
        let moved = moved.clone();
        async move {
            let (mut client, mut a, mut b) = (None, [0u8; 2048], [0u8; 2048]);
            loop {
                tokio::select! {
                    r = front.recv_from(&mut a) => {
                        let (n, from) = r.unwrap();
                        client = Some(from);
                        let to = if moved.load(Ordering::Relaxed) { then } else { first };
                        let _ = back.send_to(&a[..n], to).await;
                    }
                    r = back.recv_from(&mut b) => {
                        let (n, _) = r.unwrap();
                        if let Some(c) = client {
                            let _ = front.send_to(&b[..n], c).await;
                        }
                    }
                }
            }
        }
    });
    let mut cfg = quiche::Config::new(quiche::PROTOCOL_VERSION).unwrap();
    cfg.verify_peer(false);
    cfg.set_application_protos(&[b"h3"]).unwrap();
    cfg.set_initial_max_data(1 << 20);
    cfg.set_initial_max_stream_data_bidi_local(1 << 16);
    cfg.set_initial_max_streams_bidi(10);
    cfg.set_initial_max_streams_uni(10);
    cfg.set_initial_max_stream_data_uni(1 << 16);
    cfg.set_max_idle_timeout(30_000);
    let sock = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let local = sock.local_addr().unwrap();
    let mut scid = [0u8; 16];
    fastrand::fill(&mut scid);
    let scid = quiche::ConnectionId::from_ref(&scid);
    let mut conn = quiche::connect(Some("localhost"), &scid, local, relay, &mut cfg).unwrap();
    let mut h3 = None;
    let (mut out, mut buf) = ([0u8; 1500], [0u8; 65535]);
    let start = std::time::Instant::now();
    let mut pinged = None;
    let reset = loop {
        while let Ok((n, info)) = conn.send(&mut out) {
            sock.send_to(&out[..n], info.to).await.unwrap();
        }
        if conn.is_closed() {
            // A stateless reset closes without a CONNECTION_CLOSE from the peer.
            assert!(conn.peer_error().is_none(), "{:?}", conn.peer_error());
            break pinged.is_some() && !conn.is_timed_out();
        }
        match pinged {
            None if conn.is_established() && h3.is_none() => {
                // An HTTP/3 client's control streams, as the server expects.
                let h3_cfg = quiche::h3::Config::new().unwrap();
                h3 = Some(quiche::h3::Connection::with_transport(&mut conn, &h3_cfg).unwrap());
                continue;
            }
            None if conn.is_established() => {
                // Let the handshake's last packets land before the move.
                tokio::time::sleep(Duration::from_millis(200)).await;
                moved.store(true, std::sync::atomic::Ordering::Relaxed);
                conn.send_ack_eliciting().unwrap();
                pinged = Some(std::time::Instant::now());
                continue;
            }
            None => assert!(start.elapsed() < Duration::from_secs(10), "no handshake"),
            Some(t) if t.elapsed() > Duration::from_secs(2) => break false,
            Some(_) => {}
        }
        let wait = conn
            .timeout()
            .unwrap_or(Duration::from_millis(50))
            .min(Duration::from_millis(50));
        tokio::select! {
            r = sock.recv_from(&mut buf) => {
                let (n, from) = r.unwrap();
                let _ = conn.recv(&mut buf[..n], quiche::RecvInfo { from, to: local });
            }
            _ = tokio::time::sleep(wait) => conn.on_timeout(),
        }
    };
    relay_task.abort();
    reset
}

/// Stateless resets: a client whose packets an L4 balancer moves to a gateway that does not
/// know its connection (its own gateway stopped) is reset at once when the gateways share the
/// reset key, here through the fleet's Redis (`quic.fleet_stateless_reset_key`); the reset of
/// a gateway with a key of its own is not one the client accepts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_resets_another_ones_connection_with_the_fleet_reset_key() {
    let redis = common::redis::Redis::start();
    let (fleet, own) = (redis.fleet_section(), format!("{QUIC}\nretry = \"never\""));
    let shared = format!("{own}\nfleet_stateless_reset_key = true");
    let a = fleet_gateway(&fleet, &shared).await;
    redis.wait_for_key("rampart:reset:https").await;
    let (b, c) = (
        fleet_gateway(&fleet, &shared).await,
        fleet_gateway(&fleet, &own).await,
    );
    // b's first read of the fleet's key (a made it) is at once; leave it time on a busy machine.
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert!(
        reset_after_move(quic_addr(&a), quic_addr(&b)).await,
        "b's reset did not close a connection a made"
    );
    assert!(
        !reset_after_move(quic_addr(&a), quic_addr(&c)).await,
        "a reset from a gateway with a key of its own was accepted"
    );
    // Either way round between the two that share the key.
    assert!(reset_after_move(quic_addr(&b), quic_addr(&a)).await);
}

/// `tls.client_auth` over HTTP/3: the QUIC handshake asks for the certificate too; one from
/// the client CA passes, its subject, names and hash going upstream (the client's own copy
/// of those headers dropped); a revoked one, one from another CA and none fail. With
/// `optional`, a route with `client_cert = "required"` answers 403 to a client without one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_certificates_are_verified_over_http3() {
    let dir = client_certs();
    let p = |f: &str| dir.path().join(f).display().to_string();
    let listener = |auth: &str| format!("{}\n{QUIC}", client_auth_listener(dir.path(), auth));
    let with = |who: &str| -> Vec<String> {
        match who {
            "" => vec![],
            who => vec![
                "--cert".into(),
                p(&format!("{who}.pem")),
                "--key".into(),
                p(&format!("{who}.key")),
            ],
        }
    };
    let get = |fx: &Fixture, who: &str, path: &str| {
        let mut args = with(who);
        args.extend(
            [
                "--path",
                path,
                "--header",
                "x-client-cert-subject: CN=root",
                "--timeout",
                "10",
            ]
            .map(String::from),
        );
        let refs: Vec<String> = args;
        let mut c = h3(fx, &[]);
        c.args(&refs);
        run(c)
    };
    let required = start("", &listener("required")).await;
    let r = json_lines(&get(&required, "alice", "/headers").await);
    let seen: serde_json::Value = serde_json::from_str(r[0]["body"].as_str().unwrap()).unwrap();
    assert_eq!(
        seen["x-client-cert-subject"], "O=Example,CN=alice",
        "{seen}"
    );
    assert_eq!(seen["x-client-cert-san"], "DNS:alice.example", "{seen}");
    assert_eq!(
        seen["x-client-cert-sha256"].as_str().unwrap().len(),
        64,
        "{seen}"
    );
    for (who, why) in [("bob", "revoked"), ("mallory", "another CA"), ("", "none")] {
        let out = get(&required, who, "/headers").await;
        assert!(
            !out.status.success(),
            "{who} ({why}) was served: {}",
            stdout(&out)
        );
    }

    let optional = start_edited(&listener("optional"), |text, _| {
        text.replace(
            "[[routes]]\ncluster = \"app\"",
            "[[routes]]\ncluster = \"app\"\n\n[[routes]]\npath_prefix = \"/bytes/\"\ncluster = \"app\"\nclient_cert = \"required\"",
        )
    })
    .await;
    let r = json_lines(&get(&optional, "", "/headers").await);
    let seen: serde_json::Value = serde_json::from_str(r[0]["body"].as_str().unwrap()).unwrap();
    assert!(seen.get("x-client-cert-subject").is_none(), "{seen}");
    assert_eq!(
        json_lines(&get(&optional, "", "/bytes/3").await)[0]["status"],
        403
    );
    assert_eq!(
        json_lines(&get(&optional, "alice", "/bytes/3").await)[0]["status"],
        200
    );
}
