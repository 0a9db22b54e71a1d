//! The demo kit: self-signed certificates and an embedded HTTP/1.1 + h2c upstream, used by
//! `rampart demo` and by tests as a real upstream server.

use anyhow::Context as _;
use boring::asn1::Asn1Time;
use boring::bn::{BigNum, MsbOption};
use boring::ec::{EcGroup, EcKey};
use boring::hash::MessageDigest;
use boring::nid::Nid;
use boring::pkey::{PKey, Private};
use boring::rsa::Rsa;
use boring::x509::extension::SubjectAlternativeName;
use boring::x509::{X509Builder, X509Name, X509};
use bytes::Bytes;
use futures_util::stream;
use http::{header, Method, Request, Response, StatusCode};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;
use tokio::net::TcpListener;

/// Key type of a generated certificate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CertKind {
    Rsa2048,
    EcdsaP256,
}

fn generate_key(kind: CertKind) -> anyhow::Result<PKey<Private>> {
    Ok(match kind {
        CertKind::Rsa2048 => PKey::from_rsa(Rsa::generate(2048)?)?,
        CertKind::EcdsaP256 => {
            let group = EcGroup::from_curve_name(Nid::X9_62_PRIME256V1)?;
            PKey::from_ec_key(EcKey::generate(&group)?)?
        }
    })
}

/// A certificate builder with version 3, a random serial, subject `CN=common_name`, `key`'s
/// public half and `days` of validity. Returns it with the subject name; the caller sets the
/// issuer and extensions and signs.
fn cert_builder(
    common_name: &str,
    key: &PKey<Private>,
    days: u32,
) -> anyhow::Result<(X509Builder, X509Name)> {
    let mut name = X509Name::builder()?;
    name.append_entry_by_nid(Nid::COMMONNAME, common_name)?;
    let name = name.build();
    let mut b = X509::builder()?;
    b.set_version(2)?;
    let mut serial = BigNum::new()?;
    serial.rand(64, MsbOption::MAYBE_ZERO, false)?;
    let serial = serial.to_asn1_integer()?;
    b.set_serial_number(&serial)?;
    b.set_subject_name(&name)?;
    b.set_pubkey(key)?;
    let not_before = Asn1Time::days_from_now(0)?;
    let not_after = Asn1Time::days_from_now(days)?;
    b.set_not_before(&not_before)?;
    b.set_not_after(&not_after)?;
    Ok((b, name))
}

/// `<stem>.crt` and `<stem>.key` in `dir`, and whether both exist already.
fn pair_paths(dir: &Path, stem: &str) -> (PathBuf, PathBuf, bool) {
    let cert = dir.join(format!("{stem}.crt"));
    let key = dir.join(format!("{stem}.key"));
    let exists = cert.is_file() && key.is_file();
    (cert, key, exists)
}

fn write_pair(
    cert_path: &Path,
    key_path: &Path,
    cert: &X509,
    key: &PKey<Private>,
) -> anyhow::Result<()> {
    std::fs::write(cert_path, cert.to_pem()?)?;
    write_private(key_path, &key.private_key_to_pem_pkcs8()?)?;
    Ok(())
}

/// Writes a self-signed certificate for `names` and its PKCS#8 key (mode 0600) as
/// `<stem>.crt` / `<stem>.key` in `dir`, unless both already exist. Returns their paths.
pub fn ensure_self_signed(
    dir: &Path,
    stem: &str,
    kind: CertKind,
    names: &[&str],
) -> anyhow::Result<(PathBuf, PathBuf)> {
    let (cert_path, key_path, exists) = pair_paths(dir, stem);
    if exists {
        return Ok((cert_path, key_path));
    }
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let key = generate_key(kind)?;
    let (mut b, name) = cert_builder(names[0], &key, 365)?;
    b.set_issuer_name(&name)?;
    let mut san = SubjectAlternativeName::new();
    for n in names {
        san.dns(n);
    }
    let san = san.build(&b.x509v3_context(None, None))?;
    b.append_extension(&san)?;
    server_leaf_extensions(&mut b, kind)?;
    b.sign(&key, MessageDigest::sha256())?;
    write_pair(&cert_path, &key_path, &b.build(), &key)?;
    Ok((cert_path, key_path))
}

