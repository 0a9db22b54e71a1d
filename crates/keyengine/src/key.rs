//! Private keys and their identifiers, with the single-operation signing path.
//!
//! Single operations use aws-lc (`aws-lc-rs`): on this machine kind it signs RSA-2048 about
//! 1.8x faster than the BoringSSL vendored by `boring` (see docs/benchmarks-history.md). aws-lc's
//! symbols are prefixed, so it links beside BoringSSL.

use crate::algorithm::{KeyKind, SignatureAlgorithm};
use crate::error::SignError;

use crate::key_id::{spki_public_key_bits, KeyId};
use aws_lc_rs::digest::Digest;
use aws_lc_rs::signature::{self, EcdsaKeyPair, KeyPair, ParsedPublicKey, RsaKeyPair};
use std::fmt;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

/// Why a key file could not be loaded. Never carries key material.
#[derive(Debug, thiserror::Error)]
pub enum KeyLoadError {
    #[error("{path}: cannot read: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("{path}: not a PEM file: {reason}")]
    Pem { path: String, reason: String },
    #[error("{path}: no private key found (expected a PEM block 'PRIVATE KEY', 'RSA PRIVATE KEY' or 'EC PRIVATE KEY')")]
    NoKey { path: String },
    #[error("{path}: the {label} block is not a supported key (RSA 2048-8192, ECDSA P-256 or P-384): {reason}")]
    Rejected {
        path: String,
        label: String,
        reason: String,
    },
}

enum Inner {
    /// The aws-lc key for single operations and, for the sizes the multi-buffer kernel
    /// handles, the same key prepared for it.
    Rsa(RsaKeyPair, Option<Box<mbcrypto::rsa::RsaKey>>),
    /// For P-256, also the key prepared for signing with pooled nonces.
    Ecdsa {
        pair: EcdsaKeyPair,
        kind: KeyKind,
        pooled: Option<mbcrypto::ecdsa::P256Key>,
    },
}

/// The public half of a key: enough to identify it and to verify its signatures. A gateway
/// whose keys live on remote key servers holds only these (taken from its certificates).
#[derive(Clone)]
pub struct PublicKey {
    id: KeyId,
    kind: KeyKind,
    bits: Vec<u8>,
    /// The key parsed once per verification algorithm, on first use and shared by clones.
    /// Parsing (DER, and for RSA the modulus's Montgomery set-up) cost about as much as the
    /// verification itself, and the `batch` and `gpu` engines verify every signature.
    parsed: Arc<ParsedKeys>,
    /// For P-256, the key's precomputed verification table (on first use, within
    /// [`P256_TABLES_MAX`]); `None` where the budget was spent or the point is not one.
    p256: Arc<OnceLock<Option<P256Table>>>,
}

/// P-256 keys that get a precomputed verification table, process-wide (each holds
/// [`mbcrypto::ecdsa::P256PublicKey::TABLE_BYTES`], about 152 KB: 256 keys about 39 MB). The
/// first keys to verify a signature get one; the rest verify with aws-lc, about 2.5× slower.
pub const P256_TABLES_MAX: usize = 256;

static P256_TABLES: AtomicUsize = AtomicUsize::new(0);

/// A P-256 verification table holding one of the [`P256_TABLES_MAX`] slots until dropped
/// (with the last clone of its key, so reloads do not use the budget up).
struct P256Table(mbcrypto::ecdsa::P256PublicKey);

/// What building a key's table came to.
enum Built {
    Table(P256Table),
    /// Not an uncompressed point on the curve: aws-lc verifies it, for good.
    NotAPoint,
    /// Every slot taken: aws-lc verifies it for now; a slot may come free (a reload drops
    /// the keys it replaced), so the next verification tries again.
    NoSlot,
}

