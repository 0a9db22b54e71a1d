//! RSA private-key operations over several requests at once.
//!
//! [`RsaKey::from_der`] prepares a 2048-, 3072- or 4096-bit key (two primes of half the modulus
//! size) for the kernel: limbs, Montgomery constants, CRT exponents. [`sign_batch`] encodes
//! each request (PKCS#1 v1.5 or PSS), fills the backend's lanes, runs one blinded CRT pass, then
//! checks every signature with the public exponent before returning it: a lane whose result
//! does not verify comes back as [`RsaError::FaultDetected`], never as a signature.

use crate::bignum::{
    bit_len, bytes_to_limbs, bytes_to_words, limbs_to_bytes, neg_inv52, pow2_mod, sub_small,
};
use crate::mont::{self, CrtInputs, Half};
pub use crate::padding::PaddingError;
use crate::padding::{self, Hash};
use crate::Backend;
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock};
use zeroize::Zeroize;

mod blinding;
pub use blinding::{
    blind_batch, unblind_verify_batch, BlindJob, Blinded, Blinding, UnblindJob, Unblinder,
};

/// Blinding pairs per key. A pass holds one per lane; more slots than
/// `crypto threads × lanes` means a pass never waits for another to release one.
const BLINDING_SLOTS: usize = 64;

/// Why a key was not prepared or a signature not produced. Never carries key material.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RsaError {
    #[error("not an RSA private key (PKCS#1 or PKCS#8 DER)")]
    NotRsa,
    #[error("RSA-{0} is not supported by the batch path (2048, 3072 or 4096 bits with two equal-size primes and e below 2^64)")]
    Unsupported(usize),
    #[error(transparent)]
    Padding(#[from] PaddingError),
    #[error("signature failed verification with the public key (fault detected)")]
    FaultDetected,
    #[error("the blinding factor and its inverse do not multiply to one mod n")]
    Blinding,
    #[error("the input is not a number below the modulus of the modulus's length")]
    OutOfRange,
}

/// The signature encoding.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Scheme {
    Pkcs1(Hash),
    Pss(Hash),
}

struct Prime {
    m: Vec<u64>,
    k0: u64,
    rrr: Vec<u64>,
    one: Vec<u64>,
    /// The CRT exponent (d mod (m-1)), words with a spare zero word.
    exp: Vec<u64>,
    /// m - 2, for inversion by Fermat when blinding is set up.
    m_minus_2: Vec<u64>,
}

impl Drop for Prime {
    fn drop(&mut self) {
        self.m.zeroize();
        self.rrr.zeroize();
        self.one.zeroize();
        self.exp.zeroize();
        self.m_minus_2.zeroize();
    }
}

struct BlindPair {
    /// r^e·R mod n.
    blind: Vec<u64>,
    /// r⁻¹·R mod n.
    unblind: Vec<u64>,
}

impl Drop for BlindPair {
    fn drop(&mut self) {
        self.blind.zeroize();
        self.unblind.zeroize();
    }
}

/// An RSA private key prepared for the multi-buffer kernel. `Debug` shows only the size.
pub struct RsaKey {
    bits: usize,
    /// The public half: n (its limbs, Montgomery constants) and e.
    public: RsaPublicKey,
    p: Prime,
    q: Prime,
    /// q⁻¹·R mod p.
    qinv: Vec<u64>,
    exp_bits: usize,
    blinding: OnceLock<Vec<Mutex<BlindPair>>>,
    next_slot: AtomicUsize,
    fault_next: AtomicBool,
}

impl fmt::Debug for RsaKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RsaKey(RSA-{})", self.bits)
    }
}

impl Drop for RsaKey {
    fn drop(&mut self) {
        self.qinv.zeroize();
    }
}

/// a·b·R⁻¹ mod m (fully reduced) for one-lane numbers of 20, 30, 40, 60 or 80 limbs.
fn mont_mul(a: &[u64], b: &[u64], m: &[u64], k0: u64) -> Vec<u64> {
    match m.len() {
        20 => mont::prep::mont_mul::<20>(a, b, m, k0),
        30 => mont::prep::mont_mul::<30>(a, b, m, k0),
        40 => mont::prep::mont_mul::<40>(a, b, m, k0),
        60 => mont::prep::mont_mul::<60>(a, b, m, k0),
        80 => mont::prep::mont_mul::<80>(a, b, m, k0),
        _ => unreachable!("limb counts are checked at key load"),
    }
}

