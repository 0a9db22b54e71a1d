//! The `rampart` binary: config checking and errors as an operator sees them.

use std::path::Path;
use std::process::Command;

fn rampart() -> Command {
    Command::new(env!("CARGO_BIN_EXE_rampart"))
}

/// `rampart check --config PATH` must succeed; returns its stdout.
fn check_ok(path: &Path) -> String {
    let out = rampart()
        .args(["check", "--config"])
        .arg(path)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// A directory laid out like the repository: config/ beside state/certs/.
fn repo_like() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let certs = dir.path().join("state/certs");
    use gateway::demo::{ensure_self_signed, CertKind};
    ensure_self_signed(&certs, "localhost-rsa", CertKind::Rsa2048, &["localhost"]).unwrap();
    ensure_self_signed(
        &certs,
        "localhost-ecdsa",
        CertKind::EcdsaP256,
        &["localhost"],
    )
    .unwrap();
    // The key-server PKI exactly as README issues it.
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/issue-keyless-pki.sh");
    let out = Command::new("bash")
        .arg(script)
        .arg(dir.path().join("state/pki"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::create_dir_all(dir.path().join("config")).unwrap();
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../config");
    std::fs::copy(
        examples.join("rampart.example.toml"),
        dir.path().join("config/rampart.toml"),
    )
    .unwrap();
    for f in ["keyserver.example.toml", "gateway-keyless.example.toml"] {
        std::fs::copy(examples.join(f), dir.path().join("config").join(f)).unwrap();
    }
    dir
}

#[test]
fn keyless_example_configs_check_ok() {
    let dir = repo_like();
    let stdout = check_ok(&dir.path().join("config/keyserver.example.toml"));
    assert!(stdout.contains("ok (key server, 2 keys)"), "{stdout}");
    let stdout = check_ok(&dir.path().join("config/gateway-keyless.example.toml"));
    assert!(
        stdout.contains("2 keys, 0 held here"),
        "the keyless gateway holds no private key: {stdout}"
    );
}

#[test]
fn example_config_checks_ok() {
    let dir = repo_like();
    let stdout = check_ok(&dir.path().join("config/rampart.toml"));
    assert!(
        stdout.contains("ok (1 listeners, 4 routes, 3 clusters, 2 keys, 2 held here)"),
        "{stdout}"
    );
}

#[test]
fn invalid_config_exits_nonzero_naming_file_field_and_expectation() {
    let dir = repo_like();
    let path = dir.path().join("config/rampart.toml");
    let text = std::fs::read_to_string(&path).unwrap();
    for (from, to, field, expect) in [
        (
            "lb = \"round_robin\"",
            "lb = \"random\"",
            "clusters[0].lb",
            "round_robin",
        ),
        (
            "threads = 1",
            "threads = 1\nturbo = true",
            "key_engine.turbo",
            "unknown field",
        ),
        (
            "read_timeout = \"30s\"",
            "read_timeout = \"thirty\"",
            "clusters[0].read_timeout",
            "expected e.g.",
        ),
        (
            "cluster = \"app\"\n# ModSecurity",
            "cluster = \"nope\"\n# ModSecurity",
            "routes[0].cluster",
            "no cluster named",
        ),
        (
            "paranoia = 1,",
            "paranoia = 7,",
            "routes[0].waf.paranoia",
            "from 1 to 4",
        ),
    ] {
        assert!(text.contains(from), "example lost {from:?}");
        std::fs::write(&path, text.replacen(from, to, 1)).unwrap();
        let out = rampart()
            .args(["check", "--config"])
            .arg(&path)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{field}: accepted");
        assert!(
            stderr.contains("rampart.toml"),
            "{field}: names the file: {stderr}"
        );
        assert!(
            stderr.contains(&format!("`{field}`")),
            "names the field path {field}: {stderr}"
        );
        assert!(
            stderr.contains(expect),
            "{field}: says what was expected: {stderr}"
        );
    }
}

#[test]
fn certificate_without_matching_key_is_refused() {
    let dir = repo_like();
    let path = dir.path().join("config/rampart.toml");
    let text = std::fs::read_to_string(&path).unwrap();
    // The RSA certificate paired with the ECDSA key.
    let text = text.replacen(
        "key = \"../state/certs/localhost-rsa.key\"",
        "key = \"../state/certs/localhost-ecdsa.key\"",
        1,
    );
    std::fs::write(&path, text).unwrap();
    let out = rampart()
        .args(["check", "--config"])
        .arg(&path)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("certificates[0].rsa"), "{stderr}");
    assert!(
        stderr.contains("holds no key for this certificate"),
        "{stderr}"
    );
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn wait_port(port: u16) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            std::time::Instant::now() < deadline,
            "port {port} never opened"
        );
        std::thread::sleep(std::time::Duration::from_millis(25));
    }
}

