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

/// Blinding pairs per key without lanes: requests take any free one, so batching threads
/// rarely contend.
const BLINDING_SLOTS: usize = 16;

/// How a key blinds its requests and unblinds their results.
enum Blinder {
    /// On the CPU's AVX-512 IFMA lanes, a lane group at a time: mbcrypto's pairs, in the lanes'
    /// Montgomery form; the result is unblinded and checked in one lane pass.
    Lanes(mbcrypto::Backend, mbcrypto::rsa::Blinding),
    /// One request at a time, 64-bit limbs, on a CPU without those lanes; checked by aws-lc.
    Scalar(Vec<Mutex<BlindPair>>),
}

/// The factor that unblinds one request's result, in its blinder's form.
enum Unblind {
    Lanes(mbcrypto::rsa::Unblinder),
    /// r⁻¹·R mod n, 32-bit limbs.
    Scalar(Zeroizing<Vec<u32>>),
}

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
    /// What turns the kernel's output into the signature.
    unblind: Unblind,
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

/// The lanes blinding and the public-exponent check run on: mbcrypto's AVX-512 IFMA passes
/// where the CPU has them (8 requests at once), else none (64-bit limbs and aws-lc, one by one,
/// are faster than portable lanes).
fn cpu_lanes() -> Option<mbcrypto::Backend> {
    static LANES: std::sync::OnceLock<Option<mbcrypto::Backend>> = std::sync::OnceLock::new();
    *LANES.get_or_init(|| {
        let best = mbcrypto::Backend::best();
        (best.lanes() > 1).then_some(best)
    })
}

/// One request to prepare for the kernel.
pub(crate) struct PrepareItem<'a> {
    pub key: &'a GpuKey,
    pub alg: SignatureAlgorithm,
    pub digest: &'a [u8],
}

/// Encodes and blinds each request: keys with lanes a lane group at a time, others one by one.
pub(crate) fn prepare_batch(items: &[PrepareItem]) -> Vec<Result<Prepared, SignError>> {
    let ems: Vec<Result<Zeroizing<Vec<u8>>, SignError>> = items
        .iter()
        .map(|it| padding::encode(it.alg, it.digest, it.key.bits).map(Zeroizing::new))
        .collect();
    let mut jobs = Vec::new();
    let mut on_lanes = Vec::new();
    let mut backend = None;
    for (i, (it, em)) in items.iter().zip(&ems).enumerate() {
        if let (Blinder::Lanes(b, blinding), Ok(em)) = (&it.key.blinder, em) {
            backend = Some(*b);
            on_lanes.push(i);
            jobs.push(mbcrypto::rsa::BlindJob {
                key: &it.key.public,
                blinding,
                message: em,
            });
        }
    }
    let mut blinded = match backend {
        Some(b) => mbcrypto::rsa::blind_batch(b, &jobs),
        None => Vec::new(),
    }
    .into_iter();
    let mut next_lane = on_lanes.iter().peekable();
    items
        .iter()
        .zip(ems)
        .enumerate()
        .map(|(i, (it, em))| {
            let em = em?;
            if next_lane.peek() == Some(&&i) {
                next_lane.next();
                let b = blinded
                    .next()
                    .expect("one result per job")
                    .map_err(|e| SignError::Crypto(e.to_string()))?;
                let input = be_to_limbs(&b.input, 2 * it.key.half()).expect("n's length");
                return Ok(Prepared {
                    input,
                    unblind: Unblind::Lanes(b.unblind),
                    em,
                });
            }
            Ok(it.key.prepare_scalar(em))
        })
        .collect()
}

