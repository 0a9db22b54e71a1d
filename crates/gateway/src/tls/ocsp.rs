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
    let malformed = |e: der::Error| OcspError::Malformed(e.to_string());
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
    let leaf_c = Certificate::from_der(
        &leaf
            .to_der()
            .map_err(|e| OcspError::Malformed(e.to_string()))?,
    )
    .map_err(malformed)?;
    let issuer_der = issuer
        .to_der()
        .map_err(|e| OcspError::Malformed(e.to_string()))?;
    let issuer_c = Certificate::from_der(&issuer_der).map_err(malformed)?;
    // The entry for this certificate.
    let serial = &leaf_c.tbs_certificate.serial_number;
    let name_der = issuer_c
        .tbs_certificate
        .subject
        .to_der()
        .map_err(malformed)?;
    let key_bits = issuer_c
        .tbs_certificate
        .subject_public_key_info
        .subject_public_key
        .raw_bytes();
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
            let h = |b: &[u8]| {
                boring::hash::hash(md, b)
                    .map(|d| d.to_vec())
                    .unwrap_or_default()
            };
            id.serial_number == *serial
                && id.issuer_name_hash.as_bytes() == h(&name_der).as_slice()
                && id.issuer_key_hash.as_bytes() == h(key_bits).as_slice()
        })
        .ok_or_else(|| OcspError::OtherCertificate {
            serial: hex(serial.as_bytes()),
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

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Handshakes that asked for an OCSP response when the certificate's was stale (none
/// stapled), in this process (`rampart_tls_ocsp_stale_total`).
pub static STALE: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// The response a certificate staples. A reload builds a new one from the file.
#[derive(Debug)]
pub struct Staple {
    checked: Checked,
    /// Whether the response's going stale was logged (once per response).
    stale_logged: AtomicBool,
    /// The certificate file, for logs.
    certificate: String,
}

impl Staple {
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
        Ok(Staple {
            checked,
            stale_logged: AtomicBool::new(false),
            certificate: cert_file.display().to_string(),
        })
    }

    /// The response to staple now: none once it is within [`STALE_MARGIN`] of its
    /// `nextUpdate` (counted; logged once).
    pub fn fresh(&self, now: SystemTime) -> Option<Arc<[u8]>> {
        if now + STALE_MARGIN < self.checked.next_update {
            return Some(self.checked.der.clone());
        }
        STALE.fetch_add(1, Ordering::Relaxed);
        if !self.stale_logged.swap(true, Ordering::Relaxed) {
            tracing::warn!(certificate = %self.certificate,
                next_update = %humantime::format_rfc3339_seconds(self.checked.next_update),
                "OCSP response stale: no longer stapled (replace the file and reload)");
        }
        None
    }
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
