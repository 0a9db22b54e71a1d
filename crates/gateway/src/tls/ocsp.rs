//! OCSP stapling (RFC 6066 §8, RFC 6960): a certificate's OCSP response, checked before it is
//! ever stapled, and served only while it is fresh.
//!
//! A response is accepted when it is a successful basic response, names this certificate
//! (issuer name and key hashes and serial number, SHA-1 or SHA-256 CertID), says `good`, is
//! signed by the issuer or by a responder certificate the issuer signed for OCSP signing, was
//! produced no later than now (with a few minutes' skew) and carries a `nextUpdate` still
//! ahead. It is stapled to handshakes of clients that ask (`status_request`) until
//! [`STALE_MARGIN`] before its `nextUpdate`; after that, none is stapled (counted and logged
//! once) rather than a stale one.

use boring::hash::MessageDigest;
use boring::x509::X509;
use der::{Decode, Encode};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};
use x509_cert::Certificate;
use x509_ocsp::{BasicOcspResponse, CertStatus, OcspResponse, OcspResponseStatus};

/// A response stops being stapled this long before its `nextUpdate` (clients' clocks run
/// ahead; a response that expires mid-connection helps nobody).
pub const STALE_MARGIN: Duration = Duration::from_secs(60);
/// How far ahead of this gateway's clock a response's `producedAt`/`thisUpdate` may be.
const CLOCK_SKEW: Duration = Duration::from_secs(300);

/// Why a response was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum OcspError {
    #[error("not a DER OCSP response: {0}")]
    Malformed(String),
    #[error("the responder answered {0:?}, not successful")]
    Unsuccessful(String),
    #[error(
        "the response is for another certificate (no entry for serial {serial} of this issuer)"
    )]
    OtherCertificate { serial: String },
    #[error("the certificate's status is {0}, not good")]
    NotGood(&'static str),
    #[error("the response's signature does not verify with the issuer's key or a responder certificate it issued for OCSP signing")]
    BadSignature,
    #[error("the response is not valid now: {0}")]
    NotCurrent(String),
    #[error("the certificate chain has no issuer certificate after the leaf (OCSP needs it)")]
    NoIssuer,
}

/// A checked response and when it stops being fresh.
#[derive(Debug, Clone)]
pub struct Checked {
    pub der: Arc<[u8]>,
    pub this_update: SystemTime,
    pub next_update: SystemTime,
}

