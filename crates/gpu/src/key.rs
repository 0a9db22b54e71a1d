//! Keys prepared for the GPU: the kernel's key record, the public modulus for blinding, and the
//! blinding pairs. Padding, blinding, unblinding and verification all run on the CPU.

use crate::error::GpuError;
use crate::host_core::{be_to_limbs, limbs_to_be, CrtKey, Modulus};
use crate::padding;
use keyengine::{KeyId, PrivateKey, SignError, SignatureAlgorithm};
use mbcrypto::der;
use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use zeroize::{Zeroize, Zeroizing};

/// Blinding pairs per key: requests take any free one, so batching threads rarely contend.
const BLINDING_SLOTS: usize = 16;

/// (r^e·R mod n, r⁻¹·R mod n) for a secret random r; squared after every use.
struct BlindPair {
    blind: Vec<u32>,
    unblind: Vec<u32>,
}

impl Drop for BlindPair {
    fn drop(&mut self) {
        self.blind.zeroize();
        self.unblind.zeroize();
    }
}

/// A request made ready for the kernel: the blinded encoded message, and what is needed to
/// finish it.
pub(crate) struct Prepared {
    /// (em · r^e) mod n, 2·half limbs: what the GPU raises to d.
    pub input: Vec<u32>,
    /// r⁻¹·R mod n for this request.
    unblind: Zeroizing<Vec<u32>>,
    /// The encoded message: the signature raised to e must give exactly this.
    em: Zeroizing<Vec<u8>>,
}

/// One kernel result to finish: its key, what `prepare` made for it, the kernel's output, and
/// the request (for the one-by-one verifier).
pub(crate) struct Finish<'a> {
    pub key: &'a GpuKey,
    pub prepared: &'a Prepared,
    pub raw: &'a [u32],
    pub alg: SignatureAlgorithm,
    pub digest: &'a [u8],
}

/// The lanes the public-exponent check runs on: mbcrypto's AVX-512 IFMA pass where the CPU has
/// it (8 signatures at once), else none (aws-lc, one by one, is faster than portable lanes).
fn verify_lanes() -> Option<mbcrypto::Backend> {
    static LANES: std::sync::OnceLock<Option<mbcrypto::Backend>> = std::sync::OnceLock::new();
    *LANES.get_or_init(|| {
        let best = mbcrypto::Backend::best();
        (best.lanes() > 1).then_some(best)
    })
}

/// Unblinds each result and releases it only if it verifies with the public key: `None` for a
/// result that does not. Checked lanes at a time where the CPU allows ([`verify_lanes`]).
pub(crate) fn finish_batch(items: &[Finish]) -> Vec<Option<Vec<u8>>> {
    let sigs: Vec<Option<Vec<u8>>> = items
        .iter()
        .map(|f| f.key.unblind(f.prepared, f.raw))
        .collect();
    let Some(lanes) = verify_lanes() else {
        return items
            .iter()
            .zip(sigs)
            .map(|(f, sig)| sig.filter(|s| f.key.private.verify_digest(f.alg, f.digest, s)))
            .collect();
    };
    // A result refused before the check (not below n) goes in empty: the wrong length fails.
    let batch: Vec<mbcrypto::rsa::VerifyItem> = items
        .iter()
        .zip(&sigs)
        .map(|(f, sig)| mbcrypto::rsa::VerifyItem {
            key: &f.key.public,
            signature: sig.as_deref().unwrap_or_default(),
            expected: &f.prepared.em,
        })
        .collect();
    let ok = mbcrypto::rsa::verify_batch(lanes, &batch);
    sigs.into_iter()
        .zip(ok)
        .map(|(sig, good)| sig.filter(|_| good))
        .collect()
}

/// An RSA key prepared for the GPU engine. `Debug` shows only id and size.
pub struct GpuKey {
    id: KeyId,
    private: std::sync::Arc<PrivateKey>,
    bits: usize,
    crt: CrtKey,
    modulus: Modulus,
    /// n and e for the lanes' public-exponent check.
    public: mbcrypto::rsa::RsaPublicKey,
    blinding: Vec<Mutex<BlindPair>>,
    next: AtomicUsize,
}

impl fmt::Debug for GpuKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "GpuKey({}, RSA-{})", self.id, self.bits)
    }
}