impl RsaKey {
    /// Prepares a PKCS#1 RSAPrivateKey or a PKCS#8 PrivateKeyInfo holding one.
    pub fn from_der(der: &[u8]) -> Result<Self, RsaError> {
        let (f, _) = crate::der::rsa_private_key(der).ok_or(RsaError::NotRsa)?;
        let bits = bit_len(f.n);
        let half = match bits {
            2048 => 20,
            3072 => 30,
            4096 => 40,
            _ => return Err(RsaError::Unsupported(bits)),
        };
        let equal_primes = bit_len(f.p) == bits / 2 && bit_len(f.q) == bits / 2;
        let odd = |x: &[u8]| x.last().is_some_and(|b| b & 1 == 1);
        if !equal_primes || !odd(f.p) || !odd(f.q) || bit_len(f.e) > 64 || !odd(f.e) {
            return Err(RsaError::Unsupported(bits));
        }
        let exp_bits = (bits / 2).div_ceil(5) * 5;
        let words = exp_bits.div_ceil(64) + 1;
        let prime = |m: &[u8], d: &[u8]| {
            let limbs = bytes_to_limbs(m, half);
            let k0 = neg_inv52(limbs[0]);
            let rr = pow2_mod(2 * 52 * half, &limbs);
            let rrr = mont_mul(&rr, &rr, &limbs, k0);
            let mut unit = vec![0u64; half];
            unit[0] = 1;
            let one = mont_mul(&rr, &unit, &limbs, k0);
            let mut m2 = sub_small(m, 2);
            let prime = Prime {
                exp: bytes_to_words(d, words),
                m_minus_2: bytes_to_words(&m2, words),
                m: limbs,
                k0,
                rrr,
                one,
            };
            m2.zeroize();
            (prime, rr)
        };
        let (p, mut p_rr) = prime(f.p, f.dp);
        let (q, mut q_rr) = prime(f.q, f.dq);
        q_rr.zeroize();
        let mut qinv_plain = bytes_to_limbs(f.qinv, half);
        let qinv = mont_mul(&qinv_plain, &p_rr, &p.m, p.k0);
        qinv_plain.zeroize();
        p_rr.zeroize();
        let e = bytes_to_words(f.e, 1)[0];
        Ok(RsaKey {
            bits,
            public: RsaPublicKey::prepared(f.n, bits, half, e),
            p,
            q,
            qinv,
            exp_bits,
            blinding: OnceLock::new(),
            next_slot: AtomicUsize::new(0),
            fault_next: AtomicBool::new(false),
        })
    }

    /// Modulus size in bits.
    pub fn bits(&self) -> usize {
        self.bits
    }

    /// Signature length in bytes.
    pub fn signature_len(&self) -> usize {
        self.public.len
    }

    /// Test hook: corrupt this key's next signature after the kernel and before verification,
    /// as a hardware fault would. Verification must catch it.
    #[doc(hidden)]
    pub fn inject_fault_once(&self) {
        self.fault_next.store(true, Ordering::SeqCst);
    }