impl P256Table {
    fn build(point: &[u8]) -> Built {
        let taken = P256_TABLES.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
            (n < P256_TABLES_MAX).then_some(n + 1)
        });
        if taken.is_err() {
            return Built::NoSlot;
        }
        match mbcrypto::ecdsa::P256PublicKey::from_sec1(point) {
            Some(t) => Built::Table(P256Table(t)),
            None => {
                P256_TABLES.fetch_sub(1, Ordering::Relaxed);
                Built::NotAPoint
            }
        }
    }
}

impl Drop for P256Table {
    fn drop(&mut self) {
        P256_TABLES.fetch_sub(1, Ordering::Relaxed);
    }
}

type ParsedKeys = [OnceLock<Option<ParsedPublicKey>>; SignatureAlgorithm::ALL.len()];

impl PartialEq for PublicKey {
    fn eq(&self, other: &Self) -> bool {
        (self.id, self.kind, &self.bits) == (other.id, other.kind, &other.bits)
    }
}

impl Eq for PublicKey {}

impl fmt::Debug for PublicKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PublicKey({}, {})", self.id, self.kind.as_str())
    }
}

impl PublicKey {
    /// From a DER SubjectPublicKeyInfo whose kind the caller has determined (e.g. from the
    /// certificate's algorithm). `None` if the bytes are not a SubjectPublicKeyInfo.
    pub fn from_spki_der(kind: KeyKind, spki: &[u8]) -> Option<Self> {
        let bits = spki_public_key_bits(spki)?.to_vec();
        Some(PublicKey::from_bits(kind, bits))
    }

    fn from_bits(kind: KeyKind, bits: Vec<u8>) -> Self {
        PublicKey {
            id: KeyId::from_public_key_bits(&bits),
            kind,
            bits,
            parsed: Arc::new(std::array::from_fn(|_| OnceLock::new())),
            p256: Arc::default(),
        }
    }

    pub fn id(&self) -> KeyId {
        self.id
    }

    pub fn kind(&self) -> KeyKind {
        self.kind
    }

    /// Checks `signature` over `digest`.
    pub fn verify_digest(
        &self,
        algorithm: SignatureAlgorithm,
        digest: &[u8],
        signature: &[u8],
    ) -> bool {
        if algorithm.key_kind() != self.kind {
            return false;
        }
        if self.kind == KeyKind::EcdsaP256 {
            if digest.len() != algorithm.hash().output_len() {
                return false;
            }
            // Built on the first verification (about 1 ms), not at load: a gateway with
            // thousands of certificates builds tables only for the keys that sign.
            let table = match self.p256.get() {
                Some(cached) => cached.as_ref(),
                None => match P256Table::build(&self.bits) {
                    Built::NoSlot => None,
                    Built::NotAPoint => self.p256.get_or_init(|| None).as_ref(),
                    // Built twice by a race: the loser's table drops and gives its slot back.
                    Built::Table(t) => self.p256.get_or_init(|| Some(t)).as_ref(),
                },
            };
            if let Some(table) = table {
                return table.0.verify(digest, signature);
            }
        }
        let Ok(d) = import_digest(algorithm, digest) else {
            return false;
        };
        let slot = SignatureAlgorithm::ALL
            .iter()
            .position(|a| *a == algorithm)
            .expect("ALL lists every algorithm");
        self.parsed[slot]
            .get_or_init(|| {
                ParsedPublicKey::new(verification_algorithm(algorithm), &self.bits).ok()
            })
            .as_ref()
            .is_some_and(|key| key.verify_digest_sig(&d, signature).is_ok())
    }
}

/// A private key held in process. `Debug` prints only the key's id and kind.
pub struct PrivateKey {
    inner: Inner,
    public: PublicKey,
}

impl fmt::Debug for PrivateKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PrivateKey")
            .field("id", &self.public.id)
            .field("kind", &self.kind())
            .finish_non_exhaustive()
    }
}

impl PrivateKey {
    /// Loads the first private key from a PEM file.
    pub fn from_pem_file(path: &Path) -> Result<Self, KeyLoadError> {
        let p = path.display().to_string();
        let text = std::fs::read(path).map_err(|source| KeyLoadError::Io {
            path: p.clone(),
            source,
        })?;
        Self::from_pem(&text).map_err(|e| e.with_path(&p))
    }