impl GpuKey {
    /// Prepares an RSA private key (PKCS#1 or PKCS#8 DER) for the GPU.
    pub fn from_der(der: &[u8]) -> Result<Self, GpuError> {
        let (f, pkcs8) = der::rsa_private_key(der).ok_or(GpuError::NotRsa)?;
        let label = if pkcs8 {
            "PRIVATE KEY"
        } else {
            "RSA PRIVATE KEY"
        };
        let private = std::sync::Arc::new(
            PrivateKey::from_der(label, der).map_err(|e| GpuError::KeyLoad(e.to_string()))?,
        );
        let bits = match f.n.iter().position(|&b| b != 0) {
            Some(i) => (f.n.len() - i) * 8 - f.n[i].leading_zeros() as usize,
            None => 0,
        };
        let crt = CrtKey::from_components(bits, f.p, f.q, f.dp, f.dq, f.qinv)?;
        let half = crt.half();
        let modulus = Modulus::new(f.n, 2 * half).ok_or(GpuError::NotRsa)?;
        if f.e.len() > 8 || f.e.is_empty() {
            return Err(GpuError::Key(crate::host_core::CoreKeyError::Unsupported(
                bits,
            )));
        }
        let e = f.e.iter().fold(0u64, |a, &b| (a << 8) | b as u64);
        let public = mbcrypto::rsa::RsaPublicKey::new(f.n, e)
            .map_err(|_| GpuError::Key(crate::host_core::CoreKeyError::Unsupported(bits)))?;
        let sub2 = |x: &[u8]| {
            let mut out = x.to_vec();
            let mut borrow = 2u16;
            for b in out.iter_mut().rev() {
                let t = (*b as u16).wrapping_sub(borrow);
                *b = t as u8;
                borrow = (t >> 15) & 1;
            }
            Zeroizing::new(out)
        };
        let fermat = crt.with_exponents(&sub2(f.p), &sub2(f.q))?;
        let blinding = (0..BLINDING_SLOTS)
            .map(|_| Mutex::new(new_pair(&modulus, e, &fermat, bits / 8)))
            .collect();
        Ok(GpuKey {
            id: private.id(),
            private,
            bits,
            crt,
            modulus,
            public,
            blinding,
            next: AtomicUsize::new(0),
        })
    }

    pub fn id(&self) -> KeyId {
        self.id
    }

    /// Modulus size in bits.
    pub fn bits(&self) -> usize {
        self.bits
    }

    /// Limbs per prime (32, 48, 64): the kernel variant this key runs on.
    pub fn half(&self) -> usize {
        self.crt.half()
    }

    /// The kernel's key record.
    pub fn record(&self) -> &[u32] {
        self.crt.record()
    }

    /// The CPU build of the kernel core (for self-tests and the simulated GPU).
    pub fn crt(&self) -> &CrtKey {
        &self.crt
    }

    /// The private key (for the CPU fallback path and verification).
    pub fn private(&self) -> &std::sync::Arc<PrivateKey> {
        &self.private
    }

    /// Encodes and blinds one request.
    pub(crate) fn prepare(
        &self,
        alg: SignatureAlgorithm,
        digest: &[u8],
    ) -> Result<Prepared, SignError> {
        let em = Zeroizing::new(padding::encode(alg, digest, self.bits)?);
        let msg = Zeroizing::new(be_to_limbs(&em, 2 * self.half()).expect("encoded to n's length"));
        let mut pair = self.take_pair();
        let input = self.modulus.mont_mul(&msg, &pair.blind);
        let unblind = Zeroizing::new(pair.unblind.clone());
        // Next request on this slot uses r²: square both halves (constant time).
        let blind = self.modulus.mont_mul(&pair.blind, &pair.blind);
        let unb = self.modulus.mont_mul(&pair.unblind, &pair.unblind);
        pair.blind.zeroize();
        pair.unblind.zeroize();
        pair.blind = blind;
        pair.unblind = unb;
        Ok(Prepared { input, unblind, em })
    }

    /// Unblinds the kernel's output for `prepared`, and releases the signature only if it
    /// verifies with the public key ([`finish_batch`] of one).
    #[cfg(test)]
    pub(crate) fn finish(
        &self,
        prepared: &Prepared,
        raw: &[u32],
        alg: SignatureAlgorithm,
        digest: &[u8],
    ) -> Option<Vec<u8>> {
        let item = Finish {
            key: self,
            prepared,
            raw,
            alg,
            digest,
        };
        finish_batch(&[item]).pop().flatten()
    }