struct Proc(std::process::Child);
impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// README's production setup with real processes: a key server and a gateway from the example
/// configs (ports moved), certificates from the PKI script, curl through the gateway.
#[test]
fn keyless_examples_run_end_to_end() {
    let dir = repo_like();
    let cfg = dir.path().join("config");
    let (ks, ks_admin, gw, gw_admin, up) = (
        free_port(),
        free_port(),
        free_port(),
        free_port(),
        free_port(),
    );
    let text = std::fs::read_to_string(cfg.join("keyserver.example.toml"))
        .unwrap()
        .replace("127.0.0.1:2407", &format!("127.0.0.1:{ks}"))
        .replace("127.0.0.1:9902", &format!("127.0.0.1:{ks_admin}"));
    std::fs::write(cfg.join("keyserver.example.toml"), text).unwrap();
    let text = std::fs::read_to_string(cfg.join("gateway-keyless.example.toml"))
        .unwrap()
        .replace(
            "[\"127.0.0.1:2407\", \"127.0.0.1:2408\"]",
            &format!("[\"127.0.0.1:{ks}\"]"),
        )
        .replace("127.0.0.1:8443", &format!("127.0.0.1:{gw}"))
        .replace("127.0.0.1:9901", &format!("127.0.0.1:{gw_admin}"))
        .replace("127.0.0.1:8080", &format!("127.0.0.1:{up}"))
        .replace("access_log = \"stdout\"", "access_log = \"off\"");
    std::fs::write(cfg.join("gateway-keyless.example.toml"), text).unwrap();
    let _up = Proc(
        rampart()
            .args(["upstream", "--listen", &format!("127.0.0.1:{up}")])
            .spawn()
            .unwrap(),
    );
    let _ks = Proc(
        rampart()
            .args(["keyserver", "--config"])
            .arg(cfg.join("keyserver.example.toml"))
            .spawn()
            .unwrap(),
    );
    wait_port(ks);
    let _gw = Proc(
        rampart()
            .args(["run", "--config"])
            .arg(cfg.join("gateway-keyless.example.toml"))
            .spawn()
            .unwrap(),
    );
    wait_port(gw);
    wait_port(up);
    let mut ok = false;
    for _ in 0..50 {
        // The gateway dials the key server in the background; retry until it is connected.
        let out = Command::new("curl")
            .args([
                "-sS",
                "--insecure",
                "--max-time",
                "5",
                "-o",
                "/dev/null",
                "-w",
                "%{http_code}",
                "--resolve",
            ])
            .arg(format!("localhost:{gw}:127.0.0.1"))
            .arg(format!("https://localhost:{gw}/"))
            .output()
            .unwrap();
        if String::from_utf8_lossy(&out.stdout) == "200" {
            ok = true;
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert!(ok, "curl through the keyless gateway");
    let metrics = Command::new("curl")
        .args(["-sS", &format!("http://127.0.0.1:{ks_admin}/metrics")])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&metrics.stdout);
    let served: f64 = text
        .lines()
        .find_map(|l| l.strip_prefix("rampart_keyserver_requests_total "))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0);
    assert!(served >= 1.0, "the key server signed: {text}");
}

