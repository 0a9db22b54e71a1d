//! The gateway's own rules hold against a hostile client (issue 32): each test makes the
//! attack from outside, over real sockets, bounded in time and count.

mod common;
use common::*;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// What a raw upstream saw of each request: its head, as text.
type Seen = Arc<Mutex<Vec<String>>>;

/// An HTTP/1.1 upstream that records each request head and answers with `respond(head)`
/// (raw bytes, written as they are; `None` holds the connection open, saying nothing more).
async fn raw_upstream(
    respond: impl Fn(&str) -> Option<Vec<u8>> + Send + Sync + 'static,
) -> (SocketAddr, Seen) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen: Seen = Default::default();
    let respond = Arc::new(respond);
    let log = seen.clone();
    tokio::spawn(async move {
        loop {
            let Ok((mut s, _)) = listener.accept().await else {
                return;
            };
            let (log, respond) = (log.clone(), respond.clone());
            tokio::spawn(async move {
                let mut buf = Vec::new();
                loop {
                    let mut chunk = [0u8; 4096];
                    let n = match s.read(&mut chunk).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => n,
                    };
                    buf.extend_from_slice(&chunk[..n]);
                    let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
                        continue;
                    };
                    let head = String::from_utf8_lossy(&buf[..end]).into_owned();
                    buf.drain(..end + 4);
                    log.lock().unwrap().push(head.clone());
                    match respond(&head) {
                        Some(r) => {
                            if s.write_all(&r).await.is_err() {
                                return;
                            }
                        }
                        None => {
                            tokio::time::sleep(Duration::from_secs(30)).await;
                            return;
                        }
                    }
                }
            });
        }
    });
    (addr, seen)
}

fn ok_response(_: &str) -> Option<Vec<u8>> {
    Some(b"HTTP/1.1 200 OK\r\ncontent-length: 3\r\n\r\nok\n".to_vec())
}

/// A gateway in front of `upstream` with `config_tail` appended (routes, clusters).
async fn gateway_before(
    upstream: SocketAddr,
    cluster_extra: &str,
    listener_extra: &str,
    routes_before: &str,
) -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    make_certs(dir.path());
    let text = config_text(&[upstream], cluster_extra, listener_extra).replace(
        "[[routes]]\ncluster = \"app\"",
        &format!("{routes_before}\n[[routes]]\ncluster = \"app\""),
    );
    start_with(&text, dir, upstream, None).await
}

