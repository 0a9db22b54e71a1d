//! Key engines configured by name: the `batch` engine signs real handshakes (RSA and ECDSA,
//! curl and boring clients), and a `gpu` engine without a device is reported unavailable and
//! never routed to.

mod common;
use boring::ssl::SslSignatureAlgorithm;
use common::*;

async fn start_with_engines(engines: &str) -> Fixture {
    let upstream = gateway::demo::spawn_upstream("127.0.0.1:0".parse().unwrap(), None)
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    make_certs(dir.path());
    let text = config_text(&[upstream], "", "").replace(
        "engines = [\"threads\"]",
        &format!("engines = {engines}\n[key_engine.batch]\nthreads = 1"),
    );
    assert!(text.contains("[key_engine.batch]"));
    start_with(&text, dir, upstream, None).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batch_engine_signs_concurrent_handshakes_and_gpu_is_skipped_without_a_device() {
    let fx = start_with_engines(r#"["batch", "gpu"]"#).await;
    // Real clients, both protocols.
    for http in ["--http1.1", "--http2"] {
        let status = curl_status(&fx, &[http, &fx.url("/")]).await;
        assert_eq!(status, "200", "{http}");
    }
    // A burst of concurrent RSA and ECDSA handshakes: queued together, they share batches.
    let addr = fx.addr();
    let tasks: Vec<_> = (0..48)
        .map(|i| {
            tokio::spawn(async move {
                let alg = if i % 4 == 3 {
                    SslSignatureAlgorithm::ECDSA_SECP256R1_SHA256
                } else {
                    SslSignatureAlgorithm::RSA_PSS_RSAE_SHA256
                };
                tls_handshake_offering(addr, "localhost", Some(&[alg])).await
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap().expect("handshake");
    }
    let m = fx.gw().metrics.render();
    let batch_ok = metric_sum(
        &m,
        "rampart_keyengine_operations_total",
        &["engine=\"batch\"", "result=\"ok\""],
    );
    assert!(batch_ok >= 50.0, "batch signed {batch_ok}\n{m}");
    assert_eq!(
        metric_sum(
            &m,
            "rampart_keyengine_operations_total",
            &["engine=\"gpu\""]
        ),
        0.0,
        "an unavailable engine is never routed to"
    );
    let engines = fx.gw().engine.engines_metrics_text();
    assert!(
        engines.contains("rampart_batch_operations_total"),
        "{engines}"
    );
    if std::path::Path::new("/dev/nvidia0").exists() {
        return; // a real device: availability is the device's business
    }
    assert!(engines.contains("rampart_gpu_available 0"), "{engines}");
}

/// The load error for a config whose key engine section is `engine_section`.
fn config_error(engine_section: &str) -> String {
    let dir = tempfile::tempdir().unwrap();
    make_certs(dir.path());
    let text = config_text(&["127.0.0.1:1".parse().unwrap()], "", "")
        .replace("engines = [\"threads\"]", engine_section);
    let path = dir.path().join("rampart.toml");
    std::fs::write(&path, text).unwrap();
    gateway::config::Config::load(&path)
        .unwrap_err()
        .to_string()
}

#[test]
fn gpu_settings_out_of_range_are_config_errors_naming_the_field() {
    for (section, field, expected) in [
        ("window = 7", "key_engine.gpu.window", "4, 5 or 6"),
        (
            "threads_per_request = 3",
            "key_engine.gpu.threads_per_request",
            "1, 2, 8, 16 or 32",
        ),
        (
            "batch_latency_target = \"0ms\"",
            "key_engine.gpu.batch_latency_target",
            "more than zero",
        ),
        (
            "threads_per_block = 512",
            "key_engine.gpu.threads_per_block",
            "32 to 256",
        ),
        ("streams = 1", "key_engine.gpu.streams", "2 to 16"),
        (
            "batch_deadline = \"0s\"",
            "key_engine.gpu.batch_deadline",
            "more than zero",
        ),
    ] {
        let err = config_error(&format!("engines = [\"gpu\"]\n[key_engine.gpu]\n{section}"));
        assert!(
            err.contains(field) && err.contains(expected),
            "{section}: {err}"
        );
    }
    let err = config_error("engines = [\"gpu\"]\n[key_engine.gpu]\nblock = 128");
    assert!(err.contains("block"), "unknown fields are refused: {err}");
    let err = config_error("engines = [\"gpu\"]\ncpu_offload_above = 1.5");
    assert!(
        err.contains("key_engine.cpu_offload_above") && err.contains("at most 1.0"),
        "{err}"
    );
    let err = config_error("engines = [\"gpu\"]\n[key_engine.gpu]\nisolation = \"container\"");
    assert!(
        err.contains("key_engine.gpu.isolation") && err.contains("process"),
        "{err}"
    );
}

#[test]
fn a_kernel_this_cpu_lacks_or_an_unknown_one_is_a_config_error_naming_the_field() {
    let err = config_error("engines = [\"batch\"]\n[key_engine.batch]\nkernel = \"avx2\"");
    assert!(
        err.contains("key_engine.batch.kernel") && err.contains("\"avx2\""),
        "{err}"
    );
    if !keyengine::KernelBackend::Ifma512.available() {
        let err = config_error("engines = [\"batch\"]\n[key_engine.batch]\nkernel = \"ifma512\"");
        assert!(
            err.contains("key_engine.batch.kernel") && err.contains("AVX-512 IFMA"),
            "{err}"
        );
    }
}
