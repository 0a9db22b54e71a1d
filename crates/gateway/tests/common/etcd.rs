//! A real etcd (Debian's `etcd-server`) on loopback ports of its own, in a temporary folder,
//! for the control-plane tests; written to through its JSON gateway with curl, as an operator's
//! tool that bypasses rampart's API would.

use super::{config_text, make_certs, start_with, Fixture};
use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct Etcd {
    dir: tempfile::TempDir,
    child: Option<Child>,
    client_port: u16,
    peer_port: u16,
    /// Serving its clients over TLS (`https://`), with certificates from [`Etcd::start_tls`].
    tls: bool,
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

impl Etcd {
    /// Starts a one-member cluster and waits until it is healthy.
    pub fn start() -> Etcd {
        Self::start_with(false)
    }

    /// Starts one that serves clients over TLS only, with a certificate for 127.0.0.1 from a
    /// CA of its own ([`Etcd::ca`]), and requires each client's certificate from that CA.
    pub fn start_tls() -> Etcd {
        Self::start_with(true)
    }

    fn start_with(tls: bool) -> Etcd {
        let mut e = Etcd {
            dir: tempfile::tempdir().unwrap(),
            child: None,
            client_port: free_port(),
            peer_port: free_port(),
            tls,
        };
        if tls {
            e.make_pki();
        }
        e.restart();
        e
    }

    pub fn url(&self) -> String {
        let scheme = if self.tls { "https" } else { "http" };
        format!("{scheme}://127.0.0.1:{}", self.client_port)
    }

    /// Its PKI's files: `ca.pem`, and a client's `client.pem` and `client.key`.
    pub fn pki(&self, file: &str) -> std::path::PathBuf {
        self.dir.path().join(file)
    }

    /// A CA, etcd's certificate for 127.0.0.1 and a client certificate, with openssl.
    fn make_pki(&self) {
        let d = self.dir.path();
        let openssl = |args: &[&str]| {
            let out = Command::new("openssl")
                .args(args)
                .current_dir(d)
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "openssl {args:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        };
        openssl(&[
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
            "-keyout",
            "ca.key",
            "-out",
            "ca.pem",
            "-days",
            "2",
            "-subj",
            "/CN=etcd test CA",
        ]);
        for (name, ext) in [
            (
                "server",
                "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth,clientAuth",
            ),
            ("client", "extendedKeyUsage=clientAuth"),
        ] {
            std::fs::write(d.join(format!("{name}.ext")), ext).unwrap();
            openssl(&[
                "req",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:P-256",
                "-nodes",
                "-keyout",
                &format!("{name}.key"),
                "-out",
                &format!("{name}.csr"),
                "-subj",
                &format!("/CN={name}"),
            ]);
            openssl(&[
                "x509",
                "-req",
                "-in",
                &format!("{name}.csr"),
                "-CA",
                "ca.pem",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-out",
                &format!("{name}.pem"),
                "-days",
                "2",
                "-extfile",
                &format!("{name}.ext"),
            ]);
        }
    }

    /// Starts it again (after [`Etcd::kill`]) on the same ports and data.
    pub fn restart(&mut self) {
        assert!(self.child.is_none(), "etcd is running");
        let peer = format!("http://127.0.0.1:{}", self.peer_port);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join("etcd.log"))
            .unwrap();
        let mut cmd = Command::new("etcd");
        if self.tls {
            cmd.arg("--cert-file")
                .arg(self.pki("server.pem"))
                .arg("--key-file")
                .arg(self.pki("server.key"))
                .arg("--trusted-ca-file")
                .arg(self.pki("ca.pem"))
                .arg("--client-cert-auth");
        }
        let child = cmd
            .arg("--data-dir")
            .arg(self.dir.path().join("data"))
            .args(["--listen-client-urls", &self.url()])
            .args(["--advertise-client-urls", &self.url()])
            .args(["--listen-peer-urls", &peer])
            .args(["--initial-advertise-peer-urls", &peer])
            .args(["--initial-cluster", &format!("default={peer}")])
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("etcd (Debian package etcd-server) must be installed");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            let out = self
                .curl()
                .args(["-s", "--max-time", "1", &format!("{}/health", self.url())])
                .output()
                .unwrap();
            if String::from_utf8_lossy(&out.stdout).contains("\"health\":\"true\"") {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!(
            "etcd did not become healthy:\n{}",
            std::fs::read_to_string(self.dir.path().join("etcd.log")).unwrap_or_default()
        );
    }

    /// curl, with the client certificate when etcd takes TLS.
    fn curl(&self) -> Command {
        let mut c = Command::new("curl");
        if self.tls {
            c.arg("--cacert")
                .arg(self.pki("ca.pem"))
                .arg("--cert")
                .arg(self.pki("client.pem"))
                .arg("--key")
                .arg(self.pki("client.key"));
        }
        c
    }

    /// Kills it (SIGKILL), as a crash or a network partition would end it.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Puts every `(key, value)` in one transaction (one revision).
    pub fn put_all(&self, kvs: &[(&str, &str)]) {
        use base64::Engine as _;
        let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
        let ops: Vec<String> = kvs
            .iter()
            .map(|(k, v)| {
                format!(
                    r#"{{"requestPut":{{"key":"{}","value":"{}"}}}}"#,
                    b64(k),
                    b64(v)
                )
            })
            .collect();
        let body = format!(r#"{{"success":[{}]}}"#, ops.join(","));
        let out = self
            .curl()
            .args(["-sS", "--max-time", "5", "-d", &body])
            .arg(format!("{}/v3/kv/txn", self.url()))
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains("\"succeeded\":true"), "etcd txn: {text}");
    }
}

impl Etcd {
    /// Turns etcd's authentication on with one user, `root` (which etcd requires first).
    pub fn enable_auth(&self, password: &str) {
        let call = |path: &str, body: &str| {
            let out = self
                .curl()
                .args(["-sS", "--max-time", "5", "-d", body])
                .arg(format!("{}/v3/auth/{path}", self.url()))
                .output()
                .unwrap();
            let text = String::from_utf8_lossy(&out.stdout).into_owned();
            assert!(text.contains("header"), "etcd auth/{path}: {text}");
        };
        call(
            "user/add",
            &format!(r#"{{"name":"root","password":"{password}"}}"#),
        );
        call("role/add", r#"{"name":"root"}"#);
        call("user/grant", r#"{"user":"root","role":"root"}"#);
        call("enable", "{}");
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The admin API token of [`member`]s.
pub const TOKEN: &str = "test-token-0123456789";

/// A gateway whose objects come from `etcd` too, its admin API behind [`TOKEN`] (in
/// `admin.token` in its folder). Its file routes everything to a demo upstream (cluster
/// `app`); etcd's objects add to that.
pub async fn member(etcd: &Etcd) -> Fixture {
    member_in(etcd, tempfile::tempdir().unwrap()).await
}

/// [`member`] in `dir` (a restarted gateway finds its state folder there).
pub async fn member_in(etcd: &Etcd, dir: tempfile::TempDir) -> Fixture {
    member_with(etcd, dir, "").await
}

/// [`member_in`], `listener_extra` added to its listener's table (e.g. `[listeners.quic]`).
pub async fn member_with(etcd: &Etcd, dir: tempfile::TempDir, listener_extra: &str) -> Fixture {
    member_config(etcd, dir, listener_extra, "").await
}

/// [`member_with`], `etcd_extra` added to its `[control.etcd]` table (e.g. credentials).
pub async fn member_config(
    etcd: &Etcd,
    dir: tempfile::TempDir,
    listener_extra: &str,
    etcd_extra: &str,
) -> Fixture {
    let upstream = gateway::demo::spawn_upstream("127.0.0.1:0".parse().unwrap(), None)
        .await
        .unwrap();
    make_certs(dir.path());
    std::fs::write(dir.path().join("admin.token"), format!("{TOKEN}\n")).unwrap();
    let text = config_text(&[upstream], "", listener_extra).replace(
        "[admin]\nlisten = \"127.0.0.1:0\"",
        "[admin]\nlisten = \"127.0.0.1:0\"\ntoken_file = \"admin.token\"",
    ) + &format!(
        "\n[control.etcd]\nendpoints = [\"{}\"]\nconnect_timeout = \"500ms\"\nrequest_timeout = \"1s\"\n{etcd_extra}\n",
        etcd.url()
    );
    start_with(&text, dir, upstream, None).await
}
