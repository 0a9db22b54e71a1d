//! A key's identity, as certificates and key servers name it.

use std::fmt;

/// A key's identity: the subject key identifier, SHA-1 over the SubjectPublicKey bit string
/// (RFC 5280 §4.2.1.2 method 1). This is what certificates carry and what key servers index by.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct KeyId(pub [u8; 20]);

impl KeyId {
    /// The SKI of a SubjectPublicKey bit string's contents (PKCS#1 RSAPublicKey for RSA, the
    /// uncompressed point for EC).
    pub fn from_public_key_bits(bits: &[u8]) -> Self {
        let d = aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA1_FOR_LEGACY_USE_ONLY, bits);
        let mut id = [0u8; 20];
        id.copy_from_slice(d.as_ref());
        KeyId(id)
    }

    /// The SKI of a DER SubjectPublicKeyInfo (as found in a certificate), or `None` if the
    /// bytes are not a well-formed SubjectPublicKeyInfo.
    pub fn from_spki_der(spki: &[u8]) -> Option<Self> {
        spki_public_key_bits(spki).map(Self::from_public_key_bits)
    }

    pub fn to_hex(&self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }
}

impl fmt::Debug for KeyId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "KeyId({})", self.to_hex())
    }
}

impl fmt::Display for KeyId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}

/// The contents of the subjectPublicKey BIT STRING of a SubjectPublicKeyInfo.
pub(crate) fn spki_public_key_bits(spki: &[u8]) -> Option<&[u8]> {
    let (tag, seq, _) = mbcrypto::der::tlv(spki)?;
    if tag != 0x30 {
        return None;
    }
    let (alg_tag, _, rest) = mbcrypto::der::tlv(seq)?;
    let (bits_tag, bits, _) = mbcrypto::der::tlv(rest)?;
    if alg_tag != 0x30 || bits_tag != 0x03 {
        return None;
    }
    match bits.split_first() {
        Some((0, key)) => Some(key),
        _ => None,
    }
}