/// Checks `response` (DER) for `leaf` issued by `issuer` at `now`.
pub fn check(
    response: &[u8],
    leaf: &X509,
    issuer: &X509,
    now: SystemTime,
) -> Result<Checked, OcspError> {
    let outer = OcspResponse::from_der(response).map_err(malformed)?;
    if outer.response_status != OcspResponseStatus::Successful {
        return Err(OcspError::Unsuccessful(format!(
            "{:?}",
            outer.response_status
        )));
    }
    let bytes = outer
        .response_bytes
        .ok_or_else(|| OcspError::Malformed("a successful response without a body".into()))?;
    if bytes.response_type != const_oid::db::rfc6960::ID_PKIX_OCSP_BASIC {
        return Err(OcspError::Malformed(format!(
            "response type {} is not basic",
            bytes.response_type
        )));
    }
    let basic = BasicOcspResponse::from_der(bytes.response.as_bytes()).map_err(malformed)?;
    // The entry for this certificate.
    let subject = Subject::of(leaf, issuer)?;
    let single = basic
        .tbs_response_data
        .responses
        .iter()
        .find(|r| {
            let id = &r.cert_id;
            let md = match id.hash_algorithm.oid {
                const_oid::db::rfc5912::ID_SHA_1 => MessageDigest::sha1(),
                const_oid::db::rfc5912::ID_SHA_256 => MessageDigest::sha256(),
                _ => return false,
            };
            let Ok((name_hash, key_hash)) = subject.issuer_hashes(md) else {
                return false;
            };
            id.serial_number == subject.serial
                && id.issuer_name_hash.as_bytes() == name_hash.as_slice()
                && id.issuer_key_hash.as_bytes() == key_hash.as_slice()
        })
        .ok_or_else(|| OcspError::OtherCertificate {
            serial: crate::config::file::to_hex(subject.serial.as_bytes()),
        })?;
    match single.cert_status {
        CertStatus::Good(_) => {}
        CertStatus::Revoked(_) => return Err(OcspError::NotGood("revoked")),
        CertStatus::Unknown(_) => return Err(OcspError::NotGood("unknown")),
    }
    // The signature: the issuer's, or a delegated responder's that the issuer signed.
    let tbs = basic.tbs_response_data.to_der().map_err(malformed)?;
    let sig = basic.signature.as_bytes().ok_or(OcspError::BadSignature)?;
    let alg = &basic.signature_algorithm.oid;
    let issuer_key = issuer.public_key().map_err(|_| OcspError::BadSignature)?;
    let mut signed = verify_with(alg, &issuer_key, &tbs, sig);
    if !signed {
        for c in basic.certs.iter().flatten() {
            let Ok(der) = c.to_der() else { continue };
            let Ok(responder) = X509::from_der(&der) else {
                continue;
            };
            let issued = responder.verify(&issuer_key).unwrap_or(false);
            if issued && ocsp_signing(c) {
                if let Ok(k) = responder.public_key() {
                    signed = verify_with(alg, &k, &tbs, sig);
                }
            }
            if signed {
                break;
            }
        }
    }
    if !signed {
        return Err(OcspError::BadSignature);
    }
    let this_update = single.this_update.0.to_system_time();
    let next_update = single
        .next_update
        .map(|t| t.0.to_system_time())
        .ok_or_else(|| OcspError::NotCurrent("no nextUpdate: freshness cannot be known".into()))?;
    if this_update > now + CLOCK_SKEW {
        return Err(OcspError::NotCurrent(format!(
            "thisUpdate {} is in the future",
            humantime::format_rfc3339_seconds(this_update)
        )));
    }
    if next_update <= now + STALE_MARGIN {
        return Err(OcspError::NotCurrent(format!(
            "nextUpdate {} has passed (or is within {}s)",
            humantime::format_rfc3339_seconds(next_update),
            STALE_MARGIN.as_secs()
        )));
    }
    Ok(Checked {
        der: response.into(),
        this_update,
        next_update,
    })
}

/// Whether `sig` over `data` verifies with `key` under the X.509 signature algorithm `alg`.
fn verify_with(
    alg: &der::asn1::ObjectIdentifier,
    key: &boring::pkey::PKeyRef<boring::pkey::Public>,
    data: &[u8],
    sig: &[u8],
) -> bool {
    use const_oid::db::rfc5912 as oid;
    let md = match *alg {
        oid::SHA_256_WITH_RSA_ENCRYPTION | oid::ECDSA_WITH_SHA_256 => MessageDigest::sha256(),
        oid::SHA_384_WITH_RSA_ENCRYPTION | oid::ECDSA_WITH_SHA_384 => MessageDigest::sha384(),
        oid::SHA_512_WITH_RSA_ENCRYPTION | oid::ECDSA_WITH_SHA_512 => MessageDigest::sha512(),
        oid::SHA_1_WITH_RSA_ENCRYPTION => MessageDigest::sha1(),
        _ => return false,
    };
    let Ok(mut v) = boring::sign::Verifier::new(md, key) else {
        return false;
    };
    v.update(data).is_ok() && v.verify(sig).unwrap_or(false)
}

/// Whether `c` has the OCSP-signing extended key usage.
fn ocsp_signing(c: &Certificate) -> bool {
    use x509_cert::ext::pkix::ExtendedKeyUsage;
    c.tbs_certificate
        .extensions
        .iter()
        .flatten()
        .filter(|e| e.extn_id == const_oid::db::rfc5280::ID_CE_EXT_KEY_USAGE)
        .filter_map(|e| ExtendedKeyUsage::from_der(e.extn_value.as_bytes()).ok())
        .any(|eku| eku.0.contains(&const_oid::db::rfc5280::ID_KP_OCSP_SIGNING))
}