/// What arrives up to the end of a response head (or what did, at EOF or past `limit`).
async fn read_head<S: tokio::io::AsyncRead + Unpin>(s: &mut S, limit: Duration) -> String {
    let mut got = Vec::new();
    let _ = tokio::time::timeout(limit, async {
        let mut buf = [0u8; 4096];
        while !got.windows(4).any(|w| w == b"\r\n\r\n") {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await;
    String::from_utf8_lossy(&got).into_owned()
}

/// Sends `head` (a whole HTTP/1.1 request head and body) over TLS and returns the status.
async fn raw_status(fx: &Fixture, request: &[u8]) -> u16 {
    let mut tls = tls_to(fx, b"\x08http/1.1").await;
    tls.write_all(request).await.unwrap();
    let text = read_head(&mut tls, Duration::from_secs(5)).await;
    text.split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status in {text:?}"))
}

const DENIED_ADMIN: &str = r#"
[[routes]]
name = "admin"
path_prefix = "/admin"
cluster = "app"
deny = ["127.0.0.0/8"]
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spellings_of_a_denied_path_are_denied_too() {
    let (up, seen) = raw_upstream(ok_response).await;
    let fx = gateway_before(up, "", "", DENIED_ADMIN).await;
    for path in [
        "/admin",
        "//admin",
        "/./admin",
        "/x/../admin",
        "/%61dmin",
        "/%2e%2e/admin",
        "/x/%2E%2E/admin/users",
        "///admin//users",
    ] {
        let req = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\n\r\n");
        assert_eq!(raw_status(&fx, req.as_bytes()).await, 403, "{path}");
    }
    for path in [
        "/admin%2Fusers",
        "/x%2F..%2Fadmin",
        "/x\\..\\admin",
        "/%5cadmin",
        "/a%00",
    ] {
        let req = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\n\r\n");
        assert_eq!(raw_status(&fx, req.as_bytes()).await, 400, "{path}");
    }
    assert!(
        seen.lock().unwrap().is_empty(),
        "nothing reached the upstream"
    );
    // What goes upstream is the normalized path.
    let req = b"GET /pub/./x/../%7Euser//a?q=%2e HTTP/1.1\r\nHost: localhost\r\n\r\n";
    assert_eq!(raw_status(&fx, req).await, 200);
    let head = seen.lock().unwrap()[0].clone();
    assert!(
        head.starts_with("GET /pub/~user/a?q=%2e HTTP/1.1"),
        "{head}"
    );
}

const DENIED_HOST: &str = r#"
[[routes]]
name = "admin-host"
host = "admin.example"
cluster = "app"
deny = ["127.0.0.0/8"]
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_host_drives_routing_rules_and_the_upstream() {
    let (up, seen) = raw_upstream(ok_response).await;
    let fx = gateway_before(up, "", "", DENIED_HOST).await;
    let cases: [(&[u8], u16); 8] = [
        (b"GET / HTTP/1.1\r\nHost: admin.example\r\n\r\n", 403),
        (b"GET / HTTP/1.1\r\nHost: ADMIN.example.:443\r\n\r\n", 403),
        // Absolute form: the target's authority is the host, whatever Host says.
        (
            b"GET http://admin.example/ HTTP/1.1\r\nHost: www.example\r\n\r\n",
            403,
        ),
        (
            b"GET / HTTP/1.1\r\nHost: www.example\r\nHost: admin.example\r\n\r\n",
            400,
        ),
        (b"GET / HTTP/1.1\r\nHost: admin.example:abc\r\n\r\n", 400),
        (b"GET / HTTP/1.1\r\n\r\n", 400),
        (b"GET / HTTP/1.1\r\nHost: a b\r\n\r\n", 400),
        (
            b"GET / HTTP/1.1\r\nHost: www.example\r\nConnection: host\r\n\r\n",
            200,
        ),
    ];
    for (req, want) in cases {
        assert_eq!(
            raw_status(&fx, req).await,
            want,
            "{}",
            String::from_utf8_lossy(req)
        );
    }
    // The request that did go upstream named one Host, the canonical one, even though the
    // client listed Host in Connection.
    let req = b"GET http://www.example/x HTTP/1.1\r\nHost: admin.example\r\n\r\n";
    assert_eq!(raw_status(&fx, req).await, 200);
    let heads = seen.lock().unwrap().clone();
    assert_eq!(heads.len(), 2, "{heads:?}");
    for head in &heads {
        let hosts: Vec<_> = head
            .lines()
            .filter(|l| l.to_ascii_lowercase().starts_with("host:"))
            .collect();
        assert_eq!(hosts, vec!["host: www.example"], "{head}");
    }

    // HTTP/2: `:authority` and a `host` that disagree make the request malformed.
    let tls = tls_to(&fx, b"\x02h2").await;
    let (client, conn) = h2::client::handshake(tls).await.unwrap();
    tokio::spawn(conn);
    let mut client = client.ready().await.unwrap();
    for (host, want) in [("admin.example", 400), ("www.example", 200)] {
        let req = http::Request::builder()
            .uri("https://www.example/")
            .header("host", host)
            .body(())
            .unwrap();
        let (resp, _) = client.send_request(req, true).unwrap();
        let status = resp.await.map(|r| r.status().as_u16()).unwrap_or(0);
        // h2 itself may refuse the stream (a reset) instead of the gateway's 400.
        assert!(
            status == want || (want == 400 && status == 0),
            "{host}: {status}"
        );
        client = client.ready().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h2c_and_unlisted_upgrades_are_not_passed_and_unasked_switches_are_refused() {
    // An upstream that switches to whatever it is asked (or even when not asked).
    let (up, seen) = raw_upstream(|head| {
        let _ = head;
        Some(
            b"HTTP/1.1 101 Switching Protocols\r\nconnection: upgrade\r\nupgrade: h2c\r\n\r\n"
                .to_vec(),
        )
    })
    .await;
    let fx = gateway_before(up, "", "", "").await;
    let req = b"GET / HTTP/1.1\r\nHost: localhost\r\nConnection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAAQCAAAAAAIAAAAA\r\n\r\n";
    assert_eq!(
        raw_status(&fx, req).await,
        502,
        "an unasked switch is a bad gateway"
    );
    let head = seen.lock().unwrap()[0].to_ascii_lowercase();
    assert!(
        !head.contains("upgrade"),
        "the h2c upgrade went upstream: {head}"
    );
    assert!(!head.contains("http2-settings"), "{head}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trace_other_codings_and_contradictory_framing_are_handled() {
    let (up, seen) = raw_upstream(|_| {
        Some(
            b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\ntransfer-encoding: chunked\r\n\r\n3\r\nok\n\r\n0\r\n\r\n"
                .to_vec(),
        )
    })
    .await;
    let fx = gateway_before(up, "", "", "").await;
    assert_eq!(
        raw_status(&fx, b"TRACE / HTTP/1.1\r\nHost: localhost\r\n\r\n").await,
        405
    );
    let gz =
        b"POST / HTTP/1.1\r\nHost: localhost\r\nTransfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n";
    assert_eq!(raw_status(&fx, gz).await, 501);
    assert!(
        seen.lock().unwrap().is_empty(),
        "{:?}",
        seen.lock().unwrap()
    );
    // Both Content-Length and chunked from the upstream: the length is not passed on.
    let out = stdout(&run(curl(&fx, &["-si", &fx.url("/")])).await);
    assert!(out.starts_with("HTTP/2 200"), "{out}");
    assert!(
        !out.to_ascii_lowercase().contains("content-length: 100"),
        "{out}"
    );
    assert!(out.ends_with("ok\n"), "{out}");
}

/// Reads until the server closes the connection; the time it took, or `None` past `limit`.
async fn closed_within<S: tokio::io::AsyncRead + Unpin>(
    s: &mut S,
    limit: Duration,
) -> Option<Duration> {
    let t = Instant::now();
    let mut buf = [0u8; 1024];
    tokio::time::timeout(limit, async {
        loop {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    })
    .await
    .ok()
    .map(|_| t.elapsed())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_and_idle_connections_are_closed_pings_or_not() {
    let fx = start(
        "",
        "[listeners.limits]\nfirst_request_timeout = \"1s\"\nidle_timeout = \"2s\"",
    )
    .await;
    // After the handshake, no request: closed at the first-request limit.
    for alpn in [&b"\x08http/1.1"[..], b"\x02h2"] {
        let mut tls = tls_to(&fx, alpn).await;
        let took = closed_within(&mut tls, Duration::from_secs(6)).await;
        assert!(
            took.is_some_and(|t| t < Duration::from_secs(4)),
            "{alpn:?}: {took:?}"
        );
    }
    // HTTP/2 with a request, then PINGs every 300 ms: closed once idle for 2 s regardless.
    let tls = tls_to(&fx, b"\x02h2").await;
    let (client, mut conn) = h2::client::handshake(tls).await.unwrap();
    let mut ping = conn.ping_pong().unwrap();
    let done = tokio::spawn(async move {
        let t = Instant::now();
        let _ = conn.await;
        t.elapsed()
    });
    let mut client = client.ready().await.unwrap();
    let (resp, _) = client
        .send_request(http::Request::get(fx.url("/")).body(()).unwrap(), true)
        .unwrap();
    assert_eq!(resp.await.unwrap().status(), 200);
    let pinger = tokio::spawn(async move {
        for _ in 0..30 {
            if ping.ping(h2::Ping::opaque()).await.is_err() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    });
    let lived = tokio::time::timeout(Duration::from_secs(8), done)
        .await
        .expect("an idle HTTP/2 connection kept open by PINGs")
        .unwrap();
    assert!(lived < Duration::from_secs(5), "{lived:?}");
    pinger.abort();
    let text = fx.gw().metrics.render();
    assert!(
        metric_sum(
            &text,
            "rampart_connections_closed_total",
            &["reason=\"no_request\""]
        ) >= 2.0
    );
    assert!(
        metric_sum(
            &text,
            "rampart_connections_closed_total",
            &["reason=\"idle\""]
        ) >= 1.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_control_frame_flood_closes_the_connection() {
    let fx = start("", "[listeners.limits]\nmax_control_frames_per_second = 10").await;
    let mut tls = tls_to(&fx, b"\x02h2").await;
    let mut flood = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    flood.extend_from_slice(&[0, 0, 0, 4, 0, 0, 0, 0, 0]); // SETTINGS, empty
    for _ in 0..5_000 {
        flood.extend_from_slice(&[0, 0, 8, 6, 0, 0, 0, 0, 0]); // PING
        flood.extend_from_slice(&[1, 2, 3, 4, 5, 6, 7, 8]);
    }
    // The server may close while we still write: a failed write is the expected outcome too.
    let _ = tls.write_all(&flood).await;
    let took = closed_within(&mut tls, Duration::from_secs(5)).await;
    assert!(took.is_some(), "a PING flood was answered without end");
    let text = fx.gw().metrics.render();
    assert_eq!(
        metric_sum(
            &text,
            "rampart_connections_closed_total",
            &["reason=\"control_flood\""]
        ),
        1.0
    );
    // Other clients are served.
    assert_eq!(curl_status(&fx, &[&fx.url("/")]).await, "200");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_request_body_times_out_and_frees_its_slot() {
    let fx = start("", "[listeners.limits]\nbody_timeout = \"1s\"").await;
    // A small body is buffered before any upstream is picked: trickling it holds no slot.
    // A large one streams, holding a slot until it stalls past the timeout.
    for (len, slot_held) in [(100, false), (1_000_000, true)] {
        let mut tls = tls_to(&fx, b"\x08http/1.1").await;
        let head =
            format!("POST /discard HTTP/1.1\r\nHost: localhost\r\nContent-Length: {len}\r\n\r\nx");
        tls.write_all(head.as_bytes()).await.unwrap();
        if slot_held {
            eventually_metric(&fx, "rampart_upstream_requests_in_flight", &[], 1.0).await;
        } else {
            tokio::time::sleep(Duration::from_millis(300)).await;
            let m = fx.gw().metrics.render();
            let held = metric_sum(&m, "rampart_upstream_requests_in_flight", &[]);
            assert_eq!(held, 0.0, "{len}: a slot held while a small body trickles");
        }
        let t = Instant::now();
        let text = read_head(&mut tls, Duration::from_secs(6)).await;
        assert!(text.starts_with("HTTP/1.1 408"), "{len}: {text:?}");
        assert!(t.elapsed() < Duration::from_secs(4), "{:?}", t.elapsed());
        let m = fx.gw().metrics.render();
        assert_eq!(
            metric_sum(&m, "rampart_upstream_requests_in_flight", &[]),
            0.0,
            "{len}: slot back"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_client_gets_no_more_than_its_share_of_a_clusters_slots() {
    let fx = start("max_requests = 8\nmax_requests_per_client = 2", "").await;
    let url = fx.url("/delay/3000");
    let args = ["--http1.1", url.as_str()];
    let statuses = futures_util::future::join_all((0..3).map(|_| curl_status(&fx, &args))).await;
    let mut sorted = statuses.clone();
    sorted.sort();
    assert_eq!(sorted, vec!["200", "200", "429"], "{statuses:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_that_stalls_mid_body_is_cut_and_frees_its_slot() {
    // Headers and the first bytes of a 1,000-byte body, then nothing.
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let stalling = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                let _ = s.read(&mut buf).await;
                let _ = s
                    .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 1000\r\n\r\npartial")
                    .await;
                tokio::time::sleep(Duration::from_secs(30)).await;
            });
        }
    });
    let fx = gateway_before(stalling, "body_timeout = \"1s\"", "", "").await;
    let t = Instant::now();
    let out = run(curl(
        &fx,
        &[
            "-s",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
            "--max-time",
            "8",
            &fx.url("/"),
        ],
    ))
    .await;
    assert!(
        !out.status.success(),
        "a cut body is an error for the client"
    );
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    let m = fx.gw().metrics.render();
    assert_eq!(
        metric_sum(&m, "rampart_upstream_requests_in_flight", &[]),
        0.0
    );
    assert_eq!(
        metric_sum(&m, "rampart_upstream_errors_total", &["kind=\"body\""]),
        1.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_its_memory_limit_the_gateway_stops_accepting_and_serves_those_admitted() {
    // A limit below what the process already holds: every action turns on at the first
    // reading. The next reading is an hour away, so the test then sets memory itself.
    let fx = start_edited("", |text, _| {
        text.replace(
            "[server]\n",
            "[server]\noverload = { memory_limit_bytes = 16777216, check_interval = \"1h\" }\n",
        )
    })
    .await;
    let m = eventually_metric(
        &fx,
        "rampart_overload_action_active",
        &["action=\"stop_accepting\""],
        1.0,
    )
    .await;
    for action in [
        "retry_all_initials",
        "refuse_early_data",
        "shrink_windows",
        "close_idle_connections",
    ] {
        let label = format!("action=\"{action}\"");
        assert_eq!(
            metric_sum(&m, "rampart_overload_action_active", &[&label]),
            1.0,
            "{m}"
        );
    }
    assert!(
        metric_sum(&m, "rampart_process_memory_bytes", &[]) > 16777216.0,
        "{m}"
    );
    assert_ne!(
        curl_status(&fx, &[&fx.url("/")]).await,
        "200",
        "accepted past the limit"
    );

    // Below the limit: a client is admitted on a kept-open HTTP/2 connection.
    let overload = &fx.gw().overload;
    overload.observe(1 << 20);
    let tls = tls_to(&fx, b"\x02h2").await;
    let (client, conn) = h2::client::handshake(tls).await.unwrap();
    tokio::spawn(conn);
    let mut client = client.ready().await.unwrap();
    // Over it again: new connections are shed and counted, the admitted one is served.
    overload.observe(15 << 20);
    assert_ne!(curl_status(&fx, &[&fx.url("/")]).await, "200");
    let m = fx.gw().metrics.render();
    let shed = metric_sum(
        &m,
        "rampart_connections_rejected_total",
        &["listener=\"https\""],
    );
    assert!(shed >= 2.0, "{m}");
    let (resp, _) = client
        .send_request(http::Request::get(fx.url("/")).body(()).unwrap(), true)
        .unwrap();
    assert_eq!(resp.await.unwrap().status(), 200, "the admitted client");
    assert_eq!(
        metric_sum(
            &m,
            "rampart_overload_actions_total",
            &["action=\"stop_accepting\""]
        ),
        2.0,
        "{m}"
    );
    // Past 95%: the admitted connection is told to go away (GOAWAY). Its request in flight
    // finishes; it takes no new one.
    let mut client = client.ready().await.unwrap();
    let (slow, _) = client
        .send_request(
            http::Request::get(fx.url("/delay/1000")).body(()).unwrap(),
            true,
        )
        .unwrap();
    eventually_metric(&fx, "rampart_upstream_requests_in_flight", &[], 1.0).await;
    overload.observe(31 << 19); // 15.5 MiB: 97%
    assert_eq!(
        slow.await.unwrap().status(),
        200,
        "in flight when GOAWAY came"
    );
    let refused = match client.ready().await {
        Err(_) => true,
        Ok(mut c) => {
            match c.send_request(http::Request::get(fx.url("/")).body(()).unwrap(), true) {
                Err(_) => true,
                Ok((resp, _)) => resp.await.is_err(),
            }
        }
    };
    assert!(refused, "a new request on a connection told to go away");
    // Released 5 points below the threshold: served again.
    overload.observe(13 << 20);
    assert_eq!(curl_status(&fx, &[&fx.url("/")]).await, "200");
    // Still above 80%: a new HTTP/2 connection may send only a small window of upload.
    let tls = tls_to(&fx, b"\x02h2").await;
    let (client, conn) = h2::client::handshake(tls).await.unwrap();
    tokio::spawn(conn);
    let mut client = client.ready().await.unwrap();
    // The server's SETTINGS (its windows) are read once it has offered extended CONNECT.
    for _ in 0..100 {
        if client.is_extended_connect_protocol_enabled() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let req = http::Request::post(fx.url("/discard")).body(()).unwrap();
    let (_resp, mut upload) = client.send_request(req, false).unwrap();
    upload.reserve_capacity(1 << 20);
    let granted = tokio::time::timeout(Duration::from_secs(2), async {
        loop {
            match futures_util::future::poll_fn(|cx| upload.poll_capacity(cx)).await {
                Some(Ok(n)) if n > 0 => return n,
                Some(Ok(_)) => continue,
                other => panic!("no capacity: {other:?}"),
            }
        }
    })
    .await
    .expect("some capacity");
    assert!(
        granted <= 16 * 1024,
        "a {granted}-byte window under pressure"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_the_cap_an_idle_connection_makes_room_and_a_busy_one_does_not() {
    // One worker: each worker evicts among its own connections.
    let fx = start_edited("[listeners.limits]\nmax_connections = 2", |text, _| {
        text.replace("[server]\n", "[server]\nworker_threads = 1\n")
    })
    .await;
    // Two clients hold idle connections (handshake done, no request): a third is served.
    let mut idle = [
        tls_to(&fx, b"\x08http/1.1").await,
        tls_to(&fx, b"\x08http/1.1").await,
    ];
    assert_eq!(curl_status(&fx, &["--http1.1", &fx.url("/")]).await, "200");
    let m = fx.gw().metrics.render();
    assert_eq!(
        metric_sum(
            &m,
            "rampart_connections_closed_total",
            &["reason=\"evicted\""]
        ),
        1.0,
        "{m}"
    );
    // The oldest idle one was closed.
    assert!(closed_within(&mut idle[0], Duration::from_secs(2))
        .await
        .is_some());
    // Two requests in flight hold both places: a third client is refused.
    drop(idle);
    let url = fx.url("/delay/3000");
    let busy = ["--http1.1", url.as_str()];
    let (a, b, c) = tokio::join!(curl_status(&fx, &busy), curl_status(&fx, &busy), async {
        eventually_metric(&fx, "rampart_upstream_requests_in_flight", &[], 2.0).await;
        curl_status(&fx, &["--http1.1", &fx.url("/")]).await
    });
    assert_eq!((a.as_str(), b.as_str()), ("200", "200"));
    assert_ne!(c, "200", "a busy connection was evicted");
}

/// Moves this thread (and what it starts from now on: runtime threads, the gateway's
/// workers, curl) into a network namespace of its own, with loopback up holding the given
/// IPv6 addresses too (clients' sources). `false` without the privileges for it.
fn own_network_namespace(addresses: &[&str]) -> bool {
    // SAFETY: unshare takes flags only; with CLONE_NEWNET it moves the calling thread alone
    // into a new network namespace (or fails, changing nothing).
    if unsafe { libc::unshare(libc::CLONE_NEWNET) } != 0 {
        return false;
    }
    let ip = |args: &[&str]| {
        let ok = std::process::Command::new("ip")
            .args(args)
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "ip {args:?}");
    };
    ip(&["link", "set", "lo", "up"]);
    for a in addresses {
        ip(&[
            "-6",
            "addr",
            "add",
            &format!("{a}/128"),
            "dev",
            "lo",
            "nodad",
        ]);
    }
    true
}

/// An IPv6 client holds a whole /64 and can send from any of its addresses: per-client limits
/// count it by its prefix (`limits.client_ipv6_prefix`, 64), so moving to another address
/// of the same /64 gets no fresh share, while a client of another /64 keeps its own. Shown
/// with a route's rate limit and the listener's `new_connections_per_address`, from real
/// source addresses in a network namespace of the test's own.
#[test]
fn an_ipv6_client_is_counted_by_its_prefix_not_each_address() {
    let sources = [
        "2001:db8:7::a",
        "2001:db8:7::b",
        "2001:db8:7:0:ffff::c",
        "2001:db8:7::d",
        "2001:db8:8::a",
    ];
    if !own_network_namespace(&sources) {
        eprintln!("skipped: a network namespace needs CAP_SYS_ADMIN");
        return;
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let fx = start_edited(
            "limits.new_connections_per_address = { per_second = 0.01, burst = 3 }",
            |text, _| {
                text.replace(
                    "name = \"https\"\nlisten = \"127.0.0.1:0\"",
                    "name = \"https\"\nlisten = \"[::]:0\"",
                )
                .replace(
                    "[[routes]]\ncluster = \"app\"",
                    "[[routes]]\ncluster = \"app\"\nrate_limit = { per_second = 0.01, burst = 2 }",
                )
            },
        )
        .await;
        let url = format!("https://localhost:{}/", fx.port());
        let resolve = format!("localhost:{}:[::1]", fx.port());
        let from = |source: &str| {
            let mut c = tokio::process::Command::new("curl");
            c.args(["-sS", "--insecure", "--max-time", "10", "-o", "/dev/null"])
                .args(["-w", "%{http_code}", "--resolve", &resolve])
                .args(["--interface", source, &url]);
            c
        };
        let status = |source: &'static str| {
            let mut c = from(source);
            async move { stdout(&c.output().await.unwrap()) }
        };
        // Two requests a client: the second address of the /64 is the same client.
        assert_eq!(status("2001:db8:7::a").await, "200");
        assert_eq!(status("2001:db8:7::b").await, "200");
        assert_eq!(status("2001:db8:7:0:ffff::c").await, "429", "same /64");
        assert_eq!(status("2001:db8:8::a").await, "200", "another /64");
        // Three connections a client: the fourth, from yet another address of the first
        // /64, is turned away before its handshake.
        let refused = status("2001:db8:7::d").await;
        assert_eq!(refused, "000", "connection refused: {refused}");
        let m = fx.gw().metrics.render();
        assert_eq!(
            metric_sum(&m, "rampart_connections_rate_limited_total", &[]),
            1.0,
            "{m}"
        );
    });
}

/// `limits.max_connections_per_address`: one address holds at most its share of open
/// connections (here 3, held mid-handshake as a slow client would); a fourth is closed before
/// its handshake and counted, while another address (127.0.0.2) is served, and a connection
/// given back makes room again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_address_holds_at_most_its_share_of_connections() {
    let fx = start_edited("limits.max_connections_per_address = 3", |text, _| text).await;
    let addr = format!("127.0.0.1:{}", fx.port());
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(tokio::net::TcpStream::connect(&addr).await.unwrap());
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut fourth = tokio::net::TcpStream::connect(&addr).await.unwrap();
    let mut buf = [0u8; 1];
    let read = tokio::time::timeout(Duration::from_secs(5), fourth.read(&mut buf)).await;
    assert_eq!(read.expect("closed at once").unwrap_or(0), 0, "closed");
    let other = curl_status(&fx, &["--interface", "127.0.0.2", &fx.url("/")]).await;
    assert_eq!(other, "200", "another address");
    drop(held.pop());
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(curl_status(&fx, &[&fx.url("/")]).await, "200", "room again");
    let m = fx.gw().metrics.render();
    assert_eq!(
        metric_sum(&m, "rampart_connections_over_share_total", &[]),
        1.0,
        "{m}"
    );
}
