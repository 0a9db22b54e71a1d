//! Signature algorithms the engines understand, named independently of any TLS library.

use std::fmt;

/// The digest a signature is computed over. Engines receive the digest, not the message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum HashAlgorithm {
    Sha256,
    Sha384,
    Sha512,
}

impl HashAlgorithm {
    /// Length of the digest in bytes.
    pub fn output_len(self) -> usize {
        match self {
            HashAlgorithm::Sha256 => 32,
            HashAlgorithm::Sha384 => 48,
            HashAlgorithm::Sha512 => 64,
        }
    }

    pub(crate) fn aws_lc(self) -> &'static aws_lc_rs::digest::Algorithm {
        match self {
            HashAlgorithm::Sha256 => &aws_lc_rs::digest::SHA256,
            HashAlgorithm::Sha384 => &aws_lc_rs::digest::SHA384,
            HashAlgorithm::Sha512 => &aws_lc_rs::digest::SHA512,
        }
    }

    /// Computes the digest of `message` (a convenience for callers that hold the message).
    pub fn digest(self, message: &[u8]) -> Vec<u8> {
        aws_lc_rs::digest::digest(self.aws_lc(), message)
            .as_ref()
            .to_vec()
    }
}

/// The kind of a private key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum KeyKind {
    Rsa,
    EcdsaP256,
    EcdsaP384,
}

impl KeyKind {
    pub fn as_str(self) -> &'static str {
        match self {
            KeyKind::Rsa => "rsa",
            KeyKind::EcdsaP256 => "ecdsa_p256",
            KeyKind::EcdsaP384 => "ecdsa_p384",
        }
    }
}

/// A signature scheme: key family, padding and digest.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SignatureAlgorithm {
    RsaPkcs1Sha256,
    RsaPkcs1Sha384,
    RsaPkcs1Sha512,
    RsaPssSha256,
    RsaPssSha384,
    RsaPssSha512,
    EcdsaP256Sha256,
    EcdsaP384Sha384,
    /// A P-256 key with SHA-384: TLS 1.2 only, where the hash is independent of the curve
    /// (TLS 1.3's ecdsa_secp384r1_sha384 binds P-384).
    EcdsaP256Sha384,
    /// A P-256 key with SHA-512, likewise TLS 1.2 only.
    EcdsaP256Sha512,
}

impl SignatureAlgorithm {
    pub const ALL: [SignatureAlgorithm; 10] = [
        SignatureAlgorithm::RsaPkcs1Sha256,
        SignatureAlgorithm::RsaPkcs1Sha384,
        SignatureAlgorithm::RsaPkcs1Sha512,
        SignatureAlgorithm::RsaPssSha256,
        SignatureAlgorithm::RsaPssSha384,
        SignatureAlgorithm::RsaPssSha512,
        SignatureAlgorithm::EcdsaP256Sha256,
        SignatureAlgorithm::EcdsaP384Sha384,
        SignatureAlgorithm::EcdsaP256Sha384,
        SignatureAlgorithm::EcdsaP256Sha512,
    ];

    pub fn hash(self) -> HashAlgorithm {
        use SignatureAlgorithm::*;
        match self {
            RsaPkcs1Sha256 | RsaPssSha256 | EcdsaP256Sha256 => HashAlgorithm::Sha256,
            RsaPkcs1Sha384 | RsaPssSha384 | EcdsaP384Sha384 | EcdsaP256Sha384 => {
                HashAlgorithm::Sha384
            }
            RsaPkcs1Sha512 | RsaPssSha512 | EcdsaP256Sha512 => HashAlgorithm::Sha512,
        }
    }

    /// The key kind this algorithm signs with.
    pub fn key_kind(self) -> KeyKind {
        use SignatureAlgorithm::*;
        match self {
            EcdsaP256Sha256 | EcdsaP256Sha384 | EcdsaP256Sha512 => KeyKind::EcdsaP256,
            EcdsaP384Sha384 => KeyKind::EcdsaP384,
            _ => KeyKind::Rsa,
        }
    }

    pub fn is_rsa(self) -> bool {
        self.key_kind() == KeyKind::Rsa
    }

    /// The TLS SignatureScheme code point (RFC 8446 §4.2.3; for the P-256 key with SHA-384 or
    /// SHA-512, the TLS 1.2 (hash, signature) pair it shares with P-384 and P-521).
    pub fn tls_code(self) -> u16 {
        use SignatureAlgorithm::*;
        match self {
            RsaPkcs1Sha256 => 0x0401,
            RsaPkcs1Sha384 => 0x0501,
            RsaPkcs1Sha512 => 0x0601,
            RsaPssSha256 => 0x0804,
            RsaPssSha384 => 0x0805,
            RsaPssSha512 => 0x0806,
            EcdsaP256Sha256 => 0x0403,
            EcdsaP384Sha384 | EcdsaP256Sha384 => 0x0503,
            EcdsaP256Sha512 => 0x0603,
        }
    }

    /// The algorithm for a TLS SignatureScheme code point, if supported, read as TLS 1.3 does
    /// (0x0503 is P-384 with SHA-384).
    pub fn from_tls_code(code: u16) -> Option<Self> {
        Self::ALL.into_iter().find(|a| a.tls_code() == code)
    }

    /// The algorithm for a code point signed with a key of `kind` (in TLS 1.2, 0x0503 and
    /// 0x0603 with a P-256 key are that key with SHA-384 or SHA-512).
    pub fn from_tls_code_for(code: u16, kind: KeyKind) -> Option<Self> {
        Self::ALL
            .into_iter()
            .find(|a| a.tls_code() == code && a.key_kind() == kind)
    }

    /// A stable lower-case name, used in metrics labels and logs.
    pub fn as_str(self) -> &'static str {
        use SignatureAlgorithm::*;
        match self {
            RsaPkcs1Sha256 => "rsa_pkcs1_sha256",
            RsaPkcs1Sha384 => "rsa_pkcs1_sha384",
            RsaPkcs1Sha512 => "rsa_pkcs1_sha512",
            RsaPssSha256 => "rsa_pss_rsae_sha256",
            RsaPssSha384 => "rsa_pss_rsae_sha384",
            RsaPssSha512 => "rsa_pss_rsae_sha512",
            EcdsaP256Sha256 => "ecdsa_secp256r1_sha256",
            EcdsaP384Sha384 => "ecdsa_secp384r1_sha384",
            EcdsaP256Sha384 => "ecdsa_p256_sha384",
            EcdsaP256Sha512 => "ecdsa_p256_sha512",
        }
    }
}

impl fmt::Display for SignatureAlgorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tls_code_round_trips_for_every_algorithm() {
        for a in SignatureAlgorithm::ALL {
            assert_eq!(
                SignatureAlgorithm::from_tls_code_for(a.tls_code(), a.key_kind()),
                Some(a)
            );
        }
        // Without a key, a code point reads as TLS 1.3 does.
        assert_eq!(
            SignatureAlgorithm::from_tls_code(0x0503),
            Some(SignatureAlgorithm::EcdsaP384Sha384)
        );
        assert_eq!(
            SignatureAlgorithm::from_tls_code_for(0x0603, KeyKind::EcdsaP384),
            None
        );
        assert_eq!(SignatureAlgorithm::from_tls_code(0x0807), None); // ed25519: not offered
    }

    #[test]
    fn digest_lengths_match_hash() {
        for a in SignatureAlgorithm::ALL {
            assert_eq!(a.hash().digest(b"abc").len(), a.hash().output_len());
        }
    }
}