    /// The blinding slots, set up on first use: r random, r^e by the public operation, r⁻¹ by
    /// the CRT kernel itself with exponents p-2 and q-2 (Fermat), then slot i holds r^(2i+1).
    /// A slot is squared after each use, so its factors are r^((2i+1)·2^k): odd starts keep
    /// every slot's factors apart (with r^(i+1), slot 1's r² was slot 0's second factor).
    fn blinding(&self) -> &[Mutex<BlindPair>] {
        self.blinding.get_or_init(|| {
            let wide = 2 * self.public.half;
            let mut r_bytes = vec![0u8; self.public.len];
            loop {
                aws_lc_rs::rand::fill(&mut r_bytes[1..]).expect("system randomness");
                if r_bytes.iter().any(|&b| b != 0) {
                    break;
                }
            }
            let r = bytes_to_limbs(&r_bytes, wide);
            r_bytes.zeroize();
            let mut r_e = vec![0u64; wide];
            // SAFETY: the portable backend needs no CPU feature; every buffer has one lane of
            // the limb counts the pass expects.
            unsafe {
                mont::public_fn(Backend::Portable, self.public.half)(
                    &r,
                    &self.public.n,
                    &[self.public.n_k0],
                    &self.public.n_rr,
                    &[self.public.e],
                    &mut r_e,
                )
            };
            let mut unit = vec![0u64; wide];
            unit[0] = 1;
            let one = mont_mul(&self.public.n_rr, &unit, &self.public.n, self.public.n_k0);
            let mut r_inv = vec![0u64; wide];
            let mut id_blind = one.clone();
            let mut id_unblind = one;
            let mut io = CrtInputs {
                msg: &r,
                n: &self.public.n,
                n_k0: &[self.public.n_k0],
                blind: &mut id_blind,
                unblind: &mut id_unblind,
                p: self.half_inputs(&self.p, [&self.p.m_minus_2[..]; 8]),
                q: self.half_inputs(&self.q, [&self.q.m_minus_2[..]; 8]),
                qinv: &self.qinv,
            };
            // SAFETY: as above.
            unsafe { mont::crt_fn(Backend::Portable, self.public.half)(&mut io, &mut r_inv) };
            let base = BlindPair {
                blind: mont_mul(&r_e, &self.public.n_rr, &self.public.n, self.public.n_k0),
                unblind: mont_mul(&r_inv, &self.public.n_rr, &self.public.n, self.public.n_k0),
            };
            r_inv.zeroize();
            let mut slots = Vec::with_capacity(BLINDING_SLOTS);
            let (n, k0) = (&self.public.n, self.public.n_k0);
            let step = BlindPair {
                blind: mont_mul(&base.blind, &base.blind, n, k0),
                unblind: mont_mul(&base.unblind, &base.unblind, n, k0),
            };
            let mut cur = base;
            for _ in 0..BLINDING_SLOTS {
                let next = BlindPair {
                    blind: mont_mul(&cur.blind, &step.blind, n, k0),
                    unblind: mont_mul(&cur.unblind, &step.unblind, n, k0),
                };
                slots.push(Mutex::new(cur));
                cur = next;
            }
            slots
        })
    }

    fn half_inputs<'a>(&'a self, prime: &'a Prime, exp: [&'a [u64]; 8]) -> Half<'a> {
        Half {
            m: &prime.m,
            k0: std::slice::from_ref(&prime.k0),
            rrr: &prime.rrr,
            one: &prime.one,
            exp,
            exp_bits: self.exp_bits,
        }
    }

    /// The blinding slots and where the next search for a free one starts.
    fn slots(&self) -> Slots<'_> {
        Slots {
            pairs: self.blinding(),
            next: &self.next_slot,
        }
    }

    fn encode(&self, scheme: Scheme, digest: &[u8]) -> Result<Vec<u8>, RsaError> {
        Ok(match scheme {
            Scheme::Pkcs1(h) => padding::pkcs1_v15(h, digest, self.public.len)?,
            Scheme::Pss(h) => padding::pss(h, digest, self.bits)?,
        })
    }
}

/// One key's blinding slots, as [`take_slots`] searches them.
#[derive(Clone, Copy)]
struct Slots<'a> {
    pairs: &'a [Mutex<BlindPair>],
    next: &'a AtomicUsize,
}

impl<'a> Slots<'a> {
    /// A free slot, if there is one.
    fn try_take(self) -> Option<MutexGuard<'a, BlindPair>> {
        let start = self.next.fetch_add(1, Ordering::Relaxed);
        let len = self.pairs.len();
        (0..len).find_map(|i| self.pairs[(start + i) % len].try_lock().ok())
    }
}

/// Free slots for the first of `from` (one per lane of a pass; entries may name the same key):
/// as many as are free in order, and at least one. It waits only while holding none: waiting
/// for the next slot while holding some let passes on more threads than the slots cover wait
/// on each other in a cycle, and a pass wanting more slots of one key than it has wait forever.
fn take_slots<'a>(from: &[Slots<'a>]) -> Vec<MutexGuard<'a, BlindPair>> {
    let taken: Vec<_> = from.iter().map_while(|s| s.try_take()).collect();
    if !taken.is_empty() || from.is_empty() {
        return taken;
    }
    let first = from[0];
    let start = first.next.fetch_add(1, Ordering::Relaxed);
    vec![first.pairs[start % first.pairs.len()]
        .lock()
        .unwrap_or_else(|e| e.into_inner())]
}

/// One request: sign `digest` with `key` under `scheme`.
#[derive(Clone, Copy)]
pub struct SignJob<'a> {
    pub key: &'a RsaKey,
    pub scheme: Scheme,
    pub digest: &'a [u8],
}