/// Handshakes that asked for an OCSP response when the certificate's was stale (none
/// stapled), in this process (`rampart_tls_ocsp_stale_total`).
pub static STALE: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Responses fetched from responders (`rampart_tls_ocsp_fetches_total`) and fetches that
/// failed or brought a response that did not check (`rampart_tls_ocsp_fetch_errors_total`).
pub static FETCHED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
pub static FETCH_ERRORS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// The response a certificate staples: from a file (a reload builds a new one), or fetched
/// from the certificate's responder and refreshed by a task of its own while the staple is in
/// use by any certificate store.
#[derive(Debug)]
pub struct Staple {
    checked: std::sync::RwLock<Option<Checked>>,
    /// Whether the response's going stale was logged (once per response).
    stale_logged: AtomicBool,
    /// The certificate file, for logs.
    certificate: String,
}

impl Staple {
    fn new(certificate: &std::path::Path, checked: Option<Checked>) -> Staple {
        Staple {
            checked: std::sync::RwLock::new(checked),
            stale_logged: AtomicBool::new(false),
            certificate: certificate.display().to_string(),
        }
    }

    /// Reads and checks the response in `file` for `leaf` (of the chain in `cert_file`), whose
    /// issuer is `issuer`. Errors name the response file and say what is wrong with it.
    pub fn from_file(
        file: &std::path::Path,
        cert_file: &std::path::Path,
        leaf: &X509,
        issuer: Option<&X509>,
    ) -> anyhow::Result<Staple> {
        let der = std::fs::read(file)
            .map_err(|e| anyhow::anyhow!("ocsp_response: cannot read {}: {e}", file.display()))?;
        let issuer = issuer.ok_or_else(|| {
            anyhow::anyhow!(
                "ocsp_response: {}: {}",
                cert_file.display(),
                OcspError::NoIssuer
            )
        })?;
        let checked = check(&der, leaf, issuer, SystemTime::now())
            .map_err(|e| anyhow::anyhow!("ocsp_response: {}: {e}", file.display()))?;
        Ok(Staple::new(cert_file, Some(checked)))
    }

    /// The staple of `leaf` whose response is fetched from the responder its Authority
    /// Information Access names, by a refresh task (started now, in this Tokio runtime); the
    /// same certificate asked for again (the QUIC store, a reload) shares it while it lives,
    /// response and task included. Errors (no issuer, no responder) name the certificate.
    pub fn fetching(
        cert_file: &std::path::Path,
        leaf: &X509,
        issuer: Option<&X509>,
    ) -> anyhow::Result<Arc<Staple>> {
        let issuer = issuer.ok_or_else(|| {
            anyhow::anyhow!(
                "ocsp_fetch: {}: {}",
                cert_file.display(),
                OcspError::NoIssuer
            )
        })?;
        let url = responder_url(leaf).ok_or_else(|| {
            anyhow::anyhow!(
                "ocsp_fetch: {}: the certificate names no OCSP responder (Authority Information Access)",
                cert_file.display()
            )
        })?;
        let request = request_der(leaf, issuer)
            .map_err(|e| anyhow::anyhow!("ocsp_fetch: {}: {e}", cert_file.display()))?;
        static LIVE: std::sync::Mutex<Vec<(Vec<u8>, std::sync::Weak<Staple>)>> =
            std::sync::Mutex::new(Vec::new());
        let key = leaf.to_der()?;
        let mut live = LIVE.lock().unwrap_or_else(|e| e.into_inner());
        live.retain(|(_, w)| w.strong_count() > 0);
        if let Some(s) = live
            .iter()
            .find(|(k, _)| *k == key)
            .and_then(|(_, w)| w.upgrade())
        {
            return Ok(s);
        }
        let staple = Arc::new(Staple::new(cert_file, None));
        live.push((key, Arc::downgrade(&staple)));
        let task = refresh(
            Arc::downgrade(&staple),
            url,
            request,
            leaf.clone(),
            issuer.clone(),
        );
        match tokio::runtime::Handle::try_current() {
            Ok(h) => {
                h.spawn(task);
            }
            Err(_) => {
                std::thread::Builder::new()
                    .name("rampart-ocsp".into())
                    .spawn(move || {
                        if let Ok(rt) = tokio::runtime::Builder::new_current_thread()
                            .enable_all()
                            .build()
                        {
                            rt.block_on(task);
                        }
                    })?;
            }
        }
        Ok(staple)
    }

