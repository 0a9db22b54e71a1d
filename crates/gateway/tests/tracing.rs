//! Distributed tracing through a running gateway: W3C `traceparent` continued upstream and
//! into the access log, spans exported over OTLP/HTTP to a real receiver (the OpenTelemetry
//! protocol's definitions parse every export, `otlp_receiver.py`), and a collector that stops
//! answering costing requests nothing.

mod common;
use common::*;
use std::path::Path;
use std::time::{Duration, Instant};

/// The receiver process, stopped when dropped (also when a test fails).
struct Receiver(std::process::Child);

impl Drop for Receiver {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The OTLP receiver on an ephemeral port, writing spans to `out`; returns it and its port.
fn start_receiver(dir: &Path, out: &Path) -> (Receiver, u16) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let pydeps = root.join("target/pydeps");
    assert!(
        pydeps.join("opentelemetry/proto").is_dir(),
        "{} lacks the opentelemetry-proto package: run scripts/install-deps.sh",
        pydeps.display()
    );
    let port_file = dir.join("otlp.port");
    let child = Receiver(
        std::process::Command::new("/usr/bin/python3")
            .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/otlp_receiver.py"))
            .arg(&port_file)
            .arg(out)
            .env("PYTHONPATH", &pydeps)
            .spawn()
            .unwrap(),
    );
    for _ in 0..200 {
        if let Ok(p) = std::fs::read_to_string(&port_file) {
            return (child, p.trim().parse().unwrap());
        }
        std::thread::sleep(Duration::from_millis(25));
    }
    panic!("the OTLP receiver did not start");
}

fn tracing_config(text: String, dir: &Path, endpoint: &str) -> String {
    let text = log_to_file(text, dir);
    format!(
        "{text}\n[tracing]\notlp_endpoint = \"{endpoint}\"\nsample_ratio = 0.0\nflush_interval = \"100ms\"\nexport_timeout = \"300ms\"\n"
    )
}