/// `rampart demo`, then HTTP/3 uploads from the load generator, which sends full-size packets as
/// GSO buffers: the gateway receives them as GRO trains of about 64 KB, the receives its QUIC
/// router hands to the connection without a copy (tokio-quiche patch 13). Every upload must be
/// answered 200 by the upstream's `/discard`, with no error. QUIC's loss recovery would hide a
/// damaged packet here; `recv_buf_pool`'s unit tests check the bytes handed over.
#[test]
fn demo_takes_an_h3_upload_sent_in_gso_buffers() {
    let dir = tempfile::tempdir().unwrap();
    let (_demo, gw, _) = spawn_demo(dir.path());
    let out = rampart()
        .args([
            "bench",
            "h3-upload",
            "--url",
            &format!("https://localhost:{gw}/discard"),
            "--upload-bytes",
            "8000000",
            "-c",
            "2",
            "-d",
            "2s",
            "--json",
        ])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
    assert!(report["ok"].as_u64().unwrap() >= 1, "{report}");
    assert_eq!(report["errors"].as_u64(), Some(0), "{report}");
    assert_eq!(
        report["bytes"].as_u64(),
        Some(report["ok"].as_u64().unwrap() * 8_000_000),
        "{report}"
    );
}

/// The first certificate (PEM) in `text`: a file's leaf, or what `openssl s_client` printed.
fn first_certificate(text: &str) -> String {
    let (begin, end) = ("-----BEGIN CERTIFICATE-----", "-----END CERTIFICATE-----");
    let start = text.find(begin).expect("a certificate");
    let stop = start + text[start..].find(end).expect("its end") + end.len();
    text[start..stop].to_string()
}

/// The certificate the gateway on `port` presents to an ECDSA-only client for localhost.
fn presented_ecdsa_certificate(port: u16) -> String {
    let out = Command::new("openssl")
        .args(["s_client", "-connect", &format!("127.0.0.1:{port}")])
        .args(["-servername", "localhost", "-sigalgs", "ECDSA+SHA256"])
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    first_certificate(&String::from_utf8_lossy(&out.stdout))
}

fn admin_metric(admin: u16, series: &str) -> f64 {
    let out = Command::new("curl")
        .args(["-sS", &format!("http://127.0.0.1:{admin}/metrics")])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| l.strip_prefix(series))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0.0)
}

/// `rampart demo` in `state`, on free ports, once it listens: (the process, gateway port,
/// admin port).
fn spawn_demo(state: &Path) -> (Proc, u16, u16) {
    let (gw, admin) = (free_port(), free_port());
    let demo = Proc(
        rampart()
            .args(["demo", "--state-dir"])
            .arg(state)
            .args([
                "--listen",
                &format!("127.0.0.1:{gw}"),
                "--admin",
                &format!("127.0.0.1:{admin}"),
            ])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    );
    wait_port(gw);
    wait_port(admin);
    (demo, gw, admin)
}

