//! The `rampart` binary: config checking and errors as an operator sees them.

use std::path::Path;
use std::process::Command;

fn rampart() -> Command {
    Command::new(env!("CARGO_BIN_EXE_rampart"))
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
    std::fs::create_dir_all(dir.path().join("config")).unwrap();
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../config/rampart.example.toml");
    std::fs::copy(example, dir.path().join("config/rampart.toml")).unwrap();
    dir
}

#[test]
fn example_config_checks_ok() {
    let dir = repo_like();
    let out = rampart()
        .args(["check", "--config"])
        .arg(dir.path().join("config/rampart.toml"))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("ok (1 listeners, 2 routes, 1 clusters, 2 keys)"),
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
            "cluster = \"app\"\n\n[[routes]]",
            "cluster = \"nope\"\n\n[[routes]]",
            "routes[0].cluster",
            "no cluster named",
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