/// What strict verifiers (OpenSSL's `-x509_strict`, webpki, Go) expect of a server's
/// certificate, here a self-signed one trusted as it is: not a CA, for signatures (and, for
/// RSA, key encipherment in TLS 1.2), for server authentication, with key identifiers.
fn server_leaf_extensions(b: &mut X509Builder, kind: CertKind) -> anyhow::Result<()> {
    use boring::x509::extension::{
        AuthorityKeyIdentifier, BasicConstraints, ExtendedKeyUsage, KeyUsage, SubjectKeyIdentifier,
    };
    let bc = BasicConstraints::new().critical().build()?;
    b.append_extension(&bc)?;
    let mut ku = KeyUsage::new();
    ku.critical().digital_signature();
    if kind == CertKind::Rsa2048 {
        ku.key_encipherment();
    }
    let ku = ku.build()?;
    b.append_extension(&ku)?;
    let eku = ExtendedKeyUsage::new().server_auth().build()?;
    b.append_extension(&eku)?;
    let ski = SubjectKeyIdentifier::new().build(&b.x509v3_context(None, None))?;
    b.append_extension(&ski)?;
    // Self-signed: the authority's key identifier is the certificate's own.
    let aki = AuthorityKeyIdentifier::new()
        .keyid(true)
        .build(&b.x509v3_context(None, None))?;
    b.append_extension(&aki)?;
    Ok(())
}

/// A certificate authority for the key-server link (mutual TLS): `<stem>.crt`/`<stem>.key`.
pub fn ensure_ca(dir: &Path, stem: &str, common_name: &str) -> anyhow::Result<(PathBuf, PathBuf)> {
    let (cert_path, key_path, exists) = pair_paths(dir, stem);
    if exists {
        return Ok((cert_path, key_path));
    }
    std::fs::create_dir_all(dir)?;
    let key = generate_key(CertKind::EcdsaP256)?;
    let (mut b, name) = cert_builder(common_name, &key, 3650)?;
    b.set_issuer_name(&name)?;
    let bc = boring::x509::extension::BasicConstraints::new()
        .critical()
        .ca()
        .build()?;
    b.append_extension(&bc)?;
    let ku = boring::x509::extension::KeyUsage::new()
        .critical()
        .key_cert_sign()
        .crl_sign()
        .build()?;
    b.append_extension(&ku)?;
    b.sign(&key, MessageDigest::sha256())?;
    write_pair(&cert_path, &key_path, &b.build(), &key)?;
    Ok((cert_path, key_path))
}

/// A certificate for `names` (ECDSA P-256) signed by the CA at `ca_cert`/`ca_key`, for a key
/// server (`names` = its DNS names) or a gateway's client identity.
pub fn issue_signed(
    dir: &Path,
    stem: &str,
    ca_cert: &Path,
    ca_key: &Path,
    names: &[&str],
) -> anyhow::Result<(PathBuf, PathBuf)> {
    let (cert_path, key_path, _) = pair_paths(dir, stem);
    let ca = X509::from_pem(&std::fs::read(ca_cert)?)?;
    let ca_pkey = PKey::private_key_from_pem(&std::fs::read(ca_key)?)?;
    let key = generate_key(CertKind::EcdsaP256)?;
    let (mut b, _) = cert_builder(names[0], &key, 365)?;
    b.set_issuer_name(ca.subject_name())?;
    let mut san = SubjectAlternativeName::new();
    for n in names {
        san.dns(n);
    }
    let san = san.build(&b.x509v3_context(Some(&ca), None))?;
    b.append_extension(&san)?;
    b.sign(&ca_pkey, MessageDigest::sha256())?;
    write_pair(&cert_path, &key_path, &b.build(), &key)?;
    Ok((cert_path, key_path))
}

fn write_private(path: &Path, data: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .write(true)
        .truncate(true)
        .mode(0o600)
        .open(path)?;
    f.write_all(data)
}

type DemoBody = BoxBody<Bytes, hyper::Error>;

fn full(status: StatusCode, ctype: &'static str, body: impl Into<Bytes>) -> Response<DemoBody> {
    let mut r = Response::new(Full::new(body.into()).map_err(|n| match n {}).boxed());
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static(ctype),
    );
    r
}