    /// Parses the first private key in PEM text.
    pub fn from_pem(text: &[u8]) -> Result<Self, KeyLoadError> {
        let blocks = pem::parse_many(text).map_err(|e| KeyLoadError::Pem {
            path: String::new(),
            reason: e.to_string(),
        })?;
        let block = blocks
            .iter()
            .find(|b| b.tag().ends_with("PRIVATE KEY"))
            .ok_or(KeyLoadError::NoKey {
                path: String::new(),
            })?;
        Self::from_der(block.tag(), block.contents())
    }

    /// Parses a DER private key; `label` is its PEM label (`PRIVATE KEY` for PKCS#8,
    /// `RSA PRIVATE KEY` for PKCS#1, `EC PRIVATE KEY` for SEC1).
    pub fn from_der(label: &str, der: &[u8]) -> Result<Self, KeyLoadError> {
        let rejected = |reason: String| KeyLoadError::Rejected {
            path: String::new(),
            label: label.to_string(),
            reason,
        };
        let rsa = |der: &[u8], pkcs8: bool| {
            let r = if pkcs8 {
                RsaKeyPair::from_pkcs8(der)
            } else {
                RsaKeyPair::from_der(der)
            };
            r.map(|k| Inner::Rsa(k, mbcrypto::rsa::RsaKey::from_der(der).ok().map(Box::new)))
        };
        let ec = |der: &[u8]| {
            EcdsaKeyPair::from_private_key_der(&signature::ECDSA_P256_SHA256_ASN1_SIGNING, der)
                .map(|pair| Inner::Ecdsa {
                    pair,
                    kind: KeyKind::EcdsaP256,
                    pooled: mbcrypto::ecdsa::P256Key::from_der(der).ok(),
                })
                .or_else(|_| {
                    EcdsaKeyPair::from_private_key_der(
                        &signature::ECDSA_P384_SHA384_ASN1_SIGNING,
                        der,
                    )
                    .map(|pair| Inner::Ecdsa {
                        pair,
                        kind: KeyKind::EcdsaP384,
                        pooled: None,
                    })
                })
        };
        let inner = match label {
            "RSA PRIVATE KEY" => rsa(der, false).map_err(|e| rejected(e.to_string()))?,
            "EC PRIVATE KEY" => ec(der).map_err(|e| rejected(e.to_string()))?,
            _ => rsa(der, true)
                .or_else(|_| ec(der))
                .map_err(|e| rejected(e.to_string()))?,
        };
        let bits = match &inner {
            Inner::Rsa(k, _) => k.public_key().as_ref().to_vec(),
            Inner::Ecdsa { pair, .. } => pair.public_key().as_ref().to_vec(),
        };
        let kind = match &inner {
            Inner::Rsa(..) => KeyKind::Rsa,
            Inner::Ecdsa { kind, .. } => *kind,
        };
        Ok(PrivateKey {
            public: PublicKey::from_bits(kind, bits),
            inner,
        })
    }

    pub fn id(&self) -> KeyId {
        self.public.id
    }

    pub fn kind(&self) -> KeyKind {
        self.public.kind
    }

    /// The SubjectPublicKey bit string contents (PKCS#1 RSAPublicKey or EC point).
    pub fn public_key_bits(&self) -> &[u8] {
        &self.public.bits
    }

    /// The public half.
    pub fn public_key(&self) -> PublicKey {
        self.public.clone()
    }

    /// Signature length for RSA (the modulus length), maximum DER length for ECDSA.
    pub fn max_signature_len(&self) -> usize {
        match &self.inner {
            Inner::Rsa(k, _) => k.public_modulus_len(),
            Inner::Ecdsa { kind, .. } => match kind {
                KeyKind::EcdsaP384 => 104,
                _ => 72,
            },
        }
    }

