//! TLS termination with real clients: curl (h1, h2, TLS 1.2/1.3) and openssl s_client
//! (SNI, certificate choice by signature algorithms, ticket resumption).

mod common;
use common::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curl_h1_and_h2_over_tls12_and_tls13() {
    let fx = start("", "").await;
    for (http, tls, want_http) in [
        ("--http1.1", "1.2", "1.1"),
        ("--http1.1", "1.3", "1.1"),
        ("--http2", "1.2", "2"),
        ("--http2", "1.3", "2"),
    ] {
        let tls_flag = format!("--tlsv{tls}");
        let out = run(curl(
            &fx,
            &[
                http,
                &tls_flag,
                "--tls-max",
                tls,
                "-w",
                "\n%{http_code} %{http_version}",
                &fx.url("/headers"),
            ],
        ))
        .await;
        let text = stdout(&out);
        assert!(
            out.status.success(),
            "{http} TLS {tls}: {text} {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            text.ends_with(&format!("200 {want_http}")),
            "{http} TLS {tls}: {text}"
        );
        assert!(text.contains("\"x-forwarded-proto\": \"https\""), "{text}");
        assert!(
            text.contains("rampart"),
            "Via header reaches the upstream: {text}"
        );
    }
    let metrics = fx.gw().metrics.render();
    assert!(
        metric_sum(
            &metrics,
            "rampart_tls_handshakes_total",
            &["version=\"TLSv1.2\""]
        ) >= 2.0
    );
    assert!(
        metric_sum(
            &metrics,
            "rampart_tls_handshakes_total",
            &["version=\"TLSv1.3\""]
        ) >= 2.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sni_selects_certificate_among_two_names() {
    let fx = start("", "").await;
    for (name, want) in [
        ("localhost", "CN = localhost"),
        ("other.test", "CN = other.test"),
        ("www.other.test", "CN = other.test"),
        ("unknown.example", "CN = localhost"),
    ] {
        let out = run(openssl_s_client(&fx, name, &[])).await;
        let text = stdout(&out);
        assert_eq!(
            presented_subject(&text),
            format!("subject={want}"),
            "SNI {name}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn certificate_follows_client_signature_algorithms() {
    let fx = start("", "").await;
    for tls in ["-tls1_3", "-tls1_2"] {
        let rsa = s_client(
            &fx,
            "localhost",
            &[tls, "-sigalgs", "RSA-PSS+SHA256:RSA+SHA256"],
        )
        .await;
        assert_eq!(
            presented_key_type(&rsa),
            "RSA",
            "{tls} RSA-only client:\n{rsa}"
        );
        let ec = s_client(&fx, "localhost", &[tls, "-sigalgs", "ECDSA+SHA256"]).await;
        assert_eq!(presented_key_type(&ec), "EC", "{tls} ECDSA client:\n{ec}");
    }
    // TLS 1.2 binds no curve to the hash: a client offering ECDSA only with SHA-384 or SHA-512
    // is served by the P-256 certificate, signed with that hash (as nginx serves it).
    for hash in ["SHA384", "SHA512"] {
        let sigalg = format!("ECDSA+{hash}");
        let out = s_client(&fx, "localhost", &["-tls1_2", "-sigalgs", &sigalg]).await;
        assert_eq!(presented_key_type(&out), "EC", "{sigalg}:\n{out}");
        assert!(
            out.contains(&format!("Peer signing digest: {hash}")),
            "{sigalg}:\n{out}"
        );
    }
    // Over TLS 1.3 ecdsa_secp384r1_sha384 means P-384: the P-256 certificate cannot serve it.
    let out = s_client(
        &fx,
        "localhost",
        &["-tls1_3", "-sigalgs", "ECDSA+SHA384:RSA-PSS+SHA256"],
    )
    .await;
    assert_eq!(presented_key_type(&out), "RSA", "{out}");
    // A TLS 1.2 client that offers ECDSA signatures but only RSA suites must get RSA.
    let out = s_client(
        &fx,
        "localhost",
        &["-tls1_2", "-cipher", "ECDHE-RSA-AES128-GCM-SHA256"],
    )
    .await;
    assert_eq!(presented_key_type(&out), "RSA", "{out}");
    let m = fx.gw().metrics.render();
    assert!(
        metric_sum(
            &m,
            "rampart_tls_handshakes_total",
            &["signature_algorithm=\"ecdsa_secp256r1_sha256\""]
        ) >= 2.0
    );
    assert!(
        metric_sum(
            &m,
            "rampart_tls_handshakes_total",
            &["signature_algorithm=\"rsa_pss_rsae_sha256\""]
        ) >= 2.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_tickets_resume_and_survive_one_rotation() {
    let fx = start("", "").await;
    let sess = fx.dir.path().join("sess.pem");
    let sess_s = sess.to_str().unwrap();
    for tls in ["-tls1_2", "-tls1_3"] {
        // TLS 1.3 tickets arrive after the handshake: send a request so s_client reads them.
        let first = s_client_request(&fx, "localhost", &[tls, "-sess_out", sess_s]).await;
        assert!(
            first.contains("New,"),
            "{tls} first handshake is full:\n{first}"
        );
        let second = s_client_request(&fx, "localhost", &[tls, "-sess_in", sess_s]).await;
        assert!(
            second.contains("Reused,"),
            "{tls} second handshake resumes:\n{second}"
        );
    }
    // After one rotation the previous key still decrypts; after two it no longer does.
    let _ = run(openssl_s_client(
        &fx,
        "localhost",
        &["-tls1_2", "-sess_out", sess_s],
    ))
    .await;
    let before = fx.gw().metrics.render();
    let keys = fx.gw().listener_tickets("https").unwrap();
    keys.rotate();
    let after_one = s_client(&fx, "localhost", &["-tls1_2", "-sess_in", sess_s]).await;
    assert!(
        after_one.contains("Reused,"),
        "previous key still decrypts:\n{after_one}"
    );
    keys.rotate();
    keys.rotate();
    let after_three = s_client(&fx, "localhost", &["-tls1_2", "-sess_in", sess_s]).await;
    assert!(
        after_three.contains("New,"),
        "a retired key no longer decrypts:\n{after_three}"
    );
    let resumed_before = metric_sum(
        &before,
        "rampart_tls_handshakes_total",
        &["resumed=\"true\""],
    );
    let resumed_after = metric_sum(
        &fx.gw().metrics.render(),
        "rampart_tls_handshakes_total",
        &["resumed=\"true\""],
    );
    assert!(resumed_after > resumed_before);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls13_only_listener_refuses_tls12() {
    let fx = start("", "[listeners.tls]\nversions = [\"1.3\"]").await;
    let out = run(curl(&fx, &["--tlsv1.2", "--tls-max", "1.2", &fx.url("/")])).await;
    assert!(!out.status.success());
    let out = run(curl(&fx, &["--tlsv1.3", &fx.url("/")])).await;
    assert!(out.status.success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_ticket_key_file_stops_the_gateway_with_its_place_named() {
    let dir = tempfile::tempdir().unwrap();
    make_certs(dir.path());
    std::fs::write(dir.path().join("fleet.keys"), "00ff\n").unwrap();
    let text = config_text(
        &["127.0.0.1:9".parse().unwrap()],
        "",
        "tls.ticket_key_file = \"fleet.keys\"",
    );
    let path = dir.path().join("rampart.toml");
    std::fs::write(&path, text).unwrap();
    let cfg = gateway::config::Config::load(&path).unwrap();
    let e = format!(
        "{:#}",
        gateway::start(cfg, Default::default()).await.err().unwrap()
    );
    assert!(
        e.contains("listeners[0]") && e.contains("tls.ticket_key_file"),
        "{e}"
    );
    assert!(
        e.contains("fleet.keys: line 1: expected 160 hex digits"),
        "{e}"
    );
}

/// The leaf certificate of a PEM file, as `openssl s_client` prints it.
fn leaf_pem(path: &std::path::Path) -> String {
    let text = std::fs::read_to_string(path).unwrap();
    presented_certificate(&text).trim().to_string()
}

fn leaf_der(path: &std::path::Path) -> Vec<u8> {
    boring::x509::X509::from_pem(&std::fs::read(path).unwrap())
        .unwrap()
        .to_der()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn certificates_reload_in_place_over_tcp_and_quic_and_a_bad_reload_keeps_them() {
    let fx = start("", "[listeners.quic]\nenabled = true").await;
    let dir = fx.dir.path().to_path_buf();
    let quic = fx.gw().quic_listeners[0].1;
    let ecdsa_crt = dir.join("localhost-ecdsa.crt");
    let old_pem = leaf_pem(&ecdsa_crt);
    let out = s_client(&fx, "localhost", &["-sigalgs", "ECDSA+SHA256"]).await;
    assert_eq!(presented_certificate(&out).trim(), old_pem, "{out}");
    assert_eq!(
        quic_peer_certificate(quic).await.unwrap(),
        leaf_der(&ecdsa_crt)
    );

    // A renewed certificate with a new key, written over the configured files.
    let fresh = tempfile::tempdir().unwrap();
    gateway::demo::ensure_self_signed(
        fresh.path(),
        "renewed",
        gateway::demo::CertKind::EcdsaP256,
        &["localhost"],
    )
    .unwrap();
    std::fs::copy(fresh.path().join("renewed.crt"), &ecdsa_crt).unwrap();
    std::fs::copy(
        fresh.path().join("renewed.key"),
        dir.join("localhost-ecdsa.key"),
    )
    .unwrap();
    let new_pem = leaf_pem(&ecdsa_crt);
    assert_ne!(new_pem, old_pem);
    // Nothing changes until the reload.
    let out = s_client(&fx, "localhost", &["-sigalgs", "ECDSA+SHA256"]).await;
    assert_eq!(presented_certificate(&out).trim(), old_pem);

    fx.gw().reload_certificates().unwrap();
    // New handshakes over TCP and QUIC get the new certificate, signed with the new key (the
    // handshakes complete only if the signature verifies against it).
    let out = s_client(&fx, "localhost", &["-sigalgs", "ECDSA+SHA256"]).await;
    assert_eq!(presented_certificate(&out).trim(), new_pem, "{out}");
    assert!(out.contains("Peer signature type: ECDSA"), "{out}");
    assert_eq!(
        quic_peer_certificate(quic).await.unwrap(),
        leaf_der(&ecdsa_crt)
    );
    let status = curl_status(&fx, &["--http2", &fx.url("/headers")]).await;
    assert_eq!(status, "200");
    // The other certificates were read again too and still serve.
    let rsa = s_client(&fx, "other.test", &["-sigalgs", "RSA-PSS+SHA256"]).await;
    assert_eq!(
        presented_certificate(&rsa).trim(),
        leaf_pem(&dir.join("other-rsa.crt"))
    );

    // A broken file: the reload fails naming the field, and nothing is swapped.
    std::fs::write(dir.join("other-rsa.crt"), "not a certificate").unwrap();
    let err = format!("{:#}", fx.gw().reload_certificates().unwrap_err());
    assert!(
        err.contains("listeners[https].certificates[1].rsa"),
        "{err}"
    );
    assert!(err.contains("other-rsa.crt"), "{err}");
    let out = s_client(&fx, "localhost", &["-sigalgs", "ECDSA+SHA256"]).await;
    assert_eq!(presented_certificate(&out).trim(), new_pem);
    let rsa = s_client(&fx, "other.test", &["-sigalgs", "RSA-PSS+SHA256"]).await;
    assert!(rsa.contains("Peer signature type: RSA-PSS"), "{rsa}");

    // A key that does not match its certificate is refused the same way.
    std::fs::copy(
        dir.join("localhost-rsa.key"),
        dir.join("localhost-ecdsa.key"),
    )
    .unwrap();
    std::fs::copy(dir.join("localhost-rsa.crt"), dir.join("other-rsa.crt")).unwrap();
    let err = format!("{:#}", fx.gw().reload_certificates().unwrap_err());
    assert!(err.contains("certificates[0].ecdsa"), "{err}");
    let out = s_client(&fx, "localhost", &["-sigalgs", "ECDSA+SHA256"]).await;
    assert_eq!(presented_certificate(&out).trim(), new_pem);

    let m = fx.gw().metrics.render();
    assert_eq!(
        metric_sum(&m, "rampart_config_reloads_total", &["result=\"ok\""]),
        1.0
    );
    assert_eq!(
        metric_sum(&m, "rampart_config_reloads_total", &["result=\"error\""]),
        2.0
    );
}

/// `tls.early_data` over TCP: a resumed TLS 1.3 client's early data is accepted; a GET in it
/// goes upstream marked `Early-Data: 1`, a POST gets 425 (RFC 8470), as over HTTP/3. Without
/// the setting early data is declined and the handshake completes as usual.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls13_early_data_over_tcp_follows_rfc_8470() {
    let fx = start("", "tls.early_data = true").await;
    let dir = tempfile::tempdir().unwrap();
    let sess = dir.path().join("sess.pem");
    let sess_s = sess.to_str().unwrap();
    let first = s_client_request(&fx, "localhost", &["-tls1_3", "-sess_out", sess_s]).await;
    assert!(first.contains("New,"), "{first}");
    let early = |request: &str| {
        let file = dir.path().join("early.txt");
        std::fs::write(&file, request).unwrap();
        let cmd = format!(
            "printf '' | timeout 20 openssl s_client -connect 127.0.0.1:{} -servername localhost \
             -tls1_3 -sess_in {sess_s} -early_data {} -ign_eof",
            fx.port(),
            file.display()
        );
        async move {
            let mut c = std::process::Command::new("sh");
            c.arg("-c").arg(cmd);
            stdout(&run(c).await)
        }
    };
    let out = early("GET /headers HTTP/1.0\r\nHost: localhost\r\n\r\n").await;
    assert!(out.contains("Early data was accepted"), "{out}");
    assert!(
        out.contains("HTTP/1.0 200") || out.contains("HTTP/1.1 200"),
        "{out}"
    );
    assert!(
        out.contains("\"early-data\": \"1\""),
        "marked upstream: {out}"
    );
    let out = early("POST /echo HTTP/1.0\r\nHost: localhost\r\nContent-Length: 1\r\n\r\nx").await;
    assert!(out.contains("Early data was accepted"), "{out}");
    assert!(out.contains(" 425 "), "{out}");
    let m = fx.gw().metrics.render();
    assert!(
        metric_sum(&m, "rampart_quic_early_data_rejected_total", &[]) >= 1.0,
        "{m}"
    );

    // Without the setting the tickets allow no early data: the client sends none and resumes.
    let plain = start("", "").await;
    let first = s_client_request(&plain, "localhost", &["-tls1_3", "-sess_out", sess_s]).await;
    assert!(first.contains("New,"), "{first}");
    let cmd = format!(
        "printf '' | timeout 3 openssl s_client -connect 127.0.0.1:{} -servername localhost \
         -tls1_3 -sess_in {sess_s} -early_data {} -ign_eof",
        plain.port(),
        dir.path().join("early.txt").display()
    );
    let mut c = std::process::Command::new("sh");
    c.arg("-c").arg(cmd);
    let out = stdout(&run(c).await);
    assert!(out.contains("Early data was not sent"), "{out}");
    assert!(out.contains("Reused,"), "{out}");
}

/// `tls.client_auth`: certificates from the client CA pass, with their subject, names and
/// hash going upstream in headers (a client's own copies of those headers are dropped); no
/// certificate, one from another CA, or a revoked one does not. With `optional`, clients
/// without one are served, and a route with `client_cert = "required"` refuses them (403).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_certificates_are_verified_and_passed_upstream() {
    let dir = client_certs();
    let p = |f: &str| dir.path().join(f).display().to_string();
    let listener = |auth: &str| client_auth_listener(dir.path(), auth);
    let required = start("", &listener("required")).await;
    let with = |who: &str| {
        vec![
            "--cert".to_string(),
            p(&format!("{who}.pem")),
            "--key".into(),
            p(&format!("{who}.key")),
        ]
    };
    let (ok, body) = curl_args(&required, with("alice"), "/headers").await;
    assert!(ok, "{body}");
    assert!(
        body.contains("\"x-client-cert-subject\": \"O=Example,CN=alice\""),
        "{body}"
    );
    assert!(
        body.contains("\"x-client-cert-san\": \"DNS:alice.example\""),
        "{body}"
    );
    assert!(body.contains("\"x-client-cert-sha256\": \""), "{body}");
    assert!(
        !body.contains("CN=root"),
        "the client's own copy was dropped: {body}"
    );
    for (who, why) in [("bob", "revoked"), ("mallory", "another CA")] {
        let (ok, body) = curl_args(&required, with(who), "/headers").await;
        assert!(!ok, "{who} ({why}) was served: {body}");
    }
    let (ok, body) = curl_args(&required, vec![], "/headers").await;
    assert!(!ok, "no certificate was served: {body}");

    // optional: served without a certificate (and without the headers, whatever the client
    // sent); a route that requires one answers 403 then.
    let optional = start_edited(&listener("optional"), |text, _| {
        text.replace(
            "[[routes]]\ncluster = \"app\"",
            "[[routes]]\ncluster = \"app\"\n\n[[routes]]\npath_prefix = \"/bytes/\"\ncluster = \"app\"\nclient_cert = \"required\"\n\n[[routes]]\npath_prefix = \"/text/\"\ncluster = \"app\"\nclient_cert_match = [{ name = \"subject\", exact = \"O=Example,CN=alice\" }]\nresponse_headers = { set = { \"x-route\" = \"alice-only\" } }",
        )
    })
    .await;
    let (ok, body) = curl_args(&optional, vec![], "/headers").await;
    assert!(ok, "{body}");
    assert!(!body.contains("x-client-cert-subject"), "{body}");
    let status = |mut args: Vec<String>| {
        args.extend(["-o", "/dev/null", "-w", "%{http_code}"].map(String::from));
        curl_args(&optional, args, "/bytes/3")
    };
    assert_eq!(status(vec![]).await.1, "403");
    assert_eq!(status(with("alice")).await.1, "200");
    // A route matched on the certificate's subject takes alice's requests only; others fall
    // through to the catch-all route.
    let route_of = |mut args: Vec<String>| {
        args.extend(["-D", "-", "-o", "/dev/null"].map(String::from));
        curl_args(&optional, args, "/text/3")
    };
    let (ok, head) = route_of(with("alice")).await;
    assert!(ok && head.contains("x-route: alice-only"), "{head}");
    let (ok, head) = route_of(vec![]).await;
    assert!(ok && !head.contains("x-route"), "{head}");
}

/// A certificate entry's own `client_auth`: its names ask for client certificates while the
/// listener's other names do not, and a session made on a name that asked for none does not
/// resume on one that requires one (it would let a client in without a certificate).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_certificates_per_server_name() {
    let dir = client_certs();
    let p = |f: &str| dir.path().join(f).display().to_string();
    let entry = format!(
        "server_names = [\"other.test\", \"*.other.test\"]\nclient_auth = \"required\"\nclient_ca = \"{}\"\nclient_crl = \"{}\"\n",
        p("ca.pem"),
        p("ca.crl")
    );
    let fx = start_edited("", move |text, _| {
        text.replace(
            "server_names = [\"other.test\", \"*.other.test\"]\n",
            &entry,
        )
    })
    .await;
    let alice = vec![
        "--cert".to_string(),
        p("alice.pem"),
        "--key".into(),
        p("alice.key"),
    ];
    let (ok, body) = curl_args(&fx, vec![], "/headers").await;
    assert!(ok, "localhost asks for no certificate: {body}");
    assert!(!body.contains("x-client-cert-subject"), "{body}");
    let other = |args: Vec<String>| {
        let mut args = args;
        args.extend([
            "-H".into(),
            "x-client-cert-subject: CN=root".into(),
            format!("https://other.test:{}/headers", fx.port()),
        ]);
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        let cmd = curl(&fx, &refs);
        async move {
            let out = run(cmd).await;
            (out.status.success(), stdout(&out))
        }
    };
    let (ok, body) = other(vec![]).await;
    assert!(!ok, "other.test requires a certificate: {body}");
    let (ok, body) = other(alice).await;
    assert!(ok, "{body}");
    assert!(
        body.contains("\"x-client-cert-subject\": \"O=Example,CN=alice\""),
        "{body}"
    );
    // A connection made for localhost (no certificate asked) cannot carry requests for
    // other.test: 421, over HTTP/1.1 and HTTP/2, so the client connects again naming it. Nor
    // the other way: a certificate made for other.test does not stand for localhost's rules.
    let status_for = |host: &str, mut args: Vec<String>| {
        args.extend([
            "-H".to_string(),
            format!("Host: {host}"),
            "-o".into(),
            "/dev/null".into(),
            "-w".into(),
            "%{http_code}".into(),
        ]);
        curl_args(&fx, args, "/headers")
    };
    for http in ["--http1.1", "--http2"] {
        let h = || vec![http.to_string()];
        assert_eq!(status_for("other.test", h()).await.1, "421", "{http}");
        assert_eq!(status_for("a.other.test", h()).await.1, "421", "{http}");
        assert_eq!(status_for("localhost", h()).await.1, "200", "{http}");
    }
    let (ok, body) = other(vec![
        "-H".into(),
        "Host: localhost".into(),
        "--cert".into(),
        p("alice.pem"),
        "--key".into(),
        p("alice.key"),
    ])
    .await;
    assert!(ok && body.contains("misdirected request"), "{body}");
    let m = fx.gw().metrics.render();
    assert_eq!(
        metric_sum(&m, "rampart_http_misdirected_requests_total", &[]),
        5.0,
        "{m}"
    );
    // A session from localhost offered to other.test: not resumed.
    let sess = dir.path().join("localhost.sess");
    let sess = sess.to_str().unwrap();
    let first = s_client_request(&fx, "localhost", &["-tls1_3", "-sess_out", sess]).await;
    assert!(first.contains("New,"), "{first}");
    let again = s_client_request(&fx, "other.test", &["-tls1_3", "-sess_in", sess]).await;
    assert!(
        !again.contains("Reused,"),
        "resumed without a certificate: {again}"
    );
    assert!(
        !again.contains("HTTP/1.1 200"),
        "served without a certificate: {again}"
    );
}

/// curl with `args` (and a client's own `x-client-cert-subject`) to `path`: whether it
/// succeeded, and its output.
async fn curl_args(fx: &Fixture, mut args: Vec<String>, path: &str) -> (bool, String) {
    args.extend([
        "-H".into(),
        "x-client-cert-subject: CN=root".into(),
        fx.url(path),
    ]);
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = run(curl(fx, &refs)).await;
    (out.status.success(), stdout(&out))
}

/// A client CA file that is not PEM stops the gateway with the field and the file named; a
/// client_auth without a CA is refused at load.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_ca_that_is_not_pem_is_refused_naming_field_and_file() {
    let dir = tempfile::tempdir().unwrap();
    make_certs(dir.path());
    let bad = dir.path().join("not-a-ca.pem");
    std::fs::write(&bad, "hello\n").unwrap();
    let upstream = "127.0.0.1:9".parse().unwrap();
    let text = config_text(
        &[upstream],
        "",
        &format!(
            "tls.client_auth = \"required\"\ntls.client_ca = \"{}\"",
            bad.display()
        ),
    );
    let path = dir.path().join("rampart.toml");
    std::fs::write(&path, &text).unwrap();
    let cfg = gateway::config::Config::load(&path).unwrap();
    let e = gateway::start(cfg, Default::default())
        .await
        .err()
        .expect("refused");
    let e = format!("{e:#}");
    assert!(e.contains("tls.client_ca"), "{e}");
    assert!(e.contains("not-a-ca.pem"), "{e}");
    assert!(e.contains("expected PEM certificates"), "{e}");

    std::fs::write(
        &path,
        config_text(&[upstream], "", "tls.client_auth = \"optional\""),
    )
    .unwrap();
    let e = gateway::config::Config::load(&path).unwrap_err();
    assert_eq!(e.path, "listeners[0].tls.client_ca", "{e}");
    // A certificate entry's own client_auth needs a CA too (its own or the listener's).
    std::fs::write(
        &path,
        config_text(&[upstream], "", "").replace(
            "server_names = [\"other.test\", \"*.other.test\"]\n",
            "server_names = [\"other.test\", \"*.other.test\"]\nclient_auth = \"required\"\n",
        ),
    )
    .unwrap();
    let e = gateway::config::Config::load(&path).unwrap_err();
    assert_eq!(e.path, "listeners[0].certificates[1].client_ca", "{e}");
}

/// The OCSP test PKI (`data/ocsp-certs.sh`) made in `dir`, and the config's localhost RSA
/// certificate swapped for its `site` with the response `response` stapled.
fn with_ocsp(text: String, dir: &std::path::Path, response: &str) -> String {
    ocsp_pki(dir, 1);
    text.replace(
        r#"rsa = { cert = "localhost-rsa.crt", key = "localhost-rsa.key" }"#,
        &format!(
            r#"rsa = {{ cert = "site-chain.pem", key = "site.key", ocsp_response = "{response}" }}"#
        ),
    )
}

/// OCSP stapling from a response file: `openssl s_client -status` sees the response for the
/// RSA certificate that has one (and none for the ECDSA one, which has none); a client that
/// does not ask gets none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ocsp_response_is_stapled_to_clients_that_ask() {
    let fx = start_edited("", |t, d| with_ocsp(t, d, "site-good.der")).await;
    let rsa = ["-sigalgs", "rsa_pss_rsae_sha256", "-tls1_3"];
    let out = s_client(&fx, "localhost", &[&rsa[..], &["-status"]].concat()).await;
    assert!(out.contains("OCSP Response Status: successful"), "{out}");
    assert!(out.contains("Cert Status: good"), "{out}");
    assert!(out.contains("site-ca"), "the response's responder: {out}");
    let out = s_client(&fx, "localhost", &rsa).await;
    assert!(!out.contains("OCSP Response"), "{out}");
    let ecdsa = ["-sigalgs", "ecdsa_secp256r1_sha256", "-tls1_3", "-status"];
    let out = s_client(&fx, "localhost", &ecdsa).await;
    assert!(out.contains("OCSP response: no response sent"), "{out}");
    // TLS 1.2 carries it in CertificateStatus rather than the certificate's extension.
    let out = s_client(
        &fx,
        "localhost",
        &["-sigalgs", "RSA-PSS+SHA256", "-tls1_2", "-status"],
    )
    .await;
    assert!(out.contains("Cert Status: good"), "{out}");
}

/// The same stapling over HTTP/3: aioquic, asking with status_request, finds the response in
/// the leaf certificate's entry (TLS 1.3) when the RSA certificate is chosen, and none with
/// the ECDSA one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ocsp_response_is_stapled_over_http3_too() {
    let fx = start_edited("[listeners.quic]\nenabled = true", |t, d| {
        with_ocsp(t, d, "site-good.der")
    })
    .await;
    let port = fx.gw().quic_listeners[0].1.port().to_string();
    let want = std::fs::read(fx.dir.path().join("site-good.der")).unwrap();
    let want: String = boring::sha::sha256(&want)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    for (extra, stapled) in [(Some("--rsa-only"), true), (None, false)] {
        let mut c = std::process::Command::new("python3");
        c.arg(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/h3_client.py"))
            .args(["--port", &port, "--path", "/", "--ocsp"])
            .args(extra);
        let out = tokio::task::spawn_blocking(move || c.output().unwrap())
            .await
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let line: serde_json::Value =
            serde_json::from_slice(out.stdout.split(|&b| b == b'\n').next().unwrap()).unwrap();
        assert_eq!(line["status"], 200, "{line}");
        match stapled {
            true => assert_eq!(line["ocsp_sha256"], want.as_str(), "{line}"),
            false => assert!(line["ocsp_sha256"].is_null(), "{line}"),
        }
    }
}

/// A response that is not for the certificate, or says it is revoked, is refused at load with
/// the field and the file named: nothing starts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ocsp_response_for_another_certificate_is_refused_naming_the_file() {
    for (file, says) in [
        ("other-good.der", "another certificate"),
        ("site-revoked.der", "revoked"),
    ] {
        let dir = tempfile::tempdir().unwrap();
        make_certs(dir.path());
        let text = with_ocsp(
            config_text(&["127.0.0.1:9".parse().unwrap()], "", ""),
            dir.path(),
            file,
        );
        let e = start_refused(dir.path(), &text).await;
        assert!(
            e.contains("certificates[0].rsa") && e.contains(file) && e.contains(says),
            "{e}"
        );
    }
}

/// OCSP stapling with `ocsp_fetch`: the response is fetched from a real responder (`openssl
/// ocsp -port`) that the certificate's Authority Information Access names, stapled, and kept
/// while the responder is down (until it would go stale).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ocsp_response_fetched_from_the_responder_is_stapled_and_outlives_it() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let dir = tempfile::tempdir().unwrap();
    make_certs(dir.path());
    ocsp_pki(dir.path(), port);
    let mut responder = std::process::Command::new("openssl")
        // Debian's openssl 3.0 takes a port only (it listens on every address); the gateway
        // asks it on 127.0.0.1, as the certificate says.
        .args(["ocsp", "-index", "index.txt", "-port"])
        .arg(port.to_string())
        .args([
            "-rsigner", "ca.pem", "-rkey", "ca.key", "-CA", "ca.pem", "-ndays", "1",
        ])
        .current_dir(dir.path())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let upstream = gateway::demo::spawn_upstream("127.0.0.1:0".parse().unwrap(), None)
        .await
        .unwrap();
    let text = config_text(&[upstream], "", "").replace(
        r#"rsa = { cert = "localhost-rsa.crt", key = "localhost-rsa.key" }"#,
        r#"rsa = { cert = "site-chain.pem", key = "site.key", ocsp_fetch = true }"#,
    );
    let fx = start_with(&text, dir, upstream, None).await;
    let rsa = ["-sigalgs", "rsa_pss_rsae_sha256", "-tls1_3", "-status"];
    let mut out = String::new();
    for _ in 0..100 {
        out = s_client(&fx, "localhost", &rsa).await;
        if out.contains("Cert Status: good") {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert!(out.contains("Cert Status: good"), "never stapled: {out}");
    let m = fx.gw().metrics.render();
    assert!(
        metric_sum(&m, "rampart_tls_ocsp_fetches_total", &[]) >= 1.0,
        "{m}"
    );
    // The responder goes away: the response it gave stays stapled.
    responder.kill().unwrap();
    responder.wait().unwrap();
    let out = s_client(&fx, "localhost", &rsa).await;
    assert!(out.contains("Cert Status: good"), "{out}");
}

/// A certificate without an OCSP responder cannot fetch: refused at start, naming the field.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ocsp_fetch_without_a_responder_in_the_certificate_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    make_certs(dir.path());
    std::fs::write(
        dir.path().join("chain.pem"),
        [
            std::fs::read(dir.path().join("localhost-rsa.crt")).unwrap(),
            std::fs::read(dir.path().join("other-rsa.crt")).unwrap(),
        ]
        .concat(),
    )
    .unwrap();
    let text = config_text(&["127.0.0.1:9".parse().unwrap()], "", "").replace(
        r#"rsa = { cert = "localhost-rsa.crt", key = "localhost-rsa.key" }"#,
        r#"rsa = { cert = "chain.pem", key = "localhost-rsa.key", ocsp_fetch = true }"#,
    );
    let e = start_refused(dir.path(), &text).await;
    assert!(
        e.contains("certificates[0].rsa")
            && e.contains("ocsp_fetch")
            && e.contains("no OCSP responder"),
        "{e}"
    );
}