/// Unblinds each result and releases it only if it verifies with the public key: `None` for a
/// result that does not. On the lanes where the key's blinder has them.
pub(crate) fn finish_batch(items: &[Finish]) -> Vec<Option<Vec<u8>>> {
    let outputs: Vec<Option<Vec<u8>>> = items
        .iter()
        .map(|f| match f.prepared.unblind {
            Unblind::Lanes(_) => Some(limbs_to_be(f.raw, f.key.bits / 8)),
            Unblind::Scalar(_) => None,
        })
        .collect();
    let mut jobs = Vec::new();
    let mut backend = None;
    for (f, out) in items.iter().zip(&outputs) {
        if let (Unblind::Lanes(u), Some(out), Blinder::Lanes(b, _)) =
            (&f.prepared.unblind, out, &f.key.blinder)
        {
            backend = Some(*b);
            jobs.push(mbcrypto::rsa::UnblindJob {
                key: &f.key.public,
                output: out,
                unblind: u,
                expected: &f.prepared.em,
            });
        }
    }
    let mut on_lanes = match backend {
        Some(b) => mbcrypto::rsa::unblind_verify_batch(b, &jobs),
        None => Vec::new(),
    }
    .into_iter();
    items
        .iter()
        .zip(&outputs)
        .map(|(f, out)| match out {
            Some(_) => on_lanes.next().flatten(),
            _ => f
                .key
                .unblind_scalar(f.prepared, f.raw)
                .filter(|s| f.key.private.verify_digest(f.alg, f.digest, s)),
        })
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
    blinder: Blinder,
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
        Self::with_lanes(der, cpu_lanes())
    }

    /// As [`GpuKey::from_der`], blinding on `lanes` (one request at a time without).
    pub(crate) fn with_lanes(
        der: &[u8],
        lanes: Option<mbcrypto::Backend>,
    ) -> Result<Self, GpuError> {
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
        let blinder = match lanes {
            Some(backend) => {
                let (r, r_inv) = new_factor(&modulus, &fermat, bits / 8);
                // Enough pairs that every CPU thread can hold a lane group.
                let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
                let slots = (threads * backend.lanes() * 2).clamp(64, 4096);
                let len = bits / 8;
                let blinding = mbcrypto::rsa::Blinding::new(
                    &public,
                    &limbs_to_be(&r, len),
                    &limbs_to_be(&r_inv, len),
                    slots,
                )
                .map_err(|e| GpuError::KeyLoad(e.to_string()))?;
                Blinder::Lanes(backend, blinding)
            }
            None => Blinder::Scalar(
                (0..BLINDING_SLOTS)
                    .map(|_| {
                        let (r, r_inv) = new_factor(&modulus, &fermat, bits / 8);
                        Mutex::new(BlindPair {
                            blind: modulus.mont_mul(&modulus.pow_public(&r, e), modulus.rr()),
                            unblind: modulus.mont_mul(&r_inv, modulus.rr()),
                        })
                    })
                    .collect(),
            ),
        };
        Ok(GpuKey {
            id: private.id(),
            private,
            bits,
            crt,
            modulus,
            public,
            blinder,
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

    /// Blinds one encoded message with this key's scalar pairs.
    fn prepare_scalar(&self, em: Zeroizing<Vec<u8>>) -> Prepared {
        let msg = Zeroizing::new(be_to_limbs(&em, 2 * self.half()).expect("encoded to n's length"));
        let Blinder::Scalar(slots) = &self.blinder else {
            unreachable!("called for keys without lanes")
        };
        let mut pair = self.take_pair(slots);
        let input = self.modulus.mont_mul(&msg, &pair.blind);
        let unblind = Unblind::Scalar(Zeroizing::new(pair.unblind.clone()));
        // Next request on this slot uses r²: square both halves (constant time).
        let blind = self.modulus.mont_mul(&pair.blind, &pair.blind);
        let unb = self.modulus.mont_mul(&pair.unblind, &pair.unblind);
        pair.blind.zeroize();
        pair.unblind.zeroize();
        pair.blind = blind;
        pair.unblind = unb;
        Prepared { input, unblind, em }
    }

    /// Encodes and blinds one request ([`prepare_batch`] of one).
    #[cfg(test)]
    pub(crate) fn prepare(
        &self,
        alg: SignatureAlgorithm,
        digest: &[u8],
    ) -> Result<Prepared, SignError> {
        let item = PrepareItem {
            key: self,
            alg,
            digest,
        };
        prepare_batch(&[item]).pop().expect("one result")
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

    /// The kernel's output for `prepared` times r⁻¹ (scalar pairs): the signature, not yet
    /// verified. `None` for an output not below n (a fault: the Montgomery product needs
    /// operands below n).
    fn unblind_scalar(&self, prepared: &Prepared, raw: &[u32]) -> Option<Vec<u8>> {
        let Unblind::Scalar(unblind) = &prepared.unblind else {
            return None;
        };
        if !below(raw, self.modulus.value()) {
            return None;
        }
        let s = Zeroizing::new(self.modulus.mont_mul(raw, unblind));
        Some(limbs_to_be(&s, self.bits / 8))
    }

    fn take_pair<'a>(&self, slots: &'a [Mutex<BlindPair>]) -> std::sync::MutexGuard<'a, BlindPair> {
        let start = self.next.fetch_add(1, Ordering::Relaxed);
        for i in 0..slots.len() {
            if let Ok(g) = slots[(start + i) % slots.len()].try_lock() {
                return g;
            }
        }
        slots[start % slots.len()]
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }
}

/// a < b for equal-length limb vectors (public comparison of a result).
fn below(a: &[u32], b: &[u32]) -> bool {
    a.len() == b.len() && a.iter().rev().cmp(b.iter().rev()) == std::cmp::Ordering::Less
}

/// A fresh secret blinding factor r below n and its inverse (32-bit limbs), r⁻¹ with the kernel
/// core itself (exponents p-2 and q-2, Fermat, recombined by CRT).
fn new_factor(
    modulus: &Modulus,
    fermat: &CrtKey,
    len: usize,
) -> (Zeroizing<Vec<u32>>, Zeroizing<Vec<u32>>) {
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
        let r_inv = Zeroizing::new(fermat.crt(&r));
        // r·r⁻¹ must be 1 (fails only if r shares a factor with n: never in practice).
        let check = modulus.mont_mul(&modulus.mont_mul(&r, &r_inv), modulus.rr());
        if check == unit {
            return (r, r_inv);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testkeys::rsa_der;

    #[test]
    fn prepared_requests_are_blinded_and_finish_to_verified_signatures() {
        // On the lanes where this CPU has them, and one at a time.
        for (bits, lanes) in [(2048, cpu_lanes()), (3072, cpu_lanes()), (2048, None)] {
            let key = GpuKey::with_lanes(&rsa_der(bits), lanes).unwrap();
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
    fn a_batch_mixes_keys_with_and_without_lanes() {
        let keys = [
            GpuKey::with_lanes(&rsa_der(2048), cpu_lanes()).unwrap(),
            GpuKey::with_lanes(&rsa_der(3072), None).unwrap(),
        ];
        let alg = SignatureAlgorithm::RsaPssSha256;
        let digest = alg.hash().digest(b"mixed");
        let items: Vec<PrepareItem> = (0..19)
            .map(|i| PrepareItem {
                key: &keys[i % 3 % 2],
                alg,
                digest: &digest,
            })
            .collect();
        let prepared: Vec<Prepared> = prepare_batch(&items)
            .into_iter()
            .map(|p| p.unwrap())
            .collect();
        let raw: Vec<Vec<u32>> = items
            .iter()
            .zip(&prepared)
            .map(|(it, p)| it.key.crt().crt(&p.input))
            .collect();
        let finish: Vec<Finish> = (0..items.len())
            .map(|i| Finish {
                key: items[i].key,
                prepared: &prepared[i],
                raw: &raw[i],
                alg,
                digest: &digest,
            })
            .collect();
        for (i, sig) in finish_batch(&finish).into_iter().enumerate() {
            let sig = sig.unwrap_or_else(|| panic!("request {i} did not verify"));
            assert!(items[i].key.private().verify_digest(alg, &digest, &sig));
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