/// Interleaves per-lane numbers of `limbs` limbs into limb-major lane layout.
fn interleave(values: &[&[u64]], lanes: usize, limbs: usize) -> Vec<u64> {
    let mut out = vec![0u64; limbs * lanes];
    for (lane, v) in values.iter().enumerate() {
        for j in 0..limbs {
            out[j * lanes + lane] = v[j];
        }
    }
    out
}

/// Lane l's number `f(l)` for each of `lanes` lanes, interleaved limb-major.
fn interleave_lanes<'a>(lanes: usize, wide: usize, f: impl Fn(usize) -> &'a [u64]) -> Vec<u64> {
    interleave(&(0..lanes).map(f).collect::<Vec<_>>(), lanes, wide)
}

/// The public-exponent pass over `sig` (interleaved, each lane below its key's modulus): each
/// lane's s^e mod n, interleaved, for primes of `half` limbs. `keys` has one key per lane.
/// The backend must be available (callers assert it).
fn public_pass(
    backend: Backend,
    half: usize,
    keys: &[&RsaPublicKey],
    sig: &[u64],
) -> zeroize::Zeroizing<Vec<u64>> {
    let (lanes, wide) = (backend.lanes(), 2 * half);
    assert!(keys.len() == lanes && sig.len() == lanes * wide && backend.available());
    let n = interleave_lanes(lanes, wide, |l| &keys[l].n);
    let n_rr = interleave_lanes(lanes, wide, |l| &keys[l].n_rr);
    let k0: Vec<u64> = keys.iter().map(|k| k.n_k0).collect();
    let e: Vec<u64> = keys.iter().map(|k| k.e).collect();
    let mut check = zeroize::Zeroizing::new(vec![0u64; wide * lanes]);
    // SAFETY: the backend is available (asserted); every buffer has `lanes` lanes of `wide`
    // limbs for this size, and each signature is below its lane's modulus (the caller's).
    unsafe { mont::public_fn(backend, half)(sig, &n, &k0, &n_rr, &e, &mut check) };
    check
}

fn lane_of(buf: &[u64], lanes: usize, lane: usize) -> Vec<u64> {
    buf.iter().skip(lane).step_by(lanes).copied().collect()
}

/// Signs every job, `backend.lanes()` at a time. Jobs may mix keys and sizes (a pass holds one
/// size). Results come back in job order; each `Ok` has been verified with the public key.
pub fn sign_batch(backend: Backend, jobs: &[SignJob]) -> Vec<Result<Vec<u8>, RsaError>> {
    assert!(
        backend.available(),
        "backend {backend} is not available on this CPU"
    );
    let mut results: Vec<Option<Result<Vec<u8>, RsaError>>> = vec![None; jobs.len()];
    let mut ready: Vec<(usize, Vec<u8>)> = Vec::with_capacity(jobs.len());
    for (i, job) in jobs.iter().enumerate() {
        match job.key.encode(job.scheme, job.digest) {
            Ok(em) => ready.push((i, em)),
            Err(e) => results[i] = Some(Err(e)),
        }
    }
    for half in [20, 30, 40] {
        let same: Vec<&(usize, Vec<u8>)> = ready
            .iter()
            .filter(|(i, _)| jobs[*i].key.public.half == half)
            .collect();
        let mut rest = &same[..];
        while !rest.is_empty() {
            // A pass may take fewer than it was offered (blinding slots all busy).
            let out = sign_pass(
                backend,
                jobs,
                &rest[..rest.len().min(backend.lanes())],
                None,
            );
            for ((i, _), r) in rest.iter().zip(&out) {
                results[*i] = Some(r.clone());
            }
            rest = &rest[out.len()..];
        }
    }
    results
        .into_iter()
        .map(|r| r.expect("every job answered"))
        .collect()
}