/// `n` bytes of `'x'`, streamed in 64 KiB chunks with a content-length.
fn bytes_body(n: u64) -> Response<DemoBody> {
    const CHUNK: u64 = 64 * 1024;
    let chunk = Bytes::from(vec![b'x'; CHUNK as usize]);
    let frames = stream::iter((0..n.div_ceil(CHUNK)).map(move |i| {
        let len = CHUNK.min(n - i * CHUNK) as usize;
        Ok::<_, hyper::Error>(Frame::data(chunk.slice(..len)))
    }));
    let mut r = Response::new(BodyExt::boxed(StreamBody::new(frames)));
    r.headers_mut().insert(header::CONTENT_LENGTH, n.into());
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("application/octet-stream"),
    );
    r
}

async fn demo_service(req: Request<Incoming>) -> Result<Response<DemoBody>, hyper::Error> {
    let path = req.uri().path().to_string();
    // HEAD is answered as GET; hyper leaves the body out.
    let method = if req.method() == Method::HEAD {
        Method::GET
    } else {
        req.method().clone()
    };
    Ok(match (&method, path.as_str()) {
        (&Method::GET, "/") => full(
            StatusCode::OK,
            "text/html; charset=utf-8",
            "<!doctype html><title>rampart demo</title><h1>Hello from the rampart demo upstream</h1>\n<p>Try /bytes/1024, /text/1024, /headers, POST /echo, POST /discard, /delay/100</p>\n",
        ),
        (&Method::GET, "/headers") => {
            let map: serde_json::Map<String, serde_json::Value> = req
                .headers()
                .iter()
                .map(|(k, v)| (k.as_str().to_string(), String::from_utf8_lossy(v.as_bytes()).into()))
                .collect();
            full(StatusCode::OK, "application/json", serde_json::to_vec_pretty(&map).unwrap_or_default())
        }
        (&Method::POST | &Method::PUT, "/discard") => {
            // Reads the whole body and answers how many bytes it had: the sink of the upload
            // benchmarks.
            let mut body = req.into_body();
            let mut n = 0u64;
            while let Some(frame) = body.frame().await {
                if let Some(d) = frame?.data_ref() {
                    n += d.len() as u64;
                }
            }
            full(StatusCode::OK, "text/plain", format!("{n}\n"))
        }
        (&Method::POST | &Method::PUT, "/echo") => {
            let ctype = req.headers().get(header::CONTENT_TYPE).cloned();
            let len = req.headers().get(header::CONTENT_LENGTH).cloned();
            let mut r = Response::new(req.into_body().boxed());
            if let Some(c) = ctype {
                r.headers_mut().insert(header::CONTENT_TYPE, c);
            }
            if let Some(l) = len {
                r.headers_mut().insert(header::CONTENT_LENGTH, l);
            }
            r
        }
        (&Method::GET, p) if p.starts_with("/bytes/") => match p["/bytes/".len()..].parse::<u64>() {
            Ok(n) if n <= 1 << 40 => bytes_body(n),
            _ => full(StatusCode::BAD_REQUEST, "text/plain", "usage: /bytes/N\n"),
        },
        (&Method::GET, p) if p.starts_with("/text/") => match p["/text/".len()..].parse::<usize>() {
            Ok(n) if n <= 1 << 30 => {
                let line = b"The quick brown fox jumps over the lazy dog. ";
                let text: Vec<u8> = line.iter().copied().cycle().take(n).collect();
                full(StatusCode::OK, "text/plain; charset=utf-8", text)
            }
            _ => full(StatusCode::BAD_REQUEST, "text/plain", "usage: /text/N\n"),
        },
        (&Method::GET, p) if p.starts_with("/delay/") => match p["/delay/".len()..].parse::<u64>() {
            Ok(ms) if ms <= 600_000 => {
                tokio::time::sleep(Duration::from_millis(ms)).await;
                full(StatusCode::OK, "text/plain", format!("slept {ms} ms\n"))
            }
            _ => full(StatusCode::BAD_REQUEST, "text/plain", "usage: /delay/MS\n"),
        },
        _ => full(StatusCode::NOT_FOUND, "text/plain", "not found\n"),
    })
}

/// Serves the demo upstream on `listener` until the task is dropped.
pub async fn serve_upstream(listener: TcpListener) {
    loop {
        let Ok((tcp, _)) = listener.accept().await else {
            continue;
        };
        let _ = tcp.set_nodelay(true);
        tokio::spawn(async move {
            // HTTP/1.1 or h2c (prior knowledge), whichever the client speaks.
            let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(tcp), service_fn(demo_service))
                .await;
        });
    }
}