    /// The response to staple now: none once it is within [`STALE_MARGIN`] of its
    /// `nextUpdate` (counted; logged once), nor before a fetched one has arrived.
    pub fn fresh(&self, now: SystemTime) -> Option<Arc<[u8]>> {
        let g = self.checked.read().unwrap_or_else(|e| e.into_inner());
        let c = g.as_ref()?;
        if now + STALE_MARGIN < c.next_update {
            return Some(c.der.clone());
        }
        STALE.fetch_add(1, Ordering::Relaxed);
        if !self.stale_logged.swap(true, Ordering::Relaxed) {
            tracing::warn!(certificate = %self.certificate,
                next_update = %humantime::format_rfc3339_seconds(c.next_update),
                "OCSP response stale: no longer stapled");
        }
        None
    }

    fn replace(&self, checked: Checked) {
        *self.checked.write().unwrap_or_else(|e| e.into_inner()) = Some(checked);
        self.stale_logged.store(false, Ordering::Relaxed);
    }
}

/// The OCSP responder (`http://`) `leaf`'s Authority Information Access names.
pub fn responder_url(leaf: &X509) -> Option<String> {
    use x509_cert::ext::pkix::name::GeneralName;
    use x509_cert::ext::pkix::AuthorityInfoAccessSyntax;
    let c = Certificate::from_der(&leaf.to_der().ok()?).ok()?;
    let ext = c
        .tbs_certificate
        .extensions
        .iter()
        .flatten()
        .find(|e| e.extn_id == const_oid::db::rfc5280::ID_PE_AUTHORITY_INFO_ACCESS)?;
    let aia = AuthorityInfoAccessSyntax::from_der(ext.extn_value.as_bytes()).ok()?;
    aia.0.iter().find_map(|d| match &d.access_location {
        GeneralName::UniformResourceIdentifier(u)
            if d.access_method == const_oid::db::rfc5280::ID_AD_OCSP
                && u.as_str().starts_with("http://") =>
        {
            Some(u.as_str().to_string())
        }
        _ => None,
    })
}

/// The DER OCSP request for `leaf` issued by `issuer`: one SHA-1 CertID (what responders
/// index by), no nonce (responses are presigned and cached, and a stapled one has none).
pub fn request_der(leaf: &X509, issuer: &X509) -> Result<Vec<u8>, OcspError> {
    use x509_ocsp::{CertId, OcspRequest, Request, TbsRequest};
    let subject = Subject::of(leaf, issuer)?;
    let (name_hash, key_hash) = subject.issuer_hashes(MessageDigest::sha1())?;
    let octets = |v: Vec<u8>| der::asn1::OctetString::new(v).map_err(malformed);
    let req = OcspRequest {
        tbs_request: TbsRequest {
            request_list: vec![Request {
                req_cert: CertId {
                    hash_algorithm: spki::AlgorithmIdentifierOwned {
                        oid: const_oid::db::rfc5912::ID_SHA_1,
                        parameters: Some(der::asn1::Null.into()),
                    },
                    issuer_name_hash: octets(name_hash)?,
                    issuer_key_hash: octets(key_hash)?,
                    serial_number: subject.serial,
                },
                single_request_extensions: None,
            }],
            ..Default::default()
        },
        optional_signature: None,
    };
    req.to_der().map_err(malformed)
}