/// One kernel pass over the first of up to `lanes` encoded jobs of the same size: as many as
/// blinding slots could be taken for (at least one); their results, in order. Spare lanes
/// repeat lane 0 and their results are dropped.
fn sign_pass(
    backend: Backend,
    jobs: &[SignJob],
    chunk: &[&(usize, Vec<u8>)],
    exponents: Option<(&[u64], &[u64])>,
) -> Vec<Result<Vec<u8>, RsaError>> {
    let lanes = backend.lanes();
    let wanted: Vec<Slots> = chunk.iter().map(|(i, _)| jobs[*i].key.slots()).collect();
    let mut slots = take_slots(&wanted);
    let chunk = &chunk[..slots.len()];
    let keys: Vec<&RsaKey> = (0..lanes)
        .map(|l| jobs[chunk[l.min(chunk.len() - 1)].0].key)
        .collect();
    let first = keys[0];
    let (half, wide) = (first.public.half, 2 * first.public.half);
    let msgs: Vec<Vec<u64>> = chunk
        .iter()
        .map(|(_, em)| bytes_to_limbs(em, wide))
        .collect();
    let msg_refs: Vec<&[u64]> = (0..lanes)
        .map(|l| msgs[l.min(chunk.len() - 1)].as_slice())
        .collect();
    let mut blind = {
        let v: Vec<&[u64]> = (0..lanes)
            .map(|l| slots[l.min(chunk.len() - 1)].blind.as_slice())
            .collect();
        interleave(&v, lanes, wide)
    };
    let mut unblind = {
        let v: Vec<&[u64]> = (0..lanes)
            .map(|l| slots[l.min(chunk.len() - 1)].unblind.as_slice())
            .collect();
        interleave(&v, lanes, wide)
    };
    let per_lane = |f: &dyn Fn(&RsaKey) -> &[u64], limbs: usize| {
        let v: Vec<&[u64]> = keys.iter().map(|k| f(k)).collect();
        interleave(&v, lanes, limbs)
    };
    let msg = interleave(&msg_refs, lanes, wide);
    let n = per_lane(&|k| &k.public.n, wide);
    let n_rr = per_lane(&|k| &k.public.n_rr, wide);
    let n_k0: Vec<u64> = keys.iter().map(|k| k.public.n_k0).collect();
    let e: Vec<u64> = keys.iter().map(|k| k.public.e).collect();
    let mut pm = per_lane(&|k| &k.p.m, half);
    let mut qm = per_lane(&|k| &k.q.m, half);
    let mut prrr = per_lane(&|k| &k.p.rrr, half);
    let mut qrrr = per_lane(&|k| &k.q.rrr, half);
    let mut pone = per_lane(&|k| &k.p.one, half);
    let mut qone = per_lane(&|k| &k.q.one, half);
    let mut qinv = per_lane(&|k| &k.qinv, half);
    let pk0: Vec<u64> = keys.iter().map(|k| k.p.k0).collect();
    let qk0: Vec<u64> = keys.iter().map(|k| k.q.k0).collect();
    let mut dp: [&[u64]; 8] = [&[]; 8];
    let mut dq: [&[u64]; 8] = [&[]; 8];
    for (l, k) in keys.iter().enumerate() {
        (dp[l], dq[l]) = exponents.unwrap_or((&k.p.exp, &k.q.exp));
    }
    let mut sig = vec![0u64; wide * lanes];
    {
        let mut io = CrtInputs {
            msg: &msg,
            n: &n,
            n_k0: &n_k0,
            blind: &mut blind,
            unblind: &mut unblind,
            p: Half {
                m: &pm,
                k0: &pk0,
                rrr: &prrr,
                one: &pone,
                exp: dp,
                exp_bits: first.exp_bits,
            },
            q: Half {
                m: &qm,
                k0: &qk0,
                rrr: &qrrr,
                one: &qone,
                exp: dq,
                exp_bits: first.exp_bits,
            },
            qinv: &qinv,
        };
        // SAFETY: `sign_batch` checked the backend is available; every buffer was built above
        // with the limb counts and lane count the pass expects for this key size.
        unsafe { mont::crt_fn(backend, half)(&mut io, &mut sig) };
    }
    for (l, slot) in slots.iter_mut().enumerate() {
        slot.blind = lane_of(&blind, lanes, l);
        slot.unblind = lane_of(&unblind, lanes, l);
    }
    drop(slots);
    for (l, k) in keys[..chunk.len()].iter().enumerate() {
        if k.fault_next.swap(false, Ordering::SeqCst) {
            sig[l] ^= 1 << 7;
        }
    }
    let mut check = vec![0u64; wide * lanes];
    // SAFETY: as above; the public pass takes the same lane layout.
    unsafe { mont::public_fn(backend, half)(&sig, &n, &n_k0, &n_rr, &e, &mut check) };
    let results = (0..chunk.len())
        .map(|l| {
            if lane_of(&check, lanes, l) == msgs[l] {
                Ok(limbs_to_bytes(&lane_of(&sig, lanes, l), first.public.len))
            } else {
                Err(RsaError::FaultDetected)
            }
        })
        .collect();
    for buf in [
        &mut blind,
        &mut unblind,
        &mut pm,
        &mut qm,
        &mut prrr,
        &mut qrrr,
        &mut pone,
        &mut qone,
        &mut qinv,
    ] {
        buf.zeroize();
    }
    results
}