    /// The single-operation signing path: signs `digest` at once on the calling thread.
    /// Does not verify; [`crate::KeyEngine`] verifies every RSA result before release.
    pub fn sign_digest(
        &self,
        algorithm: SignatureAlgorithm,
        digest: &[u8],
    ) -> Result<Vec<u8>, SignError> {
        if algorithm.key_kind() != self.kind() {
            return Err(SignError::UnsupportedAlgorithm(algorithm));
        }
        let d = import_digest(algorithm, digest)?;
        match &self.inner {
            Inner::Rsa(k, _) => {
                let mut sig = vec![0u8; k.public_modulus_len()];
                k.sign_digest(rsa_encoding(algorithm), &d, &mut sig)
                    .map_err(|_| SignError::Crypto("RSA signing failed".into()))?;
                Ok(sig)
            }
            Inner::Ecdsa { pair, .. } => pair
                .sign_digest(&d)
                .map(|s| s.as_ref().to_vec())
                .map_err(|_| SignError::Crypto("ECDSA signing failed".into())),
        }
    }

    /// This key prepared for the multi-buffer RSA kernel (2048/3072/4096-bit keys), if it is
    /// one.
    pub fn batch_rsa(&self) -> Option<&mbcrypto::rsa::RsaKey> {
        match &self.inner {
            Inner::Rsa(_, mb) => mb.as_deref(),
            _ => None,
        }
    }

    /// This key prepared for signing with pooled nonces (ECDSA P-256), if it is one.
    pub fn pooled_p256(&self) -> Option<&mbcrypto::ecdsa::P256Key> {
        match &self.inner {
            Inner::Ecdsa { pooled, .. } => pooled.as_ref(),
            _ => None,
        }
    }

    /// Checks `signature` over `digest` with this key's public half.
    pub fn verify_digest(
        &self,
        algorithm: SignatureAlgorithm,
        digest: &[u8],
        signature: &[u8],
    ) -> bool {
        self.public.verify_digest(algorithm, digest, signature)
    }
}

impl KeyLoadError {
    fn with_path(self, p: &str) -> Self {
        match self {
            KeyLoadError::Pem { reason, .. } => KeyLoadError::Pem {
                path: p.into(),
                reason,
            },
            KeyLoadError::NoKey { .. } => KeyLoadError::NoKey { path: p.into() },
            KeyLoadError::Rejected { label, reason, .. } => KeyLoadError::Rejected {
                path: p.into(),
                label,
                reason,
            },
            e @ KeyLoadError::Io { .. } => e,
        }
    }
}

/// `digest` as aws-lc takes it for `algorithm`. ECDSA signs the digest's leftmost bits, as
/// many as the curve order has (SEC 1 §4.1.3, bits2int), so a SHA-384 or SHA-512 digest with a
/// P-256 key is signed and verified as its first 32 bytes under the SHA-256 key pair (aws-lc
/// binds each ECDSA key pair to one digest).
fn import_digest(algorithm: SignatureAlgorithm, digest: &[u8]) -> Result<Digest, SignError> {
    let bad = || SignError::BadDigest {
        expected: algorithm.hash().output_len(),
        got: digest.len(),
    };
    match algorithm {
        SignatureAlgorithm::EcdsaP256Sha384 | SignatureAlgorithm::EcdsaP256Sha512 => {
            if digest.len() != algorithm.hash().output_len() {
                return Err(bad());
            }
            Digest::import_less_safe(&digest[..32], &aws_lc_rs::digest::SHA256).map_err(|_| bad())
        }
        _ => Digest::import_less_safe(digest, algorithm.hash().aws_lc()).map_err(|_| bad()),
    }
}