/// Sends SIGHUP to `proc` and waits (up to 10 s) until the admin metric `series` counts one.
fn hup_until_counted(proc: &Proc, admin: u16, series: &str) {
    let before = admin_metric(admin, series);
    let hup = Command::new("kill")
        .args(["-HUP", &proc.0.id().to_string()])
        .status()
        .unwrap();
    assert!(hup.success());
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while admin_metric(admin, series) < before + 1.0 {
        assert!(std::time::Instant::now() < deadline, "{series} not counted");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// A renewed certificate written over the demo's files, then `kill -HUP`: the running gateway
/// presents it to the next handshake (README's "Reloading the configuration"); a broken file
/// then changes nothing.
#[test]
fn sighup_reloads_renewed_certificates() {
    let dir = tempfile::tempdir().unwrap();
    let (demo, gw, admin) = spawn_demo(dir.path());
    let certs = dir.path().join("certs");
    let read = |p: &Path| first_certificate(&std::fs::read_to_string(p).unwrap());
    let old = read(&certs.join("localhost-ecdsa.crt"));
    assert_eq!(presented_ecdsa_certificate(gw), old);

    let fresh = tempfile::tempdir().unwrap();
    use gateway::demo::{ensure_self_signed, CertKind};
    ensure_self_signed(fresh.path(), "renewed", CertKind::EcdsaP256, &["localhost"]).unwrap();
    for ext in ["crt", "key"] {
        std::fs::copy(
            fresh.path().join(format!("renewed.{ext}")),
            certs.join(format!("localhost-ecdsa.{ext}")),
        )
        .unwrap();
    }
    let renewed = read(&certs.join("localhost-ecdsa.crt"));
    assert_ne!(renewed, old);

    hup_until_counted(&demo, admin, "rampart_config_reloads_total{result=\"ok\"}");
    assert_eq!(presented_ecdsa_certificate(gw), renewed);

    // A configuration file that no longer loads: counted, logged, and nothing changes.
    let cfg = dir.path().join("demo.toml");
    let text = std::fs::read_to_string(&cfg).unwrap();
    std::fs::write(&cfg, text.replace("[[routes]]", "[[routes]]\nbogus = 1")).unwrap();
    hup_until_counted(
        &demo,
        admin,
        "rampart_config_reloads_total{result=\"error\"}",
    );
    assert_eq!(presented_ecdsa_certificate(gw), renewed);
}

/// `rampart l4` refuses a bad file before binding anything, naming the file and the field; the
/// example file parses.
#[test]
fn l4_config_errors_name_the_field() {
    let dir = tempfile::tempdir().unwrap();
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../config/l4.example.toml");
    let text = std::fs::read_to_string(&example).unwrap();
    l4::L4Config::parse(&text, "l4.example.toml").unwrap();
    let bad = dir.path().join("l4.toml");
    std::fs::write(
        &bad,
        text.replace("server_id = \"02\"", "server_id = \"xyz\""),
    )
    .unwrap();
    let out = rampart()
        .args(["l4", "--config"])
        .arg(&bad)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("l4.toml") && err.contains("l4.backends[1].server_id") && err.contains("hex"),
        "{err}"
    );
}

/// `rampart gpu-worker` as the gpu engine starts it (the gateway's `isolation = "process"`):
/// with the simulated device, the engine's batches run in it through the descriptors it is
/// handed, and its signatures verify; a wrong argument is refused with the argument named.
#[test]
fn gpu_worker_subcommand_serves_the_engine_through_passed_descriptors() {
    use gpu_engine::process::{ProcessBackend, WorkerCommand};
    use gpu_engine::BatchBackend;
    let worker = |args: &[&str]| WorkerCommand {
        program: env!("CARGO_BIN_EXE_rampart").into(),
        args: std::iter::once("gpu-worker")
            .chain(args.iter().copied())
            .map(String::from)
            .collect(),
    };
    let config = gpu_engine::GpuConfig {
        max_batch: 64,
        ..gpu_engine::GpuConfig::default()
    };
    let backend = ProcessBackend::start(worker(&["--simulated", "100:1000"]), &config)
        .expect("the worker starts");
    assert!(backend.describe().contains("worker process"));
    let der = boring::rsa::Rsa::generate(2048)
        .unwrap()
        .private_key_to_der()
        .unwrap();
    let key = gpu_engine::GpuKey::from_der(&der).unwrap();
    let run = gpu_engine::bench_batch(&backend, &key, 8, std::time::Duration::from_millis(50))
        .expect("batches run in the worker and match the CPU build of the core");
    assert!(run.batches >= 1);
    let err = ProcessBackend::start(worker(&["--bogus", "1"]), &config)
        .err()
        .expect("refused");
    assert!(err.to_string().contains("did not start"), "{err}");
}