/// Binds `addr` (port 0 for any) and serves the demo upstream in the background. With
/// `tcp_congestion`, its connections send with that kernel congestion control (see
/// [`bind_upstream`]); else with the kernel's default.
pub async fn spawn_upstream(
    addr: SocketAddr,
    tcp_congestion: Option<&str>,
) -> std::io::Result<SocketAddr> {
    let l = bind_upstream(addr, tcp_congestion).await?;
    let bound = l.local_addr()?;
    tokio::spawn(serve_upstream(l));
    Ok(bound)
}

/// Binds the demo upstream's listener. With `tcp_congestion`, the connections it accepts send
/// with that kernel congestion control (they inherit it from the listener) instead of the
/// kernel's default. Benchmarks pin it: on loopback without an `fq` qdisc, a BBR sender paces
/// with per-socket timers, and those fire on whichever CPU processed the ACK that armed them,
/// which is often the gateway's (see docs/benchmarks-history.md).
async fn bind_upstream(
    addr: SocketAddr,
    tcp_congestion: Option<&str>,
) -> std::io::Result<TcpListener> {
    let l = TcpListener::bind(addr).await?;
    if let Some(name) = tcp_congestion {
        socket2::SockRef::from(&l)
            .set_tcp_congestion(name.as_bytes())
            .map_err(|e| {
                std::io::Error::new(
                    e.kind(),
                    format!(
                        "TCP congestion control {name:?}: {e} (the kernel offers those in \
                         /proc/sys/net/ipv4/tcp_available_congestion_control; without \
                         CAP_NET_ADMIN, those in tcp_allowed_congestion_control)"
                    ),
                )
            })?;
    }
    Ok(l)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn self_signed_certificates_pass_a_strict_verifier() {
        let dir = tempfile::tempdir().unwrap();
        for (stem, kind) in [("rsa", CertKind::Rsa2048), ("ecdsa", CertKind::EcdsaP256)] {
            let (cert, _) = ensure_self_signed(dir.path(), stem, kind, &["localhost"]).unwrap();
            let cert = cert.to_str().unwrap();
            let out = std::process::Command::new("openssl")
                .args([
                    "verify",
                    "-x509_strict",
                    "-purpose",
                    "sslserver",
                    "-CAfile",
                    cert,
                    cert,
                ])
                .output()
                .unwrap();
            let said = String::from_utf8_lossy(&out.stdout).to_string()
                + &String::from_utf8_lossy(&out.stderr);
            assert!(out.status.success(), "{stem}: {said}");
            let text = std::process::Command::new("openssl")
                .args(["x509", "-noout", "-text", "-in", cert])
                .output()
                .unwrap();
            let text = String::from_utf8_lossy(&text.stdout);
            for ext in [
                "X509v3 Basic Constraints: critical",
                "CA:FALSE",
                "X509v3 Key Usage: critical",
                "Digital Signature",
                "TLS Web Server Authentication",
                "X509v3 Subject Key Identifier",
                "X509v3 Authority Key Identifier",
            ] {
                assert!(text.contains(ext), "{stem}: no {ext:?} in\n{text}");
            }
        }
    }

    fn congestion(s: socket2::SockRef<'_>) -> String {
        let name = s.tcp_congestion().expect("TCP_CONGESTION");
        String::from_utf8_lossy(&name)
            .trim_end_matches('\0')
            .to_owned()
    }

    #[tokio::test]
    async fn upstream_connections_send_with_the_named_congestion_control() {
        // reno is built into every kernel and allowed without privileges.
        let l = bind_upstream("127.0.0.1:0".parse().unwrap(), Some("reno"))
            .await
            .unwrap();
        let addr = l.local_addr().unwrap();
        let _client = tokio::net::TcpStream::connect(addr).await.unwrap();
        let (accepted, _) = l.accept().await.unwrap();
        assert_eq!(congestion(socket2::SockRef::from(&accepted)), "reno");
    }

    #[tokio::test]
    async fn an_unknown_congestion_control_is_an_error_that_names_it() {
        let err = bind_upstream("127.0.0.1:0".parse().unwrap(), Some("no-such-cc"))
            .await
            .unwrap_err();
        assert!(err.to_string().contains("\"no-such-cc\""), "{err}");
    }
}