fn rsa_encoding(a: SignatureAlgorithm) -> &'static dyn signature::RsaEncoding {
    use SignatureAlgorithm::*;
    match a {
        RsaPkcs1Sha256 => &signature::RSA_PKCS1_SHA256,
        RsaPkcs1Sha384 => &signature::RSA_PKCS1_SHA384,
        RsaPkcs1Sha512 => &signature::RSA_PKCS1_SHA512,
        RsaPssSha256 => &signature::RSA_PSS_SHA256,
        RsaPssSha384 => &signature::RSA_PSS_SHA384,
        RsaPssSha512 => &signature::RSA_PSS_SHA512,
        EcdsaP256Sha256 | EcdsaP384Sha384 | EcdsaP256Sha384 | EcdsaP256Sha512 => {
            unreachable!("checked by key_kind")
        }
    }
}

fn verification_algorithm(a: SignatureAlgorithm) -> &'static dyn signature::VerificationAlgorithm {
    use SignatureAlgorithm::*;
    match a {
        RsaPkcs1Sha256 => &signature::RSA_PKCS1_2048_8192_SHA256,
        RsaPkcs1Sha384 => &signature::RSA_PKCS1_2048_8192_SHA384,
        RsaPkcs1Sha512 => &signature::RSA_PKCS1_2048_8192_SHA512,
        RsaPssSha256 => &signature::RSA_PSS_2048_8192_SHA256,
        RsaPssSha384 => &signature::RSA_PSS_2048_8192_SHA384,
        RsaPssSha512 => &signature::RSA_PSS_2048_8192_SHA512,
        // A longer digest with P-256 is checked as its leftmost 256 bits (see `import_digest`).
        EcdsaP256Sha256 | EcdsaP256Sha384 | EcdsaP256Sha512 => &signature::ECDSA_P256_SHA256_ASN1,
        EcdsaP384Sha384 => &signature::ECDSA_P384_SHA384_ASN1,
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::testing::{generate_ecdsa_p256_pkcs8, generate_rsa_pkcs8};

    #[test]
    fn rsa_signs_and_verifies_every_rsa_algorithm() {
        let key = PrivateKey::from_der("PRIVATE KEY", &generate_rsa_pkcs8()).unwrap();
        assert_eq!(key.kind(), KeyKind::Rsa);
        for alg in SignatureAlgorithm::ALL.into_iter().filter(|a| a.is_rsa()) {
            let digest = alg.hash().digest(b"transcript");
            let sig = key.sign_digest(alg, &digest).unwrap();
            assert_eq!(sig.len(), 256);
            assert!(key.verify_digest(alg, &digest, &sig), "{alg}");
            let mut bad = sig.clone();
            bad[10] ^= 1;
            assert!(
                !key.verify_digest(alg, &digest, &bad),
                "{alg} accepted a corrupted signature"
            );
        }
    }

    #[test]
    fn a_p256_key_signs_sha384_and_sha512_digests_as_tls_1_2_asks() {
        let der = generate_ecdsa_p256_pkcs8();
        let key = PrivateKey::from_der("PRIVATE KEY", &der).unwrap();
        let msg = b"the handshake's signed params";
        for (alg, independent) in [
            (
                SignatureAlgorithm::EcdsaP256Sha384,
                &signature::ECDSA_P256_SHA384_ASN1 as &dyn signature::VerificationAlgorithm,
            ),
            (
                SignatureAlgorithm::EcdsaP256Sha512,
                &signature::ECDSA_P256_SHA512_ASN1,
            ),
        ] {
            let digest = alg.hash().digest(msg);
            let sig = key.sign_digest(alg, &digest).unwrap();
            assert!(key.verify_digest(alg, &digest, &sig), "{alg}");
            // aws-lc's own P-256/SHA-384 (SHA-512) verifier, over the message, agrees.
            let public = signature::UnparsedPublicKey::new(independent, key.public_key_bits());
            assert!(public.verify(msg, &sig).is_ok(), "{alg}");
            let mut bad = digest.clone();
            bad[40] ^= 1; // past the first 32 bytes: ECDSA does not see it
            assert!(key.verify_digest(alg, &bad, &sig), "{alg}: bits2int");
            bad[0] ^= 1;
            assert!(!key.verify_digest(alg, &bad, &sig), "{alg}");
            assert!(
                key.sign_digest(alg, &digest[..32]).is_err(),
                "a short digest"
            );
        }
    }

    #[test]
    fn ecdsa_signs_and_verifies() {
        let key = PrivateKey::from_der("PRIVATE KEY", &generate_ecdsa_p256_pkcs8()).unwrap();
        assert_eq!(key.kind(), KeyKind::EcdsaP256);
        let alg = SignatureAlgorithm::EcdsaP256Sha256;
        let digest = alg.hash().digest(b"transcript");
        let sig = key.sign_digest(alg, &digest).unwrap();
        assert!(key.verify_digest(alg, &digest, &sig));
        assert!(matches!(
            key.sign_digest(SignatureAlgorithm::RsaPssSha256, &digest),
            Err(SignError::UnsupportedAlgorithm(_))
        ));
    }

    #[test]
    fn p256_verification_by_table_agrees_with_aws_lc() {
        for _ in 0..4 {
            let key = PrivateKey::from_der("PRIVATE KEY", &generate_ecdsa_p256_pkcs8()).unwrap();
            let independent = signature::UnparsedPublicKey::new(
                &signature::ECDSA_P256_SHA256_ASN1,
                key.public_key_bits(),
            );
            let alg = SignatureAlgorithm::EcdsaP256Sha256;
            for i in 0..20u8 {
                let msg = [i; 16];
                let digest = alg.hash().digest(&msg);
                let sig = key.sign_digest(alg, &digest).unwrap();
                assert!(key.verify_digest(alg, &digest, &sig));
                let mut bad = sig.clone();
                let at = usize::from(i) % bad.len();
                bad[at] ^= 1 << (i % 8);
                assert_eq!(
                    key.verify_digest(alg, &digest, &bad),
                    independent.verify(&msg, &bad).is_ok(),
                    "byte {at}"
                );
                assert!(
                    !key.verify_digest(alg, &digest[..31], &sig),
                    "a short digest"
                );
            }
            assert!(
                key.public.p256.get().is_some_and(|t| t.is_some()),
                "the table was built and used"
            );
        }
    }

    #[test]
    fn wrong_digest_length_is_rejected() {
        let key = PrivateKey::from_der("PRIVATE KEY", &generate_ecdsa_p256_pkcs8()).unwrap();
        let err = key
            .sign_digest(SignatureAlgorithm::EcdsaP256Sha256, &[0u8; 20])
            .unwrap_err();
        assert!(matches!(
            err,
            SignError::BadDigest {
                expected: 32,
                got: 20
            }
        ));
    }

    #[test]
    fn debug_never_prints_key_material() {
        let key = PrivateKey::from_der("PRIVATE KEY", &generate_ecdsa_p256_pkcs8()).unwrap();
        let s = format!("{key:?}");
        assert!(s.contains("KeyId(") && s.len() < 120, "{s}");
    }

    #[test]
    fn spki_ski_matches_private_key_id() {
        use aws_lc_rs::encoding::AsDer;
        let der = generate_rsa_pkcs8();
        let key = PrivateKey::from_der("PRIVATE KEY", &der).unwrap();
        let pair = aws_lc_rs::rsa::KeyPair::from_pkcs8(&der).unwrap();
        let spki = pair.public_key().as_der().unwrap();
        assert_eq!(KeyId::from_spki_der(spki.as_ref()), Some(key.id()));
        assert_eq!(
            KeyId::from_spki_der(&spki.as_ref()[..40]),
            None,
            "truncated"
        );
        assert_eq!(KeyId::from_spki_der(&[]), None);
    }

    #[test]
    fn garbage_pem_is_a_clear_error() {
        let err =
            PrivateKey::from_pem(b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n")
                .unwrap_err();
        assert!(err.to_string().contains("no private key found"), "{err}");
    }
}