/// What names a certificate in OCSP (RFC 6960 §4.1.1 CertID): its serial number, and its
/// issuer's name (DER) and public key (the BIT STRING's bits), which a CertID carries hashed.
struct Subject {
    serial: x509_cert::serial_number::SerialNumber,
    issuer_name: Vec<u8>,
    issuer_key: Vec<u8>,
}

impl Subject {
    fn of(leaf: &X509, issuer: &X509) -> Result<Subject, OcspError> {
        let parse =
            |c: &X509| Certificate::from_der(&c.to_der().map_err(malformed)?).map_err(malformed);
        let (leaf, issuer) = (parse(leaf)?, parse(issuer)?);
        let issuer = issuer.tbs_certificate;
        Ok(Subject {
            serial: leaf.tbs_certificate.serial_number,
            issuer_name: issuer.subject.to_der().map_err(malformed)?,
            issuer_key: issuer
                .subject_public_key_info
                .subject_public_key
                .raw_bytes()
                .to_vec(),
        })
    }

    /// The issuer's name and key hashed with `md`, as a CertID carries them.
    fn issuer_hashes(&self, md: MessageDigest) -> Result<(Vec<u8>, Vec<u8>), OcspError> {
        let h = |b: &[u8]| {
            boring::hash::hash(md, b)
                .map(|d| d.to_vec())
                .map_err(malformed)
        };
        Ok((h(&self.issuer_name)?, h(&self.issuer_key)?))
    }
}

/// Any parsing or encoding failure, as [`OcspError::Malformed`].
fn malformed(e: impl std::fmt::Display) -> OcspError {
    OcspError::Malformed(e.to_string())
}

/// When to fetch again after `c` arrived: halfway through its validity, at least a minute
/// from now, and no later than a minute before it goes stale.
pub fn refresh_at(c: &Checked, now: SystemTime) -> SystemTime {
    let half = c.this_update
        + c.next_update
            .duration_since(c.this_update)
            .unwrap_or_default()
            / 2;
    let latest = c.next_update - STALE_MARGIN - Duration::from_secs(60);
    half.min(latest).max(now + Duration::from_secs(60))
}

/// The wait after the `failures`-th failure in a row: 5 s doubling to at most 10 minutes,
/// drawn at random up to that (clients that failed together do not retry together).
pub fn backoff(failures: u32) -> Duration {
    let cap = Duration::from_secs(5)
        .saturating_mul(1 << failures.min(7))
        .min(Duration::from_secs(600));
    cap.mul_f64(0.5 + fastrand::f64() / 2.0)
}

/// Longest time one fetch may take, and the largest response read.
const FETCH_TIMEOUT: Duration = Duration::from_secs(10);
const MAX_RESPONSE: usize = 64 * 1024;

/// Fetches and checks responses for `staple` while it lives: the last good one stays in force
/// through failures (until it goes stale, when [`Staple::fresh`] stops stapling it).
async fn refresh(
    staple: std::sync::Weak<Staple>,
    url: String,
    request: Vec<u8>,
    leaf: X509,
    issuer: X509,
) {
    let mut failures = 0u32;
    loop {
        let Some(s) = staple.upgrade() else { return };
        let got = tokio::time::timeout(FETCH_TIMEOUT, fetch(&url, &request))
            .await
            .map_err(|_| anyhow::anyhow!("no answer within {FETCH_TIMEOUT:?}"))
            .and_then(|r| r)
            .and_then(|der| Ok(check(&der, &leaf, &issuer, SystemTime::now())?));
        let wait = match got {
            Ok(c) => {
                FETCHED.fetch_add(1, Ordering::Relaxed);
                failures = 0;
                let at = refresh_at(&c, SystemTime::now());
                s.replace(c);
                at.duration_since(SystemTime::now()).unwrap_or_default()
            }
            Err(e) => {
                FETCH_ERRORS.fetch_add(1, Ordering::Relaxed);
                failures += 1;
                let wait = backoff(failures);
                tracing::warn!(certificate = %s.certificate, responder = %url, error = %e,
                    retry_in = ?wait, "OCSP fetch failed; the last good response (if any) stays until it is stale");
                wait
            }
        };
        drop(s);
        tokio::time::sleep(wait).await;
    }
}