    /// The kernel's output for `prepared` times r⁻¹: the signature, not yet verified. `None`
    /// for an output not below n (a fault: the Montgomery product needs operands below n).
    fn unblind(&self, prepared: &Prepared, raw: &[u32]) -> Option<Vec<u8>> {
        if !below(raw, self.modulus.value()) {
            return None;
        }
        let s = Zeroizing::new(self.modulus.mont_mul(raw, &prepared.unblind));
        Some(limbs_to_be(&s, self.bits / 8))
    }

    fn take_pair(&self) -> std::sync::MutexGuard<'_, BlindPair> {
        let start = self.next.fetch_add(1, Ordering::Relaxed);
        for i in 0..self.blinding.len() {
            if let Ok(g) = self.blinding[(start + i) % self.blinding.len()].try_lock() {
                return g;
            }
        }
        self.blinding[start % self.blinding.len()]
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }
}

/// a < b for equal-length limb vectors (public comparison of a result).
fn below(a: &[u32], b: &[u32]) -> bool {
    a.len() == b.len() && a.iter().rev().cmp(b.iter().rev()) == std::cmp::Ordering::Less
}

/// A fresh blinding pair: r random below n, r^e by the public operation, r⁻¹ with the kernel
/// core itself (exponents p-2 and q-2, Fermat, recombined by CRT).
fn new_pair(modulus: &Modulus, e: u64, fermat: &CrtKey, len: usize) -> BlindPair {
    let limbs = modulus.limbs();
    let mut unit = vec![0u32; limbs];
    unit[0] = 1;
    loop {
        let mut bytes = Zeroizing::new(vec![0u8; len]);
        // One byte short of the modulus length: below n, whose top byte is non-zero.
        aws_lc_rs::rand::fill(&mut bytes[1..]).expect("system randomness");
        let r = Zeroizing::new(be_to_limbs(&bytes, limbs).expect("fits"));
        if r.iter().all(|&l| l == 0) {
            continue;
        }
        let r_e = Zeroizing::new(modulus.pow_public(&r, e));
        let r_inv = Zeroizing::new(fermat.crt(&r));
        // r·r⁻¹ must be 1 (fails only if r shares a factor with n: never in practice).
        let check = modulus.mont_mul(&modulus.mont_mul(&r, &r_inv), modulus.rr());
        if check != unit {
            continue;
        }
        return BlindPair {
            blind: modulus.mont_mul(&r_e, modulus.rr()),
            unblind: modulus.mont_mul(&r_inv, modulus.rr()),
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testkeys::rsa_der;

    #[test]
    fn prepared_requests_are_blinded_and_finish_to_verified_signatures() {
        for bits in [2048, 3072] {
            let key = GpuKey::from_der(&rsa_der(bits)).unwrap();
            assert_eq!(key.bits(), bits as usize);
            for alg in [
                SignatureAlgorithm::RsaPkcs1Sha256,
                SignatureAlgorithm::RsaPssSha384,
                SignatureAlgorithm::RsaPkcs1Sha512,
            ] {
                let digest = alg.hash().digest(b"transcript");
                let a = key.prepare(alg, &digest).unwrap();
                let b = key.prepare(alg, &digest).unwrap();
                if matches!(alg, SignatureAlgorithm::RsaPkcs1Sha256) {
                    // Deterministic padding, so only blinding can make these differ.
                    assert_ne!(a.input, b.input, "blinding must randomize the kernel input");
                }
                let raw = key.crt().crt(&a.input);
                let sig = key.finish(&a, &raw, alg, &digest).expect("verifies");
                assert!(key.private().verify_digest(alg, &digest, &sig));
                let mut bad = raw.clone();
                bad[3] ^= 1;
                assert!(key.finish(&a, &bad, alg, &digest).is_none(), "fault caught");
                // Using b's unblinding factor on a's output is wrong: the factors are per request.
                assert!(key.finish(&b, &raw, alg, &digest).is_none());
            }
        }
    }

    #[test]
    fn out_of_range_output_is_refused() {
        let key = GpuKey::from_der(&rsa_der(2048)).unwrap();
        let alg = SignatureAlgorithm::RsaPssSha256;
        let d = alg.hash().digest(b"m");
        let p = key.prepare(alg, &d).unwrap();
        assert!(key.finish(&p, &[u32::MAX; 64], alg, &d).is_none());
    }

    #[test]
    fn non_rsa_and_debug() {
        assert_eq!(GpuKey::from_der(&[0x30, 0]).unwrap_err(), GpuError::NotRsa);
        let key = GpuKey::from_der(&rsa_der(2048)).unwrap();
        let s = format!("{key:?}");
        assert!(s.starts_with("GpuKey(") && s.len() < 70, "{s}");
    }
}
