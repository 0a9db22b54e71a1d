//! Reverse-proxy behaviour against real upstreams with curl: failures, timeouts, limits,
//! retries, streaming, request ids, graceful shutdown.

mod common;
use common::*;
use std::time::{Duration, Instant};

/// A loopback port with nothing listening.
fn dead_port() -> std::net::SocketAddr {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap()
}

/// A gateway whose cluster has a dead endpoint first, then a live demo upstream.
async fn start_with_a_dead_endpoint(cluster_extra: &str) -> Fixture {
    let upstream = gateway::demo::spawn_upstream("127.0.0.1:0".parse().unwrap(), None)
        .await
        .unwrap();
    let dead = dead_port();
    let dir = tempfile::tempdir().unwrap();
    make_certs(dir.path());
    let text = config_text(&[dead, upstream], cluster_extra, "");
    start_with(&text, dir, upstream, None).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_down_gives_502() {
    let dir = tempfile::tempdir().unwrap();
    make_certs(dir.path());
    let dead = dead_port();
    let text = log_to_file(config_text(&[dead], "", ""), dir.path());
    let fx = start_with(&text, dir, dead, None).await;
    let out = stdout(&run(curl(&fx, &["-w", "%{http_code}", &fx.url("/")])).await);
    assert_eq!(out, "upstream connect failed\n502");
    // The access log says whose fault it was.
    assert_eq!(access_log(&fx, 1).await[0]["fault"], "upstream");
    let m = fx.gw().metrics.render();
    assert_eq!(
        metric_sum(&m, "rampart_upstream_errors_total", &["kind=\"connect\""]),
        1.0
    );
    assert_eq!(
        metric_sum(&m, "rampart_http_requests_total", &["status=\"502\""]),
        1.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_upstream_gives_504_within_read_timeout() {
    let fx = start("read_timeout = \"300ms\"", "").await;
    let t = Instant::now();
    let out = stdout(&run(curl(&fx, &["-w", "%{http_code}", &fx.url("/delay/3000")])).await);
    let took = t.elapsed();
    assert_eq!(out, "upstream timed out\n504");
    assert!(
        took >= Duration::from_millis(300) && took < Duration::from_millis(2500),
        "{took:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_connect_is_retried_on_another_endpoint_for_any_method() {
    // Passive health off, or the dead endpoint would be passed over after its first failure.
    let fx = start_with_a_dead_endpoint("max_fails = 0").await;
    for _ in 0..4 {
        let out = stdout(
            &run(curl(
                &fx,
                &["-w", "%{http_code}", "-o", "/dev/null", &fx.url("/")],
            ))
            .await,
        );
        assert_eq!(out, "200", "GET goes to the live endpoint on retry");
    }
    // A POST with a body goes again too: a failed connect sent none of it (the request's
    // body comes back whole), so repeating it cannot repeat its effect.
    let mut codes = Vec::new();
    for _ in 0..2 {
        codes.push(stdout(
            &run(curl(
                &fx,
                &[
                    "-w",
                    "%{http_code}",
                    "-o",
                    "/dev/null",
                    "-d",
                    "x",
                    &fx.url("/echo"),
                ],
            ))
            .await,
        ));
    }
    assert!(codes.iter().all(|c| c == "200"), "{codes:?}");
    let m = fx.gw().metrics.render();
    assert!(
        metric_sum(
            &m,
            "rampart_upstream_retries_total",
            &["reason=\"connect\""]
        ) >= 1.0,
        "{m}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn header_and_body_limits_give_431_and_413() {
    let fx = start(
        "",
        "[listeners.limits]\nmax_headers = 20\nmax_header_bytes = 2048\nmax_body_bytes = 1000",
    )
    .await;
    let big = format!("X-Big: {}", "a".repeat(4000));
    let many: Vec<String> = (0..30).map(|i| format!("X-H{i}: v")).collect();
    let body = "b".repeat(5000);
    for http in ["--http1.1", "--http2"] {
        let url = fx.url("/");
        assert_eq!(
            curl_status(&fx, &[http, "-H", &big, &url]).await,
            "431",
            "{http} header bytes"
        );
        let mut args = vec![http];
        for h in &many {
            args.extend(["-H", h.as_str()]);
        }
        args.push(&url);
        assert_eq!(curl_status(&fx, &args).await, "431", "{http} header count");
        let echo = fx.url("/echo");
        let code = curl_status(&fx, &[http, "--data-binary", &body, &echo]).await;
        assert_eq!(code, "413", "{http} content-length over limit");
    }
    // Chunked (no content-length): the limit trips while streaming.
    let body_file = fx.dir.path().join("body");
    std::fs::write(&body_file, vec![b'c'; 50_000]).unwrap();
    let arg = format!("@{}", body_file.display());
    let out = stdout(
        &run(curl(
            &fx,
            &[
                "--http1.1",
                "-H",
                "Transfer-Encoding: chunked",
                "-o",
                "/dev/null",
                "-w",
                "%{http_code}",
                "--data-binary",
                &arg,
                &fx.url("/echo"),
            ],
        ))
        .await,
    );
    assert_eq!(out, "413", "chunked body over limit");
    // Under the limit works.
    let out = stdout(&run(curl(&fx, &["--data-binary", "small", &fx.url("/echo")])).await);
    assert_eq!(out, "small");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_id_is_kept_or_generated_and_sent_upstream() {
    let fx = start("", "").await;
    let out = stdout(
        &run(curl(
            &fx,
            &[
                "--http1.1",
                "-H",
                "X-Request-Id: abc-123",
                "-H",
                "Connection: x-drop",
                "-H",
                "X-Drop: 1",
                &fx.url("/headers"),
            ],
        ))
        .await,
    );
    assert!(out.contains("\"x-request-id\": \"abc-123\""), "{out}");
    assert!(
        !out.contains("x-drop"),
        "hop-by-hop headers stripped: {out}"
    );
    let out = stdout(&run(curl(&fx, &["-D", "-", &fx.url("/headers")])).await);
    let id = out
        .lines()
        .find_map(|l| l.strip_prefix("x-request-id: "))
        .expect("response carries a request id")
        .trim()
        .to_string();
    assert_eq!(id.len(), 32);
    assert!(
        out.contains(&format!("\"x-request-id\": \"{id}\"")),
        "same id upstream: {out}"
    );
}

/// HEAD gets GET's status and headers and no body, over HTTP/1.1 and HTTP/2 (curl -I).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn head_requests_get_the_headers_without_a_body() {
    let fx = start("", "").await;
    for proto in ["--http1.1", "--http2"] {
        let out = run(curl(&fx, &[proto, "-I", &fx.url("/bytes/123456")])).await;
        let head = stdout(&out).to_ascii_lowercase();
        assert!(head.starts_with("http/"), "{proto}: {head}");
        assert!(
            head.lines().next().unwrap().contains(" 200"),
            "{proto}: {head}"
        );
        assert!(head.contains("content-length: 123456"), "{proto}: {head}");
        assert!(out.status.success(), "{proto}: curl did not finish cleanly");
    }
    let m = fx.gw().metrics.render();
    assert_eq!(
        metric_sum(&m, "rampart_http_requests_total", &["status=\"200\""]),
        2.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_body_streams_both_ways_without_buffering() {
    let fx = start("", "").await;
    const SIZE: u64 = 200 * 1024 * 1024;
    let rss = RssPeak::start();
    // Upload 200 MB (chunked, from a pipe) to /echo; the echo streams it straight back.
    let mut cmd = std::process::Command::new("sh");
    let port = fx.port();
    cmd.arg("-c").arg(format!(
        "head -c {SIZE} /dev/zero | curl -sS --insecure --http1.1 --max-time 120 --resolve localhost:{port}:127.0.0.1 -T - -X POST -H 'Transfer-Encoding: chunked' -o /dev/null -w '%{{http_code}} %{{size_upload}} %{{size_download}}' https://localhost:{port}/echo"
    ));
    let out = stdout(&run(cmd).await);
    // And download 200 MB.
    let down = stdout(
        &run(curl(
            &fx,
            &[
                "-o",
                "/dev/null",
                "-w",
                "%{http_code} %{size_download}",
                &fx.url(&format!("/bytes/{SIZE}")),
            ],
        ))
        .await,
    );
    // size_upload counts chunk framing too: check the echoed download exactly.
    let f: Vec<u64> = out.split(' ').map(|x| x.parse().unwrap()).collect();
    assert_eq!((f[0], f[2]), (200, SIZE), "{out}");
    assert!(f[1] >= SIZE, "{out}");
    assert_eq!(down, format!("200 {SIZE}"));
    let grew_mib = rss.grew_mib();
    assert!(
        grew_mib < 64,
        "RSS grew {grew_mib} MiB while streaming 2 x 200 MB"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn graceful_shutdown_finishes_in_flight_requests() {
    let mut fx = start("", "").await;
    let slow = curl(&fx, &["-w", "%{http_code}", &fx.url("/delay/1500")]);
    let in_flight = tokio::spawn(run(slow));
    // Time for curl to start, connect and send its request on a loaded 2-core CI machine;
    // the request is still upstream for another 700 ms or more when shutdown starts.
    tokio::time::sleep(Duration::from_millis(800)).await;
    let addr = fx.addr();
    let gw = fx.gw.take().unwrap();
    let done = tokio::spawn(gw.shutdown());
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(
        tokio::net::TcpStream::connect(addr).await.is_err(),
        "no new connections after shutdown starts"
    );
    let out = stdout(&in_flight.await.unwrap());
    assert_eq!(out, "slept 1500 ms\n200");
    assert!(
        done.await.unwrap(),
        "shutdown completed within the grace period"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h2c_upstream_cluster_and_least_request() {
    let fx = start("protocol = \"h2c\"\nlb = \"least_request\"", "").await;
    let out = stdout(&run(curl(&fx, &["--http1.1", &fx.url("/headers")])).await);
    assert!(out.contains("\"via\": \"1.1 rampart\""), "{out}");
    let body = stdout(&run(curl(&fx, &["--data-binary", "over h2c", &fx.url("/echo")])).await);
    assert_eq!(body, "over h2c");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_access_log_file_is_reopened_after_logrotate_renames_it() {
    let fx = start_logged("").await;
    let status = curl_status(&fx, &["--http1.1", &fx.url("/bytes/1")]).await;
    assert_eq!(status, "200");
    assert_eq!(access_log(&fx, 1).await[0]["path"], "/bytes/1");
    let log = fx.dir.path().join("access.log");
    let rotated = fx.dir.path().join("access.log.1");
    std::fs::rename(&log, &rotated).unwrap();
    assert!(fx.gw().reopen_access_log());
    let status = curl_status(&fx, &["--http1.1", &fx.url("/bytes/2")]).await;
    assert_eq!(status, "200");
    let fresh = access_log(&fx, 1).await;
    assert_eq!(fresh.len(), 1, "{fresh:?}");
    assert_eq!(fresh[0]["path"], "/bytes/2");
    let old = std::fs::read_to_string(&rotated).unwrap();
    assert_eq!(old.lines().count(), 1, "{old}");
    assert!(old.contains("\"/bytes/1\""), "{old}");
    // Nothing to reopen when the log is off.
    let off = start("", "").await;
    assert!(!off.gw().reopen_access_log());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn access_log_writes_one_json_line_per_request() {
    let fx = start_logged("").await;
    let _ = run(curl(
        &fx,
        &[
            "--http1.1",
            "-H",
            "X-Request-Id: log-me",
            "--data-binary",
            "12345",
            &fx.url("/echo"),
        ],
    ))
    .await;
    let _ = run(curl(&fx, &["--http2", &fx.url("/bytes/10")])).await;
    let lines = access_log(&fx, 2).await;
    let first = &lines[0];
    assert_eq!(first["request_id"], "log-me");
    assert_eq!(first["status"], 200);
    assert_eq!(first["bytes_in"], 5);
    assert_eq!(first["bytes_out"], 5);
    assert_eq!(first["sni"], "localhost");
    assert_eq!(first["tls_version"], "TLSv1.3");
    assert_eq!(first["protocol"], "http/1.1");
    assert_eq!(first["upstream"], fx.upstream.to_string());
    assert_eq!(first["route"], "*/");
    assert!(first["client"].as_str().unwrap().starts_with("127.0.0.1:"));
    let second = &lines[1];
    assert_eq!(second["protocol"], "h2");
    assert_eq!(second["bytes_out"], 10);
    assert!(second["duration_ms"].as_f64().unwrap() >= 0.0);
    // `fault` is written only for a request that failed.
    assert!(first.get("fault").is_none() && second.get("fault").is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_gateway_on_the_same_port_is_refused() {
    let fx = start("", "").await;
    let port = fx.port();
    let text = config_text(&[fx.upstream], "", "").replace(
        "name = \"https\"\nlisten = \"127.0.0.1:0\"",
        &format!("name = \"https\"\nlisten = \"127.0.0.1:{port}\""),
    );
    assert!(text.contains(&format!("127.0.0.1:{port}")));
    let path = fx.dir.path().join("second.toml");
    std::fs::write(&path, text).unwrap();
    let cfg = gateway::config::Config::load(&path).unwrap();
    let err = gateway::start(cfg, Default::default())
        .await
        .err()
        .expect("second gateway must not start");
    assert!(format!("{err:#}").contains("already in use"), "{err:#}");
    // The first keeps serving every connection.
    for _ in 0..10 {
        let code = curl_status(&fx, &[&fx.url("/")]).await;
        assert_eq!(code, "200");
    }
}

/// The gateway holds a response's TLS records until hyper flushes and sends them together
/// (`SendCoalescer`). A streamed response must still go out piece by piece: each chunk sent
/// to `/echo` has to come back before the client sends the next one, or this test stalls.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streamed_chunks_are_sent_without_waiting_for_more() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let fx = start("", "").await;
    let mut b = boring::ssl::SslConnector::builder(boring::ssl::SslMethod::tls()).unwrap();
    b.set_verify(boring::ssl::SslVerifyMode::NONE);
    b.set_alpn_protos(b"\x08http/1.1").unwrap();
    let tcp = tokio::net::TcpStream::connect(fx.addr()).await.unwrap();
    let cfg = b.build().configure().unwrap();
    let mut tls = tokio_boring::connect(cfg, "localhost", tcp).await.unwrap();
    tls.write_all(b"POST /echo HTTP/1.1\r\nHost: localhost\r\nTransfer-Encoding: chunked\r\n\r\n")
        .await
        .unwrap();
    let mut seen = Vec::new();
    for i in 0..5 {
        let piece = format!("ping-{i}");
        tls.write_all(format!("{:x}\r\n{piece}\r\n", piece.len()).as_bytes())
            .await
            .unwrap();
        tls.flush().await.unwrap();
        let came_back = tokio::time::timeout(Duration::from_secs(5), async {
            let mut buf = [0u8; 4096];
            while !String::from_utf8_lossy(&seen).contains(&piece) {
                let n = tls.read(&mut buf).await.unwrap();
                assert!(
                    n > 0,
                    "connection closed after {}",
                    String::from_utf8_lossy(&seen)
                );
                seen.extend_from_slice(&buf[..n]);
            }
        })
        .await;
        assert!(
            came_back.is_ok(),
            "chunk {i} not echoed; received so far: {}",
            String::from_utf8_lossy(&seen)
        );
    }
    assert!(String::from_utf8_lossy(&seen).starts_with("HTTP/1.1 200"));
}

/// The demo upstream's `/discard` (the upload benchmarks' sink) counts a proxied request body,
/// over HTTP/1.1 and HTTP/2.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn discard_counts_an_uploaded_body() {
    let fx = start("", "").await;
    for http in ["--http1.1", "--http2"] {
        let mut cmd = std::process::Command::new("sh");
        let port = fx.port();
        cmd.arg("-c").arg(format!(
            "head -c 3000000 /dev/zero | curl -sS --insecure {http} --max-time 20 --resolve localhost:{port}:127.0.0.1 --data-binary @- https://localhost:{port}/discard"
        ));
        assert_eq!(stdout(&run(cmd).await).trim(), "3000000", "{http}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_response_cut_short_upstream_fails_for_the_client_instead_of_ending_short() {
    let (fx, _ended) = start_with_faulty_upstream("").await;
    for (proto, flag) in [("h1", "--http1.1"), ("h2", "--http2")] {
        let out = run(curl(
            &fx,
            &[
                flag,
                "-o",
                "/dev/null",
                "-w",
                "%{http_code} %{size_download}",
                &fx.url(CUT_PATH),
            ],
        ))
        .await;
        let got = stdout(&out);
        // The status line went out before the body failed; what must not happen is a clean end.
        assert!(
            !out.status.success(),
            "{proto}: curl saw a complete response: {got}"
        );
        let (status, size) = got.split_once(' ').unwrap();
        assert_eq!(status, "200", "{proto}");
        let size: usize = size.parse().unwrap();
        assert!(size <= CUT_SENT, "{proto}: {size} bytes");
        // The listener goes on serving.
        assert_eq!(
            curl_status(&fx, &[flag, &fx.url("/bytes/1000")]).await,
            "200",
            "{proto}"
        );
    }
    let m = fx.gw().metrics.render();
    let body_errors = &["cluster=\"faulty\"", "kind=\"body\""];
    assert_eq!(
        metric_sum(&m, "rampart_upstream_errors_total", body_errors),
        2.0,
        "{m}"
    );
    // Each line is written when its body ends, so only each path's word is certain.
    for r in access_log(&fx, 4).await {
        let want = if r["path"] == CUT_PATH {
            "upstream_error"
        } else {
            "complete"
        };
        assert_eq!(r["response_end"], want, "{r}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_leaving_mid_download_frees_its_upstream_connection() {
    let (fx, mut ended) = start_with_faulty_upstream("").await;
    for (proto, flag) in [("h1", "--http1.1"), ("h2", "--http2")] {
        // curl gives up after a second of an endless body (exit 28), as a client closing a
        // tab would.
        let out = run(curl(
            &fx,
            &[
                flag,
                "--max-time",
                "1",
                "-o",
                "/dev/null",
                &fx.url(ENDLESS_PATH),
            ],
        ))
        .await;
        assert_eq!(out.status.code(), Some(28), "{proto}: {out:?}");
        assert!(
            next_report(&mut ended).await == Some(FaultReport::EndlessClosed),
            "{proto}: the upstream connection was still open 5 s after the client left"
        );
    }
    let m = fx.gw().metrics.render();
    assert_eq!(
        metric_sum(&m, "rampart_http_responses_abandoned_total", &[]),
        2.0,
        "{m}"
    );
    assert_eq!(
        metric_sum(&m, "rampart_upstream_errors_total", &[]),
        0.0,
        "{m}"
    );
    for r in access_log(&fx, 2).await {
        assert_eq!(r["response_end"], "abandoned", "{r}");
    }
}

/// `GET /headers` over a fresh connection that starts with `preface`: the headers the
/// upstream saw, or the error.
async fn headers_after(fx: &Fixture, preface: &[u8]) -> Result<serde_json::Value, String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut tls = tls_after(fx, b"\x08http/1.1", preface).await?;
    tls.write_all(b"GET /headers HTTP/1.1\r\nhost: localhost\r\nconnection: close\r\n\r\n")
        .await
        .map_err(|e| e.to_string())?;
    let mut raw = Vec::new();
    let _ = tls.read_to_end(&mut raw).await;
    let text = String::from_utf8_lossy(&raw);
    let body = text
        .split("\r\n\r\n")
        .nth(1)
        .ok_or(format!("no response: {text}"))?;
    serde_json::from_str(body).map_err(|e| format!("{e}: {text}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_proxy_protocol_header_names_the_client_behind_a_balancer() {
    let fx = start_logged("proxy_protocol = true\ndeny = [\"192.0.2.0/24\"]").await;
    // Version 1, as curl sends it (the real addresses of the connection).
    let out = run(curl(
        &fx,
        &["--haproxy-protocol", "--http2", &fx.url("/headers")],
    ))
    .await;
    let h: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stderr)));
    assert_eq!(h["x-forwarded-for"], "127.0.0.1", "{h}");
    // Version 1 naming another client, then version 2 (TCP over IPv6, with a TLV).
    let h = headers_after(&fx, b"PROXY TCP4 198.51.100.7 127.0.0.1 40000 443\r\n")
        .await
        .unwrap();
    assert_eq!(h["x-forwarded-for"], "198.51.100.7", "{h}");
    let mut v2 = b"\r\n\r\n\0\r\nQUIT\n\x21\x21\x00\x28".to_vec();
    v2.extend_from_slice(
        &"2001:db8::42"
            .parse::<std::net::Ipv6Addr>()
            .unwrap()
            .octets(),
    );
    v2.extend_from_slice(&std::net::Ipv6Addr::LOCALHOST.octets());
    v2.extend_from_slice(&[0x9c, 0x40, 0x01, 0xbb, 0x04, 0x00, 0x01, 0xaa]);
    let h = headers_after(&fx, &v2).await.unwrap();
    assert_eq!(h["x-forwarded-for"], "2001:db8::42", "{h}");
    let log = access_log(&fx, 3).await;
    assert_eq!(log[1]["client"], "198.51.100.7:40000", "{log:?}");

    // The listener's access list applies to the client the header names.
    let denied = headers_after(&fx, b"PROXY TCP4 192.0.2.7 127.0.0.1 40000 443\r\n").await;
    assert!(denied.is_err(), "{denied:?}");
    // A connection without the header (a client bypassing the balancer) is closed.
    let bare = headers_after(&fx, b"").await;
    assert!(bare.is_err(), "{bare:?}");
    let garbled = headers_after(&fx, b"PROXY TCP4 not-an-address\r\n").await;
    assert!(garbled.is_err(), "{garbled:?}");
    let m = fx.gw().metrics.render();
    assert_eq!(
        metric_sum(&m, "rampart_connections_denied_total", &[]),
        1.0,
        "{m}"
    );
    assert_eq!(
        metric_sum(
            &m,
            "rampart_tls_handshake_errors_total",
            &["reason=\"proxy_protocol\""]
        ),
        2.0,
        "{m}"
    );
}

/// An HTTP/1.1 upload that stops midway: the request head, part of a chunk, then the
/// connection closes.
async fn h1_upload_then_close(fx: &Fixture, path: &str) {
    use tokio::io::AsyncWriteExt;
    let mut tls = tls_to(fx, b"\x08http/1.1").await;
    let head =
        format!("POST {path} HTTP/1.1\r\nhost: localhost\r\ntransfer-encoding: chunked\r\n\r\n");
    tls.write_all(head.as_bytes()).await.unwrap();
    tls.write_all(b"10000\r\n").await.unwrap();
    tls.write_all(&[b'u'; 30_000]).await.unwrap();
    tls.flush().await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
}

/// An HTTP/2 frame: length, type, flags, stream, payload.
fn h2_frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let mut f = (payload.len() as u32).to_be_bytes()[1..].to_vec();
    f.extend_from_slice(&[kind, flags]);
    f.extend_from_slice(&stream.to_be_bytes());
    f.extend_from_slice(payload);
    f
}

/// An HTTP/2 upload that stops midway, written frame by frame (curl cannot do this: when it
/// gives up it ends an upload with END_STREAM, as if whole): a POST on stream 1 without a
/// length, 48 KB of DATA, then either RST_STREAM(CANCEL) or GOAWAY(NO_ERROR) and a hang-up,
/// which is how a client closing its connection ends the streams it leaves open.
async fn h2_upload_then(fx: &Fixture, path: &str, goaway: bool) {
    use tokio::io::AsyncWriteExt;
    let mut tls = tls_to(fx, b"\x02h2").await;
    let mut out = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    out.extend(h2_frame(0x4, 0, 0, &[])); // SETTINGS
                                          // HPACK: each field a literal without indexing, new name, no Huffman coding.
    let mut block = Vec::new();
    for (n, v) in [
        (":method", "POST"),
        (":scheme", "https"),
        (":authority", "localhost"),
        (":path", path),
    ] {
        block.push(0x00);
        block.push(n.len() as u8);
        block.extend_from_slice(n.as_bytes());
        block.push(v.len() as u8);
        block.extend_from_slice(v.as_bytes());
    }
    out.extend(h2_frame(0x1, 0x4, 1, &block)); // HEADERS, END_HEADERS
    for _ in 0..3 {
        out.extend(h2_frame(0x0, 0, 1, &[b'u'; 16_000])); // DATA
    }
    tls.write_all(&out).await.unwrap();
    tls.flush().await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let end = if goaway {
        h2_frame(0x7, 0, 0, &[0; 8]) // GOAWAY: last stream 0, NO_ERROR
    } else {
        h2_frame(0x3, 0, 1, &8u32.to_be_bytes()) // RST_STREAM: CANCEL
    };
    tls.write_all(&end).await.unwrap();
    tls.flush().await.unwrap();
    if goaway {
        let _ = tls.shutdown().await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upload_the_client_abandons_never_reaches_the_upstream_as_whole() {
    let (fx, mut reports) = start_with_faulty_upstream("").await;
    for how in ["h1 close", "h2 RST_STREAM", "h2 GOAWAY and close"] {
        match how {
            "h1 close" => h1_upload_then_close(&fx, UPLOAD_PATH).await,
            "h2 RST_STREAM" => h2_upload_then(&fx, UPLOAD_PATH, false).await,
            _ => h2_upload_then(&fx, UPLOAD_PATH, true).await,
        }
        assert_upload_cut_short(&mut reports, how).await;
    }
    assert_no_upstream_errors(&fx);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn te_trailers_reaches_the_upstream_and_other_hop_by_hop_headers_do_not() {
    let fx = start("", "").await;
    for flag in ["--http1.1", "--http2"] {
        let seen = |te: &'static str| {
            let args = [flag, "-H", te, "-H", "Connection: x-hop", "-H", "X-Hop: 1"];
            let url = fx.url("/headers");
            let cmd = curl(&fx, &[&args[..], &[url.as_str()]].concat());
            async move {
                let body = stdout(&run(cmd).await);
                serde_json::from_str::<serde_json::Value>(&body)
                    .unwrap_or_else(|e| panic!("{e}: {body}"))
            }
        };
        let h = seen("TE: trailers").await;
        assert_eq!(h["te"], "trailers", "{flag}: {h}");
        // (curl itself leaves `Connection` out of HTTP/2 requests.)
        if flag == "--http1.1" {
            assert!(h.get("x-hop").is_none(), "{flag}: {h}");
        }
        let h = seen("TE: gzip").await;
        assert!(h.get("te").is_none(), "{flag}: {h}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expect_100_continue_is_answered_by_the_gateway_not_forwarded() {
    let fx = start("", "").await;
    // HTTP/1.1: the client gets the interim 100 from the gateway and sends its body.
    let body = "x".repeat(300_000);
    let body_file = fx.dir.path().join("upload.bin");
    std::fs::write(&body_file, &body).unwrap();
    let upload = format!("@{}", body_file.display());
    let out = run(curl(
        &fx,
        &[
            "--http1.1",
            "-v",
            "-H",
            "Expect: 100-continue",
            "--data-binary",
            &upload,
            &fx.url("/echo"),
        ],
    ))
    .await;
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(log.contains("HTTP/1.1 100 Continue"), "{log}");
    assert_eq!(stdout(&out).len(), body.len());
    // The upstream never sees the expectation, over either protocol.
    for flag in ["--http1.1", "--http2"] {
        let text = stdout(
            &run(curl(
                &fx,
                &[flag, "-H", "Expect: 100-continue", &fx.url("/headers")],
            ))
            .await,
        );
        let h: serde_json::Value =
            serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
        assert!(h.get("expect").is_none(), "{flag}: {h}");
        assert!(h.get("x-request-id").is_some(), "{flag}: {h}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_past_max_requests_get_503_at_once_and_slots_come_back() {
    // Two gateway workers share the cluster's two slots.
    let fx = start_edited("", |text, _| {
        text.replace("[server]\n", "[server]\nworker_threads = 2\n")
            .replace("endpoints = [", "max_requests = 2\nendpoints = [")
    })
    .await;
    let slow: Vec<_> = (0..2)
        .map(|_| {
            tokio::spawn(run(curl(
                &fx,
                &[
                    "-o",
                    "/dev/null",
                    "-w",
                    "%{http_code}",
                    &fx.url("/delay/4000"),
                ],
            )))
        })
        .collect();
    // Both slow requests are upstream (the gauge says so) before the third arrives.
    eventually_metric(&fx, "rampart_upstream_requests_in_flight", &[], 2.0).await;
    let t = Instant::now();
    assert_eq!(curl_status(&fx, &[&fx.url("/bytes/10")]).await, "503");
    assert!(
        t.elapsed() < Duration::from_millis(2500),
        "{:?}",
        t.elapsed()
    );
    for s in slow {
        assert_eq!(stdout(&s.await.unwrap()), "200");
    }
    // The slots come back with the response bodies: more requests than slots, one by one.
    for _ in 0..4 {
        assert_eq!(curl_status(&fx, &[&fx.url("/bytes/100000")]).await, "200");
    }
    let m = fx.gw().metrics.render();
    assert_eq!(
        metric_sum(&m, "rampart_upstream_errors_total", &["kind=\"overflow\""]),
        1.0,
        "{m}"
    );
    assert_eq!(
        metric_sum(&m, "rampart_upstream_requests_in_flight", &[]),
        0.0,
        "{m}"
    );
}

/// The value of `rampart_upstream_endpoint_healthy` for `endpoint`, once it equals `want`
/// (within 5 s).
async fn endpoint_health_becomes(fx: &Fixture, endpoint: std::net::SocketAddr, want: f64) {
    let label = format!("endpoint=\"{endpoint}\"");
    for _ in 0..100 {
        let m = fx.gw().metrics.render();
        if metric_sum(&m, "rampart_upstream_endpoint_healthy", &[&label]) == want {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!(
        "{endpoint} never became {want}:\n{}",
        fx.gw().metrics.render()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_checks_take_a_failing_endpoint_out_and_bring_it_back() {
    use std::sync::atomic::Ordering;
    let (a, a_up) = spawn_switchable_upstream("a").await;
    let (b, _) = spawn_switchable_upstream("b").await;
    let dir = tempfile::tempdir().unwrap();
    make_certs(dir.path());
    let check = "[clusters.health_check]\npath = \"/healthz\"\ninterval = \"100ms\"\n\
                 timeout = \"500ms\"\nunhealthy_after = 2\nhealthy_after = 1";
    let fx = start_with(&config_text(&[a, b], check, ""), dir, a, None).await;
    let served_by = |n: usize| {
        let fx = &fx;
        async move {
            let mut seen = Vec::new();
            for _ in 0..n {
                let out = stdout(&run(curl(fx, &["-w", " %{http_code}", &fx.url("/")])).await);
                seen.push(out.replace('\n', ""));
            }
            seen
        }
    };
    let seen = served_by(6).await;
    assert!(
        seen.contains(&"a 200".into()) && seen.contains(&"b 200".into()),
        "{seen:?}"
    );

    // a starts failing: once its checks have failed twice, only b serves, and no client
    // sees a's 503.
    a_up.store(false, Ordering::Relaxed);
    endpoint_health_becomes(&fx, a, 0.0).await;
    let seen = served_by(10).await;
    assert!(seen.iter().all(|s| s == "b 200"), "{seen:?}");

    // a recovers: one passed check brings it back.
    a_up.store(true, Ordering::Relaxed);
    endpoint_health_becomes(&fx, a, 1.0).await;
    let seen = served_by(6).await;
    assert!(seen.contains(&"a 200".into()), "{seen:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_endpoint_is_passed_over_after_a_failed_connect() {
    // Defaults: max_fails = 1, fail_timeout = 10s.
    let fx = start_with_a_dead_endpoint("").await;
    // POSTs are not retried on another endpoint: without passive health, round robin would
    // send every other one to the dead endpoint. After its first failed connect, none.
    let mut codes = Vec::new();
    for _ in 0..10 {
        let args = ["-w", "%{http_code}", "-o", "/dev/null", "-d", "x"];
        let url = fx.url("/echo");
        codes.push(stdout(
            &run(curl(&fx, &[&args[..], &[url.as_str()]].concat())).await,
        ));
    }
    assert!(codes[1..].iter().all(|c| c == "200"), "{codes:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h2c_health_checks_pass_a_live_endpoint_and_fail_a_dead_one() {
    let fx = start_with_a_dead_endpoint(
        "protocol = \"h2c\"\n[clusters.health_check]\npath = \"/\"\ninterval = \"100ms\"\n\
         unhealthy_after = 1\nhealthy_after = 1",
    )
    .await;
    // The dead endpoint drops out (the gauges sum to the one live endpoint), the live one
    // stays in after checks over h2c.
    for _ in 0..100 {
        let m = fx.gw().metrics.render();
        if metric_sum(&m, "rampart_upstream_endpoint_healthy", &[]) == 1.0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    endpoint_health_becomes(&fx, fx.upstream, 1.0).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let m = fx.gw().metrics.render();
    assert_eq!(
        metric_sum(&m, "rampart_upstream_endpoint_healthy", &[]),
        1.0,
        "{m}"
    );
    assert_eq!(curl_status(&fx, &[&fx.url("/")]).await, "200");
}

/// A WebSocket handshake to `UPGRADE_PATH` over a new TLS connection: the connection, and the
/// response head (lowercase).
async fn websocket(fx: &Fixture) -> (tokio_boring::SslStream<tokio::net::TcpStream>, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut tls = tls_to(fx, b"\x08http/1.1").await;
    let req = format!(
        "GET {UPGRADE_PATH} HTTP/1.1\r\nhost: localhost\r\nconnection: Upgrade\r\n\
         upgrade: websocket\r\nsec-websocket-key: dGhlIHNhbXBsZSBub25jZQ==\r\n\
         sec-websocket-version: 13\r\n\r\n"
    );
    tls.write_all(req.as_bytes()).await.unwrap();
    let mut head = Vec::new();
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        let mut b = [0u8; 1];
        assert_eq!(tls.read(&mut b).await.unwrap(), 1, "closed after {head:?}");
        head.push(b[0]);
    }
    (tls, String::from_utf8_lossy(&head).to_ascii_lowercase())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_websocket_upgrade_becomes_a_tunnel_to_the_upstream() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (fx, _) = start_with_faulty_upstream("").await;
    let (mut tls, head) = websocket(&fx).await;
    assert!(head.starts_with("http/1.1 101"), "{head}");
    assert!(
        head.contains("upgrade: websocket") && head.contains("connection: upgrade"),
        "{head}"
    );
    assert!(
        head.contains("x-seen-key: dghlihnhbxbszsbub25jzq=="),
        "{head}"
    );
    // Bytes both ways, a short message then 200 KB, through the tunnel.
    for msg in [b"ping-1".to_vec(), vec![b'w'; 200_000]] {
        tls.write_all(&msg).await.unwrap();
        let mut back = vec![0u8; msg.len()];
        tokio::time::timeout(Duration::from_secs(5), tls.read_exact(&mut back))
            .await
            .expect("echo in time")
            .unwrap();
        assert!(back == msg, "echoed bytes differ");
    }
    let log = access_log(&fx, 1).await;
    assert_eq!(log[0]["status"], 101);
    // A plain request to the same path is not switched.
    assert_eq!(curl_status(&fx, &[&fx.url(UPGRADE_PATH)]).await, "426");
}

/// An HTTP/2 connection to the fixture (ALPN h2) whose server has offered extended CONNECT.
async fn h2_client(fx: &Fixture) -> h2::client::SendRequest<bytes::Bytes> {
    let tls = tls_to(fx, b"\x02h2").await;
    let (send, conn) = h2::client::handshake(tls).await.unwrap();
    tokio::spawn(async move {
        let _ = conn.await;
    });
    let send = send.ready().await.unwrap();
    // The server's SETTINGS arrive after the handshake, read by the connection task.
    for _ in 0..100 {
        if send.is_extended_connect_protocol_enabled() {
            return send;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("SETTINGS_ENABLE_CONNECT_PROTOCOL never offered")
}

/// An RFC 8441 WebSocket request (extended CONNECT) for `path`.
fn h2_websocket_request(path: &str) -> http::Request<()> {
    let mut req = http::Request::builder()
        .method(http::Method::CONNECT)
        .uri(format!("https://localhost{path}"))
        .header("sec-websocket-version", "13")
        .body(())
        .unwrap();
    req.extensions_mut()
        .insert(h2::ext::Protocol::from("websocket"));
    req
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_websocket_over_http2_becomes_a_tunnel_to_an_http1_upstream() {
    // A short idle limit: the tunnel, not a request, keeps the connection busy.
    let (fx, _) = start_with_faulty_upstream("[listeners.limits]\nidle_timeout = \"1s\"").await;
    let mut send = h2_client(&fx).await;
    let (response, mut out) = send
        .send_request(h2_websocket_request(UPGRADE_PATH), false)
        .unwrap();
    let response = response.await.unwrap();
    assert_eq!(response.status(), 200, "{response:?}");
    assert!(response.headers().get("sec-websocket-accept").is_none());
    // The upstream got an HTTP/1.1 upgrade with a key the gateway made (and whose accept the
    // gateway checked).
    let key = response.headers()["x-seen-key"]
        .to_str()
        .unwrap()
        .to_string();
    assert_eq!(key.len(), 24, "{key}");
    let mut back = response.into_body();
    // Messages over 2.5 s, longer than the connection's idle limit: it stays open.
    let ticks = (0..5).map(|i| format!("tick-{i}").into_bytes());
    for (i, msg) in [b"ping-over-h2".to_vec(), vec![b'w'; 100_000]]
        .into_iter()
        .chain(ticks)
        .enumerate()
    {
        if i >= 2 {
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        out.send_data(bytes::Bytes::from(msg.clone()), false)
            .unwrap();
        let mut got = Vec::new();
        while got.len() < msg.len() {
            let chunk = tokio::time::timeout(Duration::from_secs(5), back.data())
                .await
                .expect("echo in time")
                .expect("stream open")
                .unwrap();
            let _ = back.flow_control().release_capacity(chunk.len());
            got.extend_from_slice(&chunk);
        }
        assert!(got == msg, "echoed bytes differ");
    }
    // Ending the stream ends the tunnel: the upstream closes and the stream ends.
    out.send_data(bytes::Bytes::new(), true).unwrap();
    let ended = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            match back.data().await {
                Some(Ok(b)) if b.is_empty() => continue, // END_STREAM on an empty frame
                other => return other,
            }
        }
    })
    .await
    .expect("ends in time");
    assert!(!matches!(ended, Some(Ok(_))), "{ended:?}");

    // The switched response was not an abandoned one.
    let m = fx.gw().metrics.render();
    assert_eq!(
        metric_sum(&m, "rampart_http_responses_abandoned_total", &[]),
        0.0,
        "{m}"
    );
    // Other CONNECTs are refused: a plain one, and an extended one for another protocol.
    let mut send = h2_client(&fx).await;
    let plain = http::Request::builder()
        .method(http::Method::CONNECT)
        .uri("localhost:443")
        .body(())
        .unwrap();
    let (response, _out) = send.send_request(plain, false).unwrap();
    assert_eq!(response.await.unwrap().status(), 405);
    let mut udp = h2_websocket_request(UPGRADE_PATH);
    udp.extensions_mut()
        .insert(h2::ext::Protocol::from("connect-udp"));
    let (response, _out) = send.send_request(udp, false).unwrap();
    assert_eq!(response.await.unwrap().status(), 405);

    // An upstream that answers the upgrade with the wrong accept value is not trusted.
    let mut send = h2_client(&fx).await;
    let (response, _out) = send
        .send_request(h2_websocket_request(UPGRADE_BAD_ACCEPT_PATH), false)
        .unwrap();
    assert_eq!(response.await.unwrap().status(), 502);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quiet_websocket_tunnel_is_closed_after_the_idle_timeout() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (fx, _) = start_with_faulty_upstream("limits.idle_timeout = \"1500ms\"").await;
    let (mut tls, head) = websocket(&fx).await;
    assert!(head.starts_with("http/1.1 101"), "{head}");
    // Traffic keeps it open past the timeout...
    for _ in 0..5 {
        tokio::time::sleep(Duration::from_millis(400)).await;
        tls.write_all(b"beat").await.unwrap();
        let mut back = [0u8; 4];
        tls.read_exact(&mut back).await.unwrap();
    }
    // ...and silence closes it.
    let t = Instant::now();
    let mut b = [0u8; 1];
    let n = tokio::time::timeout(Duration::from_secs(5), tls.read(&mut b))
        .await
        .expect("closed in time")
        .unwrap_or(0);
    assert_eq!(n, 0, "the tunnel was still open");
    assert!(
        t.elapsed() >= Duration::from_millis(1200),
        "{:?}",
        t.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_waits_for_an_open_websocket_tunnel_within_the_grace_period() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (mut fx, _) = start_with_faulty_upstream("").await;
    let (mut tls, head) = websocket(&fx).await;
    assert!(head.starts_with("http/1.1 101"), "{head}");
    let done = tokio::spawn(fx.gw.take().unwrap().shutdown());
    // Shutdown has begun (no new connections), and the tunnel still carries messages.
    tokio::time::sleep(Duration::from_millis(300)).await;
    for _ in 0..3 {
        tls.write_all(b"still here").await.unwrap();
        let mut back = [0u8; 10];
        tokio::time::timeout(Duration::from_secs(2), tls.read_exact(&mut back))
            .await
            .expect("echo during shutdown")
            .unwrap();
        assert_eq!(&back, b"still here");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(!done.is_finished(), "shutdown ended with a tunnel open");
    // The client ends the WebSocket; shutdown completes, drained, well inside its 5 s grace.
    let t = Instant::now();
    tls.shutdown().await.unwrap();
    let drained = tokio::time::timeout(Duration::from_secs(4), done)
        .await
        .expect("shutdown once the tunnel closed")
        .unwrap();
    assert!(drained, "shutdown reported the tunnel as cut");
    assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_swaps_routes_and_clusters_and_requests_in_flight_finish() {
    let (one, _) = spawn_switchable_upstream("one").await;
    let (two, _) = spawn_switchable_upstream("two").await;
    let slow = gateway::demo::spawn_upstream("127.0.0.1:0".parse().unwrap(), None)
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    make_certs(dir.path());
    // `app` (every path) goes to `one`; `/delay` to the demo upstream, with a health check.
    let slow_route = format!(
        "[[routes]]\npath_prefix = \"/delay\"\ncluster = \"slow\"\n\n\
         [[clusters]]\nname = \"slow\"\nendpoints = [\"{slow}\"]\n\
         health_check = {{ path = \"/\", interval = \"200ms\" }}\n"
    );
    let first = config_text(&[one], "", "") + &slow_route;
    let fx = start_with(&first, dir, one, None).await;
    let body = |path: &'static str| {
        let cmd = curl(&fx, &["--http2", &fx.url(path)]);
        async move { stdout(&run(cmd).await) }
    };
    assert_eq!(body("/").await, "one\n");

    // A request in flight on `slow` when the reload lands.
    let in_flight = tokio::spawn(run(curl(
        &fx,
        &["-w", " %{http_code}", &fx.url("/delay/1500")],
    )));
    tokio::time::sleep(Duration::from_millis(500)).await;

    // The new file: `app` now goes to `two`, a new route `/v2` to `one`, `slow` unchanged.
    let second = config_text(&[two], "", "").replace(
        "[[routes]]\ncluster = \"app\"",
        "[[routes]]\ncluster = \"app\"\n\n[[routes]]\npath_prefix = \"/v2\"\ncluster = \"v2\"",
    ) + &slow_route
        + &format!("\n[[clusters]]\nname = \"v2\"\nendpoints = [\"{one}\"]\n");
    let path = fx.dir.path().join("rampart.toml");
    std::fs::write(&path, &second).unwrap();
    let report = fx.gw().reload_file(&path).unwrap();
    assert_eq!(report.clusters_kept, 1, "{report:?}"); // `slow`
    assert_eq!(report.clusters_built, 2, "{report:?}"); // `app` changed, `v2` new
    assert!(report.needs_restart.is_empty(), "{report:?}");
    assert_eq!(body("/").await, "two\n");
    assert_eq!(body("/v2/x").await, "one\n");
    assert_eq!(
        stdout(&in_flight.await.unwrap()),
        "slept 1500 ms\n 200",
        "the request in flight finished on the cluster it started on"
    );
    // The endpoint `app` no longer has is gone from the health gauges; `slow` kept its check.
    let m = fx.gw().metrics.render();
    let app_one = format!("cluster=\"app\",endpoint=\"{one}\"");
    assert!(!m.contains(&app_one), "{m}");
    assert!(m.contains(&format!("endpoint=\"{slow}\"")), "{m}");

    // A file that does not load changes nothing, and the error names file and field.
    std::fs::write(
        &path,
        second.replace("cluster = \"v2\"", "cluster = \"nope\""),
    )
    .unwrap();
    let err = format!("{:#}", fx.gw().reload_file(&path).unwrap_err());
    assert!(
        err.contains("rampart.toml") && err.contains("routes[1].cluster"),
        "{err}"
    );
    assert_eq!(body("/v2/x").await, "one\n");
    // A listener setting is reported as needing a restart, and not applied.
    let limits = second.replace(
        "name = \"https\"\nlisten = \"127.0.0.1:0\"",
        "name = \"https\"\nlisten = \"127.0.0.1:0\"\nlimits.max_headers = 1",
    );
    std::fs::write(&path, limits).unwrap();
    let report = fx.gw().reload_file(&path).unwrap();
    assert_eq!(report.needs_restart, vec!["listeners[0] (https)"]);
    assert_eq!(report.clusters_kept, 3, "{report:?}");
    assert_eq!(body("/").await, "two\n");
    let m = fx.gw().metrics.render();
    assert_eq!(
        metric_sum(&m, "rampart_config_reloads_total", &["result=\"ok\""]),
        2.0
    );
    assert_eq!(
        metric_sum(&m, "rampart_config_reloads_total", &["result=\"error\""]),
        1.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_changes_the_listener_access_list_for_new_connections() {
    let quic = "[listeners.quic]\nenabled = true";
    let fx = start("", quic).await;
    let udp = fx.gw().quic_listeners[0].1;
    assert_eq!(curl_status(&fx, &[&fx.url("/")]).await, "200");
    // An open keep-alive connection, made before the deny.
    let mut kept = tls_to(&fx, b"\x08http/1.1").await;
    let path = fx.dir.path().join("rampart.toml");
    let text = std::fs::read_to_string(&path).unwrap();
    let denying = text.replace(quic, &format!("deny = [\"127.0.0.0/8\"]\n{quic}"));
    std::fs::write(&path, &denying).unwrap();
    let report = fx.gw().reload_file(&path).unwrap();
    assert!(report.needs_restart.is_empty(), "{report:?}");
    // New connections from loopback are turned away, over TCP and QUIC...
    assert_eq!(curl_status(&fx, &[&fx.url("/")]).await, "000");
    assert!(quic_handshake(udp).await.is_err());
    // ...while the connection already open is served.
    {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        kept.write_all(b"GET /bytes/3 HTTP/1.1\r\nhost: localhost\r\nconnection: close\r\n\r\n")
            .await
            .unwrap();
        let mut raw = Vec::new();
        let _ = kept.read_to_end(&mut raw).await;
        let text = String::from_utf8_lossy(&raw);
        assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    }
    let m = fx.gw().metrics.render();
    assert!(
        metric_sum(&m, "rampart_connections_denied_total", &[]) >= 2.0,
        "{m}"
    );
    // And lifted again.
    std::fs::write(&path, &text).unwrap();
    fx.gw().reload_file(&path).unwrap();
    assert_eq!(curl_status(&fx, &[&fx.url("/")]).await, "200");
    assert!(quic_handshake(udp).await.is_ok());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_http_is_redirected_to_the_tls_listener() {
    let fx = start("", "http_redirect = \"127.0.0.1:0\"").await;
    let plain = fx
        .gw()
        .addr("https/redirect")
        .expect("the redirect listener");
    let url = format!("http://localhost:{}/bytes/10?x=1", plain.port());
    let resolve = format!("localhost:{}:127.0.0.1", plain.port());
    let out = run({
        let mut c = std::process::Command::new("curl");
        c.args([
            "-sS",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code} %{redirect_url}",
        ])
        .args(["--resolve", &resolve, &url]);
        c
    })
    .await;
    let want = format!("308 https://localhost:{}/bytes/10?x=1", fx.port());
    assert_eq!(stdout(&out), want);
    // Followed, it reaches the upstream over TLS.
    let out = run(curl(
        &fx,
        &["-L", "-o", "/dev/null", "-w", "%{http_code}", &url],
    ))
    .await;
    assert_eq!(stdout(&out), "200");
}

/// A gateway serving `localhost` with a certificate issued by a test CA (`ca.crt` in its
/// folder): the HTTPS origin of the upstream-TLS tests.
async fn start_tls_origin() -> Fixture {
    start_edited("", |text, dir| {
        let (ca, ca_key) = gateway::demo::ensure_ca(dir, "ca", "rampart test CA").unwrap();
        gateway::demo::issue_signed(dir, "origin", &ca, &ca_key, &["localhost"]).unwrap();
        let both = "rsa = { cert = \"localhost-rsa.crt\", key = \"localhost-rsa.key\" }\n\
                    ecdsa = { cert = \"localhost-ecdsa.crt\", key = \"localhost-ecdsa.key\" }";
        assert!(text.contains(both));
        text.replacen(
            both,
            "ecdsa = { cert = \"origin.crt\", key = \"origin.key\" }",
            1,
        )
    })
    .await
}

/// A gateway whose cluster reaches `origin` over TLS, trusting its CA, verifying
/// `server_name`; `cluster_extra` goes in the cluster table.
async fn start_tls_front(origin: &Fixture, server_name: &str, cluster_extra: &str) -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    make_certs(dir.path());
    let ca = origin.dir.path().join("ca.crt");
    let extra = format!(
        "{cluster_extra}\n[clusters.tls]\nserver_name = \"{server_name}\"\nca = \"{}\"",
        ca.display()
    );
    let text = config_text(&[origin.addr()], &extra, "");
    start_with(&text, dir, origin.addr(), None).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_reaches_its_endpoints_over_verified_tls_with_http1_or_h2() {
    let back = start_tls_origin().await;
    for (protocol, via) in [("http1", "1.1 rampart"), ("h2", "2 rampart")] {
        let front =
            start_tls_front(&back, "localhost", &format!("protocol = \"{protocol}\"")).await;
        let out = stdout(&run(curl(&front, &[&front.url("/headers")])).await);
        let seen: serde_json::Value =
            serde_json::from_str(&out).unwrap_or_else(|e| panic!("{protocol}: {e}: {out}"));
        // Via: the front's hop, then the back's, which names the protocol it was reached by.
        let hops = seen["via"].as_str().unwrap_or_default().to_string();
        assert!(hops.ends_with(via), "{protocol}: via {hops}");
    }
    // A certificate that does not match the configured name is refused: 502, counted as a
    // failed connect.
    let front = start_tls_front(&back, "wrong.example", "").await;
    assert_eq!(curl_status(&front, &[&front.url("/headers")]).await, "502");
    let m = front.gw().metrics.render();
    assert!(
        metric_sum(&m, "rampart_upstream_errors_total", &["kind=\"connect\""]) >= 1.0,
        "{m}"
    );
}

/// Gray release through the gateway: a 50/50 split sticky by a header keeps each user on one
/// cluster and spreads users over both; a cohort header always reaches the canary; each
/// choice is counted by route and cluster.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sticky_split_keeps_users_on_one_side_and_cohorts_reach_the_canary() {
    let canary = gateway::demo::spawn_upstream("127.0.0.1:0".parse().unwrap(), None)
        .await
        .unwrap();
    let fx = start_edited("", |text, _| {
        text.replace(
            "[[routes]]\ncluster = \"app\"",
            "[[routes]]\nname = \"web\"\ncluster = \"app\"\nsplit = [{ cluster = \"canary\", weight = 50 }]\nsticky = { header = \"x-user\" }\ncohorts = [{ header = \"x-canary\", value = \"1\", cluster = \"canary\" }]",
        ) + &format!("\n[[clusters]]\nname = \"canary\"\nendpoints = [\"{canary}\"]\n")
    })
    .await;
    let count = |cluster: &str| {
        metric_sum(
            &fx.gw().metrics.render(),
            "rampart_split_requests_total",
            &["route=\"web\"", &format!("cluster=\"{cluster}\"")],
        )
    };
    // 40 users, 5 requests each: every user's requests land on one cluster.
    let mut users_on = [0, 0];
    for user in 0..40 {
        let before = count("canary");
        let header = format!("x-user: u{user}");
        for _ in 0..5 {
            let out = curl_status(&fx, &["-H", &header, &fx.url("/bytes/1")]).await;
            assert_eq!(out, "200");
        }
        match count("canary") - before {
            0.0 => users_on[0] += 1,
            5.0 => users_on[1] += 1,
            n => panic!("user u{user} split over both clusters ({n} of 5 to the canary)"),
        }
    }
    assert!(
        users_on.iter().all(|n| *n >= 8),
        "users per side: {users_on:?}"
    );
    let before = count("canary");
    for user in 0..20 {
        let header = format!("x-user: u{user}");
        curl_status(
            &fx,
            &["-H", &header, "-H", "x-canary: 1", &fx.url("/bytes/1")],
        )
        .await;
    }
    assert_eq!(
        count("canary") - before,
        20.0,
        "the cohort always reaches the canary"
    );
    assert_eq!(count("app") + count("canary"), 220.0);
}

/// `lb = "consistent_hash"`: every request of one user (by header) reaches one endpoint, users
/// spread over both; and the access log says which cluster and endpoint served each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consistent_hash_keeps_each_user_on_one_endpoint() {
    let second = gateway::demo::spawn_upstream("127.0.0.1:0".parse().unwrap(), None)
        .await
        .unwrap();
    let fx = start_edited("", |text, dir| {
        let text = log_to_file(text, dir);
        // Both endpoints in the cluster, hashed by a header.
        let at = text.find("endpoints = [").unwrap();
        let end = at + text[at..].find(']').unwrap();
        format!(
            "{}, \"{second}\"]\nlb = \"consistent_hash\"\nhash_key = {{ header = \"x-user\" }}{}",
            &text[..end],
            &text[end + 1..]
        )
    })
    .await;
    for user in 0..20 {
        for _ in 0..3 {
            let header = format!("x-user: u{user}");
            assert_eq!(
                curl_status(&fx, &["-H", &header, &fx.url("/bytes/1")]).await,
                "200"
            );
        }
    }
    let log = access_log(&fx, 60).await;
    let mut endpoints = std::collections::HashSet::new();
    for user in log.chunks(3) {
        let served: std::collections::HashSet<_> =
            user.iter().map(|r| r["upstream"].clone()).collect();
        assert_eq!(served.len(), 1, "one user on two endpoints: {user:?}");
        assert_eq!(user[0]["cluster"], "app");
        endpoints.extend(served);
    }
    assert_eq!(endpoints.len(), 2, "20 users all on one endpoint");
}

/// Outlier detection through the gateway: of two endpoints, one answers every request with
/// 500; after `consecutive_5xx` of them it is ejected and the rest go to the healthy one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endpoint_answering_500_is_ejected() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let bad = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let bad_addr = bad.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = bad.accept().await {
            tokio::spawn(async move {
                let mut buf = vec![0u8; 8192];
                // One answer per request head read (keep-alive).
                while let Ok(n) = s.read(&mut buf).await {
                    if n == 0 {
                        break;
                    }
                    let answer = b"HTTP/1.1 500 Internal Server Error\r\ncontent-length: 0\r\n\r\n";
                    if s.write_all(answer).await.is_err() {
                        break;
                    }
                }
            });
        }
    });
    let fx = start_edited("", |text, _| {
        let at = text.find("endpoints = [").unwrap();
        let end = at + text[at..].find(']').unwrap();
        format!(
            "{}, \"{bad_addr}\"]\n[clusters.outlier_detection]\nconsecutive_5xx = 2\nbase_ejection_time = \"60s\"{}",
            &text[..end],
            &text[end + 1..]
        )
    })
    .await;
    let mut codes = Vec::new();
    for _ in 0..20 {
        codes.push(curl_status(&fx, &[&fx.url("/bytes/1")]).await);
    }
    let errors = codes.iter().filter(|c| *c == "500").count();
    assert_eq!(errors, 2, "{codes:?}");
    assert!(
        codes[codes.len() - 10..].iter().all(|c| c == "200"),
        "{codes:?}"
    );
    let m = fx.gw().metrics.render();
    assert_eq!(
        metric_sum(
            &m,
            "rampart_upstream_ejections_total",
            &["reason=\"consecutive_5xx\""]
        ),
        1.0,
        "{m}"
    );
}

/// `forwarded_for`: by default a client's own `X-Forwarded-For` is extended with its address
/// (as nginx and Envoy do); with `replace` the upstream sees the address alone, so it cannot
/// be handed a made-up first entry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clients_forwarded_for_is_extended_or_replaced_as_the_listener_says() {
    for (setting, want) in [
        ("", "203.0.113.9, 127.0.0.1"),
        ("forwarded_for = \"replace\"", "127.0.0.1"),
    ] {
        let fx = start("", setting).await;
        let args = ["-H", "x-forwarded-for: 203.0.113.9", &fx.url("/headers")];
        let out = run(curl(&fx, &args)).await;
        let h: serde_json::Value = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stderr)));
        assert_eq!(h["x-forwarded-for"], want, "{setting}: {h}");
    }
}