/// POSTs `request` to the responder at `url` (`http://host[:port]/path`) over HTTP/1.1.
async fn fetch(url: &str, request: &[u8]) -> anyhow::Result<Vec<u8>> {
    use http_body_util::BodyExt;
    let uri: http::Uri = url.parse()?;
    let host = uri
        .host()
        .ok_or_else(|| anyhow::anyhow!("{url}: no host"))?;
    let port = uri.port_u16().unwrap_or(80);
    let tcp = tokio::net::TcpStream::connect((host, port)).await?;
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tcp)).await?;
    tokio::spawn(conn);
    let req = http::Request::post(uri.path_and_query().map_or("/", |p| p.as_str()))
        .header(
            http::header::HOST,
            uri.authority().map_or(host, |a| a.as_str()),
        )
        .header(http::header::CONTENT_TYPE, "application/ocsp-request")
        .body(http_body_util::Full::new(bytes::Bytes::copy_from_slice(
            request,
        )))?;
    let resp = sender.send_request(req).await?;
    anyhow::ensure!(
        resp.status().is_success(),
        "the responder answered {}",
        resp.status()
    );
    let body = http_body_util::Limited::new(resp.into_body(), MAX_RESPONSE)
        .collect()
        .await
        .map_err(|e| anyhow::anyhow!("reading the response: {e}"))?;
    Ok(body.to_bytes().to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The OCSP test PKI (`tests/data/ocsp-certs.sh`), made with the openssl CLI.
    fn pki() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/ocsp-certs.sh");
        let out = std::process::Command::new("sh")
            .arg(script)
            .current_dir(dir.path())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        dir
    }

    fn cert(dir: &tempfile::TempDir, name: &str) -> X509 {
        X509::from_pem(&std::fs::read(dir.path().join(name)).unwrap()).unwrap()
    }

    fn response(dir: &tempfile::TempDir, name: &str) -> Vec<u8> {
        std::fs::read(dir.path().join(name)).unwrap()
    }

    #[test]
    fn responses_are_checked_before_they_are_ever_stapled() {
        let dir = pki();
        let (site, ca) = (cert(&dir, "site.pem"), cert(&dir, "ca.pem"));
        let now = SystemTime::now();
        let good = check(&response(&dir, "site-good.der"), &site, &ca, now).unwrap();
        let day = Duration::from_secs(86_400);
        assert!(good.next_update > now + day - Duration::from_secs(600));
        assert!(good.this_update <= now + CLOCK_SKEW);
        // Signed by a responder the CA issued for OCSP signing.
        check(&response(&dir, "site-delegated.der"), &site, &ca, now).unwrap();
        // Another certificate's, a revoked one, the wrong issuer, bytes that are no response.
        assert!(matches!(
            check(&response(&dir, "other-good.der"), &site, &ca, now),
            Err(OcspError::OtherCertificate { .. })
        ));
        assert_eq!(
            check(&response(&dir, "site-revoked.der"), &site, &ca, now).unwrap_err(),
            OcspError::NotGood("revoked")
        );
        let responder = cert(&dir, "responder.pem");
        assert!(matches!(
            check(&response(&dir, "site-good.der"), &site, &responder, now),
            Err(OcspError::OtherCertificate { .. })
        ));
        assert!(matches!(
            check(b"not DER", &site, &ca, now),
            Err(OcspError::Malformed(_))
        ));
        // One bit of the signature flipped.
        let mut bad = response(&dir, "site-good.der");
        let outer = OcspResponse::from_der(&bad).unwrap();
        let basic =
            BasicOcspResponse::from_der(outer.response_bytes.unwrap().response.as_bytes()).unwrap();
        let sig = basic.signature.as_bytes().unwrap();
        let at = bad.windows(sig.len()).position(|w| w == sig).unwrap();
        bad[at + sig.len() / 2] ^= 1;
        assert_eq!(
            check(&bad, &site, &ca, now).unwrap_err(),
            OcspError::BadSignature
        );
        // Past (or within a minute of) nextUpdate, and from the future.
        assert!(matches!(
            check(&response(&dir, "site-good.der"), &site, &ca, now + 2 * day),
            Err(OcspError::NotCurrent(_))
        ));
        let short = response(&dir, "site-short.der");
        check(&short, &site, &ca, now).unwrap();
        assert!(matches!(
            check(&short, &site, &ca, now + Duration::from_secs(70)),
            Err(OcspError::NotCurrent(_))
        ));
        assert!(matches!(
            check(&short, &site, &ca, now - 2 * CLOCK_SKEW),
            Err(OcspError::NotCurrent(_))
        ));
    }

    #[test]
    fn refreshes_come_halfway_and_failures_back_off() {
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let day = Duration::from_secs(86_400);
        let c = |this: SystemTime, next: SystemTime| Checked {
            der: Arc::from(&b""[..]),
            this_update: this,
            next_update: next,
        };
        // Halfway through a day's validity.
        assert_eq!(refresh_at(&c(t0, t0 + day), t0), t0 + day / 2);
        // A short one: no later than two minutes before nextUpdate, no sooner than a minute.
        let short = c(t0, t0 + Duration::from_secs(240));
        assert_eq!(refresh_at(&short, t0), t0 + Duration::from_secs(120));
        assert_eq!(
            refresh_at(&short, t0 + Duration::from_secs(200)),
            t0 + Duration::from_secs(260)
        );
        for n in 1..20 {
            let b = backoff(n);
            let cap = Duration::from_secs(5 * (1 << n.min(7))).min(Duration::from_secs(600));
            assert!(b >= cap / 2 && b <= cap, "{n}: {b:?}");
        }
    }

    #[test]
    fn a_request_names_the_certificate_and_its_responder_is_found() {
        let dir = pki();
        let (site, ca) = (cert(&dir, "site.pem"), cert(&dir, "ca.pem"));
        let req = request_der(&site, &ca).unwrap();
        let parsed = x509_ocsp::OcspRequest::from_der(&req).unwrap();
        let id = &parsed.tbs_request.request_list[0].req_cert;
        assert_eq!(id.serial_number.as_bytes(), &[0x10, 0x01]);
        // `openssl ocsp` reads it as a request for serial 0x1001.
        std::fs::write(dir.path().join("ours.req"), &req).unwrap();
        let out = std::process::Command::new("openssl")
            .args(["ocsp", "-reqin", "ours.req", "-req_text"])
            .current_dir(dir.path())
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains("Serial Number: 1001"), "{text}");
        assert_eq!(responder_url(&site).as_deref(), Some("http://127.0.0.1:1/"));
        assert_eq!(responder_url(&ca), None);
    }

    #[test]
    fn a_staple_stops_once_stale_and_the_errors_name_the_file() {
        let dir = pki();
        let (site, ca) = (cert(&dir, "site.pem"), cert(&dir, "ca.pem"));
        let chain = dir.path().join("site-chain.pem");
        let file = dir.path().join("site-short.der");
        let staple = Staple::from_file(&file, &chain, &site, Some(&ca)).unwrap();
        let now = SystemTime::now();
        assert_eq!(
            staple.fresh(now).as_deref(),
            Some(response(&dir, "site-short.der").as_slice())
        );
        let before = STALE.load(Ordering::Relaxed);
        assert_eq!(staple.fresh(now + Duration::from_secs(70)), None);
        assert!(STALE.load(Ordering::Relaxed) > before);
        let other = dir.path().join("other-good.der");
        let e = Staple::from_file(&other, &chain, &site, Some(&ca))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("other-good.der") && e.contains("another certificate"),
            "{e}"
        );
        let e = Staple::from_file(&file, &chain, &site, None)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("site-chain.pem") && e.contains("no issuer"),
            "{e}"
        );
    }
}