/// An RSA public key prepared for [`verify_batch`]: the modulus in the lanes' 52-bit limbs with
/// its Montgomery constants, and the public exponent. `Debug` shows only the size.
pub struct RsaPublicKey {
    len: usize,
    /// The modulus, big-endian, `len` bytes.
    n_be: Vec<u8>,
    /// Limbs per prime (20, 30 or 40): half the modulus's limbs.
    half: usize,
    n: Vec<u64>,
    n_k0: u64,
    n_rr: Vec<u64>,
    e: u64,
}

impl fmt::Debug for RsaPublicKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RsaPublicKey(RSA-{})", self.len * 8)
    }
}

impl RsaPublicKey {
    /// From the modulus (big-endian; 2048, 3072 or 4096 bits) and an odd public exponent.
    pub fn new(n: &[u8], e: u64) -> Result<Self, RsaError> {
        let bits = bit_len(n);
        let half = match bits {
            2048 => 20,
            3072 => 30,
            4096 => 40,
            _ => return Err(RsaError::Unsupported(bits)),
        };
        if e & 1 == 0 || e < 3 {
            return Err(RsaError::Unsupported(bits));
        }
        Ok(Self::prepared(n, bits, half, e))
    }

    /// The key for a modulus `n` of `bits` (checked by the caller) and `half` limbs per prime.
    fn prepared(n: &[u8], bits: usize, half: usize, e: u64) -> Self {
        let n_be = n[n.len() - bits / 8..].to_vec();
        let n = bytes_to_limbs(n, 2 * half);
        RsaPublicKey {
            len: bits / 8,
            n_be,
            half,
            n_k0: neg_inv52(n[0]),
            n_rr: pow2_mod(2 * 52 * 2 * half, &n),
            n,
            e,
        }
    }

    /// Signature length in bytes.
    pub fn signature_len(&self) -> usize {
        self.len
    }
}

/// One signature to check: `signature^e mod n` must equal `expected` (both big-endian, the
/// modulus's length).
pub struct VerifyItem<'a> {
    pub key: &'a RsaPublicKey,
    pub signature: &'a [u8],
    pub expected: &'a [u8],
}

/// Checks signatures `backend.lanes()` at a time with the public exponent: for each item,
/// whether `signature^e mod n` is exactly `expected` (the encoded message the signer padded, so
/// for PSS this is stricter than a verifier that recovers the salt). Items may mix keys and
/// sizes. A signature of the wrong length or not below n fails. Variable time: everything here
/// is public.
pub fn verify_batch(backend: Backend, items: &[VerifyItem]) -> Vec<bool> {
    assert!(
        backend.available(),
        "backend {backend} is not available on this CPU"
    );
    let lanes = backend.lanes();
    let mut results = vec![false; items.len()];
    for half in [20, 30, 40] {
        let wide = 2 * half;
        let same: Vec<(usize, Vec<u64>)> = items
            .iter()
            .enumerate()
            .filter(|(_, it)| it.key.half == half)
            .filter(|(_, it)| {
                it.signature.len() == it.key.len
                    && it.expected.len() == it.key.len
                    && below(it.signature, &it.key.n_be)
            })
            .map(|(i, it)| (i, bytes_to_limbs(it.signature, wide)))
            .collect();
        for chunk in same.chunks(lanes) {
            let pick = |l: usize| &chunk[l.min(chunk.len() - 1)];
            let keys: Vec<&RsaPublicKey> = (0..lanes).map(|l| items[pick(l).0].key).collect();
            let sig = interleave_lanes(lanes, wide, |l| pick(l).1.as_slice());
            // Each signature is below its lane's modulus (filtered above).
            let check = public_pass(backend, half, &keys, &sig);
            for (l, (i, _)) in chunk.iter().enumerate() {
                results[*i] = lane_of(&check, lanes, l) == bytes_to_limbs(items[*i].expected, wide);
            }
        }
    }
    results
}

/// a < b for big-endian numbers of equal length (public values).
fn below(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a < b
}