/// The receiver's spans once there are at least `want`.
async fn spans(out: &Path, want: usize) -> Vec<serde_json::Value> {
    for _ in 0..200 {
        let text = std::fs::read_to_string(out).unwrap_or_default();
        let lines: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert!(lines.iter().all(|l| l.get("error").is_none()), "{lines:?}");
        if lines.len() >= want {
            return lines;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("fewer than {want} spans at the receiver");
}

const TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CLIENT_SPAN: &str = "00f067aa0ba902b7";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_traceparent_goes_upstream_into_the_log_and_the_exported_spans() {
    let out_dir = tempfile::tempdir().unwrap();
    let out = out_dir.path().join("spans.jsonl");
    let (_receiver, port) = start_receiver(out_dir.path(), &out);
    let endpoint = format!("http://127.0.0.1:{port}/v1/traces");
    let fx = start_edited("", |t, d| tracing_config(t, d, &endpoint)).await;
    let traceparent = format!("00-{TRACE}-{CLIENT_SPAN}-01");
    let body = stdout(
        &run(curl(
            &fx,
            &[
                "-H",
                &format!("traceparent: {traceparent}"),
                "-H",
                "tracestate: vendor=1",
                &fx.url("/headers"),
            ],
        ))
        .await,
    );
    let seen: serde_json::Value =
        serde_json::from_str(&body).unwrap_or_else(|e| panic!("{e}: {body}"));
    let upstream = seen["traceparent"].as_str().unwrap().to_string();
    let parts: Vec<&str> = upstream.split('-').collect();
    assert_eq!(
        (parts[0], parts[1], parts[3]),
        ("00", TRACE, "01"),
        "{upstream}"
    );
    assert_ne!(
        parts[2], CLIENT_SPAN,
        "the upstream's parent is the gateway's span"
    );
    assert_eq!(seen["tracestate"], "vendor=1");
    // The request's span (server, child of the client's) and its try (client, whose id the
    // upstream was given as its parent).
    let got = spans(&out, 2).await;
    let request = got
        .iter()
        .find(|s| s["name"] == "request")
        .expect("request span");
    let attempt = got
        .iter()
        .find(|s| s["name"] == "upstream try")
        .expect("try span");
    assert_eq!(request["trace_id"], TRACE);
    assert_eq!(request["parent_span_id"], CLIENT_SPAN);
    assert_eq!(request["kind"], 2);
    assert_eq!(request["service"], "rampart");
    assert_eq!(request["attributes"]["http.response.status_code"], 200);
    assert_eq!(request["attributes"]["url.path"], "/headers");
    assert_eq!(attempt["trace_id"], TRACE);
    assert_eq!(attempt["parent_span_id"], request["span_id"]);
    assert_eq!(attempt["span_id"], parts[2]);
    assert_eq!(attempt["kind"], 3);
    assert_eq!(
        attempt["attributes"]["server.port"],
        fx.upstream.port() as i64
    );
    let log = access_log(&fx, 1).await;
    assert_eq!(log[0]["trace_id"], TRACE);
    // Not sampled (sample_ratio 0, no traceparent): a new trace id upstream and in the log,
    // flagged unsampled, and no span exported.
    let body = stdout(&run(curl(&fx, &[&fx.url("/headers")])).await);
    let seen: serde_json::Value = serde_json::from_str(&body).unwrap();
    let upstream = seen["traceparent"].as_str().unwrap().to_string();
    assert!(
        upstream.starts_with("00-") && upstream.ends_with("-00"),
        "{upstream}"
    );
    let log = access_log(&fx, 2).await;
    assert_eq!(log[1]["trace_id"], upstream.split('-').nth(1).unwrap());
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(spans(&out, 2).await.len(), 2, "nothing more exported");
    let m = fx.gw().metrics.render();
    assert!(
        metric_sum(&m, "rampart_tracing_spans_exported_total", &[]) >= 2.0,
        "{m}"
    );
}

/// A collector that accepts connections and never answers: requests go on at full speed and
/// the spans are dropped (counted) rather than queued behind it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_collector_that_stops_answering_costs_requests_nothing() {
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let endpoint = format!("http://{}/v1/traces", silent.local_addr().unwrap());
    let fx = start_edited("", |t, d| tracing_config(t, d, &endpoint)).await;
    let traceparent = format!("traceparent: 00-{TRACE}-{CLIENT_SPAN}-01");
    let started = Instant::now();
    for _ in 0..20 {
        let status = curl_status(&fx, &["-H", &traceparent, &fx.url("/bytes/100")]).await;
        assert_eq!(status, "200");
    }
    // Twenty requests (each a new curl process and TLS handshake) in well under the 20 ×
    // 300 ms the exports would cost if requests waited for them.
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    let mut dropped = 0.0;
    for _ in 0..100 {
        dropped = metric_sum(
            &fx.gw().metrics.render(),
            "rampart_tracing_spans_dropped_total",
            &[],
        );
        if dropped > 0.0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(dropped > 0.0, "spans to a silent collector are dropped");
    drop(silent);
}

/// With every trace sampled, a TLS handshake is a trace of its own (server span) with the key
/// engine's signature as its child; a QUIC handshake is one too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handshake_and_its_signature_are_spans() {
    let out_dir = tempfile::tempdir().unwrap();
    let out = out_dir.path().join("spans.jsonl");
    let (_receiver, port) = start_receiver(out_dir.path(), &out);
    let endpoint = format!("http://127.0.0.1:{port}/v1/traces");
    let fx = start_edited("[listeners.quic]\nenabled = true", |t, d| {
        tracing_config(t, d, &endpoint).replace("sample_ratio = 0.0", "sample_ratio = 1.0")
    })
    .await;
    let status = curl_status(&fx, &["--tlsv1.3", &fx.url("/bytes/10")]).await;
    assert_eq!(status, "200");
    // The handshake, its signature, the request and its try.
    let got = spans(&out, 4).await;
    let hs = got
        .iter()
        .find(|s| s["name"] == "tls handshake")
        .expect("handshake span");
    let sign = got
        .iter()
        .find(|s| s["name"] == "key engine sign")
        .expect("sign span");
    assert_eq!(hs["kind"], 2);
    assert_eq!(hs["parent_span_id"], "");
    assert_eq!(hs["attributes"]["tls.protocol.version"], "TLSv1.3");
    assert_eq!(hs["attributes"]["tls.server_name"], "localhost");
    assert_eq!(sign["trace_id"], hs["trace_id"]);
    assert_eq!(sign["parent_span_id"], hs["span_id"]);
    assert!(sign["attributes"]["rampart.signature_algorithm"]
        .as_str()
        .unwrap()
        .starts_with("ecdsa"));
    let (start, end) = (
        sign["start"].as_u64().unwrap(),
        sign["end"].as_u64().unwrap(),
    );
    assert!(
        start <= end
            && hs["start"].as_u64().unwrap() <= start
            && end <= hs["end"].as_u64().unwrap()
    );
    assert!(got
        .iter()
        .any(|s| s["name"] == "request" && s["trace_id"] != hs["trace_id"]));
    // Over QUIC: one HTTP/3 request with aioquic (the test client of tests/h3.rs).
    let mut h3 = std::process::Command::new("python3");
    h3.arg(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/h3_client.py"))
        .args(["--port", &fx.gw().quic_listeners[0].1.port().to_string()])
        .args(["--path", "/bytes/10"]);
    let done = run(h3).await;
    assert!(
        done.status.success(),
        "{}",
        String::from_utf8_lossy(&done.stderr)
    );
    let mut quic_span = None;
    for _ in 0..100 {
        let got = spans(&out, 5).await;
        quic_span = got.into_iter().find(|s| {
            s["name"] == "tls handshake" && s["attributes"]["network.transport"] == "quic"
        });
        if quic_span.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let q = quic_span.expect("a QUIC handshake span");
    assert_eq!(q["attributes"]["tls.server_name"], "localhost");
    assert!(q["start"].as_u64().unwrap() <= q["end"].as_u64().unwrap());
}
