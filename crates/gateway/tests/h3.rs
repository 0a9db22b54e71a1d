//! HTTP/3 through the gateway with an independent client (Python aioquic) to a real upstream.

mod common;
use common::*;

fn h3(fx: &Fixture, args: &[&str]) -> std::process::Command {
    let port = fx.gw().quic_listeners[0].1.port();
    let mut c = std::process::Command::new("python3");
    c.arg(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/h3_client.py"))
        .args(["--port", &port.to_string()])
        .args(args);
    c
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
    // TCP responses advertise HTTP/3.
    let out = stdout(&run(curl(&fx, &["-D", "-", "-o", "/dev/null", &fx.url("/")])).await);
    let port = fx.gw().quic_listeners[0].1.port();
    assert!(out.contains(&format!("alt-svc: h3=\":{port}\"")), "{out}");
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
}