/// Timing-leak check of the exponentiation kernel (dudect: Reparaz, Balasch, Verbauwhede,
/// "Dude, is my code constant time?", 2017). Runs whole kernel passes of `key` with the CRT
/// exponents replaced, in random order, by a fixed exponent (zero: every window selects table
/// entry 0) or by a fresh random one, and compares the two timing distributions with Welch's
/// t-test, raw and cropped at several percentiles. |t| above 4.5 is evidence of a leak.
#[doc(hidden)]
pub fn dudect(backend: Backend, key: &RsaKey, measurements: usize, seed: u64) -> DudectReport {
    let words = key.p.exp.len();
    let digest = [0x5au8; 32];
    let em = key
        .encode(Scheme::Pkcs1(Hash::Sha256), &digest)
        .expect("fixed digest encodes");
    let job = SignJob {
        key,
        scheme: Scheme::Pkcs1(Hash::Sha256),
        digest: &digest,
    };
    let jobs = vec![job; backend.lanes()];
    let encoded: Vec<(usize, Vec<u8>)> = (0..backend.lanes()).map(|i| (i, em.clone())).collect();
    let chunk: Vec<&(usize, Vec<u8>)> = encoded.iter().collect();
    let fixed = vec![0u64; words];
    let mut state = seed | 1;
    let mut next = move || {
        // xorshift64*: test-input generation only.
        state ^= state >> 12;
        state ^= state << 25;
        state ^= state >> 27;
        state.wrapping_mul(0x2545_f491_4f6c_dd1d)
    };
    let top_bits = key.bits / 2;
    let mut samples: [Vec<f64>; 2] = [Vec::new(), Vec::new()];
    for _ in 0..measurements {
        let class = (next() & 1) as usize;
        let random: Vec<u64> = (0..words)
            .map(|w| {
                let v = next();
                match (w * 64).cmp(&top_bits) {
                    std::cmp::Ordering::Less if (w + 1) * 64 > top_bits => {
                        v & ((1 << (top_bits - w * 64)) - 1)
                    }
                    std::cmp::Ordering::Less => v,
                    _ => 0,
                }
            })
            .collect();
        let exp: &[u64] = if class == 0 { &fixed } else { &random };
        let start = std::time::Instant::now();
        let _ = sign_pass(backend, &jobs, &chunk, Some((exp, exp)));
        samples[class].push(start.elapsed().as_nanos() as f64);
    }
    DudectReport::from_samples(samples)
}

/// Result of [`dudect`].
#[doc(hidden)]
#[derive(Debug, Clone)]
pub struct DudectReport {
    pub fixed: usize,
    pub random: usize,
    pub mean_ns: [f64; 2],
    /// (percentile crop, t); `1.0` is the uncropped test.
    pub t: Vec<(f64, f64)>,
}

impl DudectReport {
    fn from_samples(samples: [Vec<f64>; 2]) -> Self {
        let mut all: Vec<f64> = samples.iter().flatten().copied().collect();
        all.sort_by(f64::total_cmp);
        let welch = |limit: f64| {
            let stats = |v: &Vec<f64>| {
                let kept: Vec<f64> = v.iter().copied().filter(|x| *x <= limit).collect();
                let n = kept.len() as f64;
                let mean = kept.iter().sum::<f64>() / n.max(1.0);
                let var = kept.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0).max(1.0);
                (n, mean, var)
            };
            let (n0, m0, v0) = stats(&samples[0]);
            let (n1, m1, v1) = stats(&samples[1]);
            (m0 - m1)
                / (v0 / n0.max(1.0) + v1 / n1.max(1.0))
                    .sqrt()
                    .max(f64::MIN_POSITIVE)
        };
        let t = [1.0, 0.99, 0.95, 0.9, 0.75, 0.5]
            .into_iter()
            .map(|p| {
                let limit = all[((all.len() as f64 - 1.0) * p) as usize];
                (p, welch(limit))
            })
            .collect();
        let mean = |v: &Vec<f64>| v.iter().sum::<f64>() / (v.len().max(1) as f64);
        DudectReport {
            fixed: samples[0].len(),
            random: samples[1].len(),
            mean_ns: [mean(&samples[0]), mean(&samples[1])],
            t,
        }
    }

    /// The largest |t| over the crops.
    pub fn max_abs_t(&self) -> f64 {
        self.t.iter().map(|(_, t)| t.abs()).fold(0.0, f64::max)
    }
}
