//! AES-GCM packet sealing on x86-64, in two register widths: `avx512` (four blocks to a `zmm`
//! register) and `avx2` (two blocks to a `ymm` register, for CPUs with VAES and VPCLMULQDQ but
//! no AVX-512, such as AMD Zen 3 and Intel's client cores since Alder Lake). Both share the key
//! schedule and the powers of the hash key kept here, and the same one-pass design: the
//! packet's counter blocks eight registers per round trip, each register of ciphertext hashed
//! against its own powers of H (as it is made in the AVX-512 width; in the AVX2 width between
//! the next round trip's AES rounds), one GHASH reduction per packet. The driver around that
//! (the nonce, the tag, the lengths block, the windows of long messages) is [`seal`], one for
//! both widths through [`Lanes`].
//!
//! GHASH convention (as in BoringSSL's and Linux's AVX-512 AES-GCM): blocks are byte-reversed
//! so GCM's bit-reflected field elements become 128-bit integers, the hash key is stored
//! multiplied by `x` (which absorbs the product's one-bit offset), and a product is reduced in
//! two folds by `x^63 + x^62 + x^57` (the constant `0xc2 << 56`).

use std::arch::x86_64::*;

pub(crate) mod avx2;
pub(crate) mod avx512;

/// How many powers of H are kept. A message of at most this many GHASH blocks (header,
/// ciphertext and lengths: a packet of up to about 2 KB) has every block multiplied by its own
/// power, independently, and one reduction in all; longer ones are hashed in windows of this
/// many blocks with a reduction each.
pub(super) const POWERS: usize = 128;

/// Bytes of a window on the path for long messages: a whole number of round trips of either
/// width, so the counter needs no adjusting between windows.
pub(super) const WINDOW: usize = POWERS * 16;

/// The instructions both widths need besides their own vector extensions: VAES and VPCLMULQDQ,
/// and what [`Schedule::new`] uses (AES-NI, PCLMULQDQ, SSSE3).
pub(super) fn shared_instructions() -> bool {
    is_x86_feature_detected!("vaes")
        && is_x86_feature_detected!("vpclmulqdq")
        && is_x86_feature_detected!("aes")
        && is_x86_feature_detected!("pclmulqdq")
        && is_x86_feature_detected!("ssse3")
}

/// The key material both widths start from: AES round keys and powers of the hash key.
#[repr(C, align(64))]
pub(super) struct Schedule {
    pub(super) aes: RoundKeys,
    /// H^128, H^127, …, H^1 (byte-reflected, times x), then three zero blocks, so that two or
    /// four consecutive powers can be loaded from any starting power. H^k is at `POWERS - k`.
    pub(super) h_powers: [__m128i; POWERS + 3],
}

impl Schedule {
    /// `None` for a key of another length than 16 or 32 bytes.
    ///
    /// # Safety
    /// The CPU has AES-NI, PCLMULQDQ and SSSE3 (both widths' `available` check them).
    pub(super) unsafe fn new(key: &[u8]) -> Option<Schedule> {
        // SAFETY: the caller promised the instructions; the functions read only the arrays
        // they are given.
        unsafe {
            let aes = RoundKeys::new(key)?;
            let h_powers = hash_key_powers(&aes.round_keys, aes.rounds);
            Some(Schedule { aes, h_powers })
        }
    }
}

/// AES round keys: the sealing keys' first half ([`Schedule`]), and on their own the key of
/// QUIC header protection (RFC 9001, section 5.4.3), one block encrypted per packet, inline,
/// where BoringSSL's `AES_ecb_encrypt` takes a call chain and a CPU dispatch per block.
/// Wiped on drop.
#[derive(Clone)]
pub(crate) struct RoundKeys {
    pub(super) round_keys: [__m128i; 15],
    /// 10 (AES-128) or 14 (AES-256).
    pub(super) rounds: usize,
}

impl RoundKeys {
    /// `None` for a key of another length than 16 or 32 bytes.
    ///
    /// # Safety
    /// The CPU has AES-NI.
    pub(crate) unsafe fn new(key: &[u8]) -> Option<RoundKeys> {
        // SAFETY: an all-zero __m128i is a valid value (SSE2 is part of x86-64).
        let mut s = RoundKeys {
            round_keys: unsafe { std::mem::zeroed() },
            rounds: 0,
        };
        // SAFETY: the caller promised AES-NI.
        s.rounds = unsafe { expand_key(key, &mut s.round_keys)? };
        Some(s)
    }

    /// The encryption of `sample` (its first bytes are the mask).
    ///
    /// # Safety
    /// The CPU has AES-NI (as [`RoundKeys::new`] required).
    pub(crate) unsafe fn encrypt(&self, sample: &[u8; 16]) -> [u8; 16] {
        let mut out = [0u8; 16];
        // SAFETY: AES-NI, as the caller promised; 16 readable and 16 writable bytes.
        unsafe {
            let block = _mm_loadu_si128(sample.as_ptr().cast());
            let x = encrypt_block(&self.round_keys, self.rounds, block);
            _mm_storeu_si128(out.as_mut_ptr().cast(), x);
        }
        out
    }
}

impl Drop for RoundKeys {
    fn drop(&mut self) {
        wipe(&mut self.round_keys);
    }
}

impl Drop for Schedule {
    fn drop(&mut self) {
        wipe(&mut self.h_powers);
    }
}

/// Overwrites `v` with zeros through volatile stores, so the wipe of key material is not
/// removed as a dead store. For arrays of SIMD registers, where every bit pattern is valid.
pub(super) fn wipe<T: Copy, const N: usize>(v: &mut [T; N]) {
    let words = v.as_mut_ptr().cast::<u64>();
    debug_assert!(std::mem::size_of::<T>().is_multiple_of(8) && std::mem::align_of::<T>() >= 8);
    for i in 0..std::mem::size_of_val(v) / 8 {
        // SAFETY: inside the exclusively borrowed array, which is 8-byte aligned (its elements
        // are SIMD registers of 16 bytes or more); any bit pattern is valid for them.
        unsafe { std::ptr::write_volatile(words.add(i), 0) };
    }
    std::sync::atomic::compiler_fence(std::sync::atomic::Ordering::SeqCst);
}

// ---- AES key schedule and single blocks ----

/// Expands a 16-byte (AES-128) or 32-byte (AES-256) key into `rk` and returns its rounds (10
/// or 14); `None` for another length, `rk` untouched.
///
/// # Safety
/// The CPU has AES-NI.
unsafe fn expand_key(key: &[u8], rk: &mut [__m128i; 15]) -> Option<usize> {
    // SAFETY: AES-NI, as the caller promised; each function reads only the key it is given.
    unsafe {
        match key.len() {
            16 => {
                expand_128(key.try_into().expect("16 bytes"), rk);
                Some(10)
            }
            32 => {
                expand_256(key.try_into().expect("32 bytes"), rk);
                Some(14)
            }
            _ => None,
        }
    }
}

/// `k ^ (k << 32) ^ (k << 64) ^ (k << 96)`: the running XOR of a key schedule step.
#[target_feature(enable = "aes")]
fn prefix_xor(mut k: __m128i) -> __m128i {
    k = _mm_xor_si128(k, _mm_slli_si128::<4>(k));
    k = _mm_xor_si128(k, _mm_slli_si128::<4>(k));
    _mm_xor_si128(k, _mm_slli_si128::<4>(k))
}

/// One step of the AES key schedule: `prev`'s running XOR plus word `SEL` of
/// AESKEYGENASSIST of `from` in every lane (`0xff`: RotWord, SubWord and `RCON` of the last
/// word; `0xaa`: SubWord of the last word, for AES-256's odd round keys).
#[target_feature(enable = "aes")]
fn schedule_step<const RCON: i32, const SEL: i32>(prev: __m128i, from: __m128i) -> __m128i {
    let t = _mm_shuffle_epi32::<SEL>(_mm_aeskeygenassist_si128::<RCON>(from));
    _mm_xor_si128(prefix_xor(prev), t)
}

#[target_feature(enable = "aes")]
unsafe fn expand_128(key: &[u8; 16], rk: &mut [__m128i; 15]) {
    // SAFETY: 16 readable bytes.
    rk[0] = unsafe { _mm_loadu_si128(key.as_ptr().cast()) };
    rk[1] = schedule_step::<0x01, 0xff>(rk[0], rk[0]);
    rk[2] = schedule_step::<0x02, 0xff>(rk[1], rk[1]);
    rk[3] = schedule_step::<0x04, 0xff>(rk[2], rk[2]);
    rk[4] = schedule_step::<0x08, 0xff>(rk[3], rk[3]);
    rk[5] = schedule_step::<0x10, 0xff>(rk[4], rk[4]);
    rk[6] = schedule_step::<0x20, 0xff>(rk[5], rk[5]);
    rk[7] = schedule_step::<0x40, 0xff>(rk[6], rk[6]);
    rk[8] = schedule_step::<0x80, 0xff>(rk[7], rk[7]);
    rk[9] = schedule_step::<0x1b, 0xff>(rk[8], rk[8]);
    rk[10] = schedule_step::<0x36, 0xff>(rk[9], rk[9]);
}

/// Even round keys follow the even key before them (RotWord, SubWord, rcon of the odd key
/// between); odd ones follow the odd key before them (SubWord of the even key between).
#[target_feature(enable = "aes")]
unsafe fn expand_256(key: &[u8; 32], rk: &mut [__m128i; 15]) {
    // SAFETY: 32 readable bytes.
    unsafe {
        rk[0] = _mm_loadu_si128(key.as_ptr().cast());
        rk[1] = _mm_loadu_si128(key.as_ptr().add(16).cast());
    }
    rk[2] = schedule_step::<0x01, 0xff>(rk[0], rk[1]);
    rk[3] = schedule_step::<0x00, 0xaa>(rk[1], rk[2]);
    rk[4] = schedule_step::<0x02, 0xff>(rk[2], rk[3]);
    rk[5] = schedule_step::<0x00, 0xaa>(rk[3], rk[4]);
    rk[6] = schedule_step::<0x04, 0xff>(rk[4], rk[5]);
    rk[7] = schedule_step::<0x00, 0xaa>(rk[5], rk[6]);
    rk[8] = schedule_step::<0x08, 0xff>(rk[6], rk[7]);
    rk[9] = schedule_step::<0x00, 0xaa>(rk[7], rk[8]);
    rk[10] = schedule_step::<0x10, 0xff>(rk[8], rk[9]);
    rk[11] = schedule_step::<0x00, 0xaa>(rk[9], rk[10]);
    rk[12] = schedule_step::<0x20, 0xff>(rk[10], rk[11]);
    rk[13] = schedule_step::<0x00, 0xaa>(rk[11], rk[12]);
    rk[14] = schedule_step::<0x40, 0xff>(rk[12], rk[13]);
}

// ---- the seal, for either width ----

/// The plaintext of one packet as quiche's writer holds it: `in_len` bytes already in the output
/// buffer (encrypted in place), then the stream data still in the send buffer. A width reads
/// it through its own `Plaintext`, with the same four fields.
#[derive(Clone, Copy)]
pub(crate) struct Parts {
    /// The output buffer; its first `in_len` bytes are plaintext.
    pub(super) out: *mut u8,
    pub(super) in_len: usize,
    pub(super) extra: *const u8,
    pub(super) total: usize,
}

/// What the seal's driver ([`seal`]) needs from a register width. Each width implements it on
/// its `Key` with `#[inline(always)]` forwards to its own `#[target_feature]` helpers.
pub(crate) trait Lanes {
    /// GHASH products not yet reduced.
    type Sum;
    /// GCM's counter blocks, a register at a time.
    type Counter;

    fn schedule(&self) -> &Schedule;

    /// A pointer to `h_powers[0]` that may reach everything the width reads at an offset from
    /// a power.
    fn powers(&self) -> *const __m128i;

    /// # Safety
    /// The CPU has the width's instructions (for this and every method below).
    unsafe fn sum() -> Self::Sum;

    /// # Safety
    /// As [`Lanes::sum`].
    unsafe fn counter(nonce: __m128i, first: u32) -> Self::Counter;

    /// Adds `acc * H^n`, the running hash carried into a window of `n` blocks.
    ///
    /// # Safety
    /// `powers` points at H^n, taken from [`Lanes::powers`].
    unsafe fn add_carry(sum: &mut Self::Sum, acc: __m128i, powers: *const __m128i);

    /// Adds the GHASH products of `len` bytes at `data` (the last block zero-padded), block
    /// `j` times the power at `powers + j`.
    ///
    /// # Safety
    /// `data..data + len` readable; `powers` with `len.div_ceil(16)` powers after it and the
    /// entries the width reads past them.
    unsafe fn hash_into(sum: &mut Self::Sum, data: *const u8, len: usize, powers: *const __m128i);

    /// Encrypts `text` into `text.out` and adds every ciphertext block's GHASH product, block
    /// `j` times the power at `powers + j`.
    ///
    /// # Safety
    /// `text`'s parts readable and `out..out + total` writable; `powers` as for `hash_into`.
    unsafe fn encrypt_and_hash<const NR: usize>(
        &self,
        ctr: &mut Self::Counter,
        text: Parts,
        powers: *const __m128i,
        sum: &mut Self::Sum,
    );

    /// The sum of everything added, reduced to one field element.
    ///
    /// # Safety
    /// As [`Lanes::sum`].
    unsafe fn reduce(sum: &Self::Sum) -> __m128i;
}

/// AES-GCM with `NR` rounds: `text[..in_len]` encrypted in place and `extra` into
/// `text[in_len..]`, the tag into `tag` (the framing is [`gcm`]'s).
///
/// Always inlined, without target features of its own: each width calls it from its
/// `#[target_feature]` entry point, so that the width's helpers inline into it.
///
/// # Safety
/// The CPU has the width's instructions; `text.len() == in_len + extra.len()`, and
/// `in_len % 16 == 0` or `extra` is empty.
#[inline(always)]
pub(super) unsafe fn seal<W: Lanes, const NR: usize>(
    key: &W,
    nonce: &[u8; 12],
    aad: &[u8],
    text: &mut [u8],
    in_len: usize,
    extra: &[u8],
    tag: &mut [u8; 16],
) {
    let out = text.as_mut_ptr();
    // SAFETY: the CPU has the width's instructions, as the caller promised. Each window
    // `base..base + len` lies inside the plaintext: its first part is read and written in
    // place, its second read from `extra` (at `base - in_len` once past the first) and
    // written after the first.
    unsafe {
        let t = gcm::<W, NR>(
            key,
            nonce,
            aad,
            text.len(),
            |ctr, base, len, powers, sum| {
                let window = Parts {
                    out: out.add(base),
                    in_len: in_len.saturating_sub(base),
                    extra: extra.as_ptr().add(base.saturating_sub(in_len)),
                    total: len,
                };
                key.encrypt_and_hash::<NR>(ctr, window, powers, sum);
            },
        );
        _mm_storeu_si128(tag.as_mut_ptr().cast(), t);
    }
}

/// GCM's framing with `NR` rounds around a message of `text_len` bytes, returning its tag:
/// `E(K, J0)` XOR the GHASH of `aad`, the ciphertext and the lengths block. `crypt(ctr, base,
/// len, powers, sum)` encrypts or decrypts the message's bytes `base..base + len` with the
/// counter and adds their ciphertext's GHASH products to `sum`, block `j` times the power at
/// `powers + j`. Every block of a message of at most [`POWERS`] GHASH blocks is multiplied by
/// its own power and the sum reduced once (one call of `crypt`); longer messages go in windows
/// of `POWERS` blocks, the running hash carried into the next as `acc * H^n`.
///
/// Always inlined, like [`seal`], so that `crypt` inlines too.
///
/// # Safety
/// The CPU has the width's instructions; `crypt` is safe to call with windows inside the
/// message and powers taken from `key`.
#[inline(always)]
pub(super) unsafe fn gcm<W: Lanes, const NR: usize>(
    key: &W,
    nonce: &[u8; 12],
    aad: &[u8],
    text_len: usize,
    mut crypt: impl FnMut(&mut W::Counter, usize, usize, *const __m128i, &mut W::Sum),
) -> __m128i {
    let mut nonce_block = [0u8; 16];
    nonce_block[..12].copy_from_slice(nonce);
    let mut lengths = [0u8; 16];
    lengths[..8].copy_from_slice(&(aad.len() as u64 * 8).to_be_bytes());
    lengths[8..].copy_from_slice(&(text_len as u64 * 8).to_be_bytes());
    let powers = key.powers();
    let aad_blocks = aad.len().div_ceil(16);
    let blocks = aad_blocks + text_len.div_ceil(16) + 1;
    // SAFETY: the CPU has the width's instructions, as the caller promised. Each part's
    // powers lie in `h_powers[first..POWERS]` (or a window's H^n..H^1) in message order, and
    // `h_powers` has zero entries after H^1; every window lies inside `aad` or the message.
    unsafe {
        let nonce = _mm_loadu_si128(nonce_block.as_ptr().cast());
        // J0 = nonce ‖ 1 (big-endian): its encryption masks the tag. Issued first, so its
        // rounds overlap the bulk work below.
        let tag_mask = encrypt_block(
            &key.schedule().aes.round_keys,
            NR,
            _mm_insert_epi32::<3>(nonce, 0x0100_0000),
        );
        // The first data block counts from 2, and the counter runs on across windows.
        let mut ctr = W::counter(nonce, 2);
        let hash = if blocks <= POWERS {
            // Every block times its own power (the header's first block times H^blocks, the
            // lengths block times H^1), one reduction.
            let first = POWERS - blocks;
            let mut sum = W::sum();
            W::hash_into(&mut sum, aad.as_ptr(), aad.len(), powers.add(first));
            crypt(
                &mut ctr,
                0,
                text_len,
                powers.add(first + aad_blocks),
                &mut sum,
            );
            W::hash_into(&mut sum, lengths.as_ptr(), 16, powers.add(POWERS - 1));
            W::reduce(&sum)
        } else {
            let mut acc = _mm_setzero_si128();
            for window in aad.chunks(WINDOW) {
                let n = window.len().div_ceil(16);
                let mut sum = W::sum();
                W::add_carry(&mut sum, acc, powers.add(POWERS - n));
                W::hash_into(
                    &mut sum,
                    window.as_ptr(),
                    window.len(),
                    powers.add(POWERS - n),
                );
                acc = W::reduce(&sum);
            }
            let mut base = 0;
            while base < text_len {
                let len = (text_len - base).min(WINDOW);
                let n = len.div_ceil(16);
                let mut sum = W::sum();
                W::add_carry(&mut sum, acc, powers.add(POWERS - n));
                crypt(&mut ctr, base, len, powers.add(POWERS - n), &mut sum);
                acc = W::reduce(&sum);
                base += len;
            }
            let mut sum = W::sum();
            W::add_carry(&mut sum, acc, powers.add(POWERS - 1));
            W::hash_into(&mut sum, lengths.as_ptr(), 16, powers.add(POWERS - 1));
            W::reduce(&sum)
        };
        _mm_xor_si128(_mm_shuffle_epi8(hash, byte_reverse_mask()), tag_mask)
    }
}

#[target_feature(enable = "aes")]
pub(super) fn encrypt_block(rk: &[__m128i; 15], rounds: usize, block: __m128i) -> __m128i {
    let mut x = _mm_xor_si128(block, rk[0]);
    for key in &rk[1..rounds] {
        x = _mm_aesenc_si128(x, *key);
    }
    _mm_aesenclast_si128(x, rk[rounds])
}

// ---- GHASH ----

/// Reverses the 16 bytes of a block (per 128-bit lane when broadcast).
#[target_feature(enable = "sse2")]
pub(super) fn byte_reverse_mask() -> __m128i {
    _mm_set_epi64x(0x0001_0203_0405_0607, 0x0809_0a0b_0c0d_0e0f)
}

/// Folds the 256-bit product `hi:mi:lo` (mi straddling the middle) to 128 bits.
#[target_feature(enable = "pclmulqdq")]
pub(super) fn reduce(lo: __m128i, mi: __m128i, hi: __m128i) -> __m128i {
    let poly = _mm_set_epi64x(0xc200_0000_0000_0000_u64 as i64, 1);
    let t = _mm_clmulepi64_si128::<0x01>(poly, lo);
    let mi = _mm_xor_si128(_mm_xor_si128(mi, t), _mm_shuffle_epi32::<0x4e>(lo));
    let t = _mm_clmulepi64_si128::<0x01>(poly, mi);
    _mm_xor_si128(_mm_xor_si128(hi, t), _mm_shuffle_epi32::<0x4e>(mi))
}

#[target_feature(enable = "pclmulqdq")]
fn ghash_mul(a: __m128i, b: __m128i) -> __m128i {
    let lo = _mm_clmulepi64_si128::<0x00>(a, b);
    let mi = _mm_xor_si128(
        _mm_clmulepi64_si128::<0x01>(a, b),
        _mm_clmulepi64_si128::<0x10>(a, b),
    );
    let hi = _mm_clmulepi64_si128::<0x11>(a, b);
    reduce(lo, mi, hi)
}

/// H = E(K, 0), byte-reflected and multiplied by x, and its powers up to H^128, highest first.
#[target_feature(enable = "aes,pclmulqdq,ssse3")]
fn hash_key_powers(rk: &[__m128i; 15], rounds: usize) -> [__m128i; POWERS + 3] {
    let h = encrypt_block(rk, rounds, _mm_setzero_si128());
    let h = _mm_shuffle_epi8(h, byte_reverse_mask());
    // h * x: shift left one bit across both halves; where bit 127 falls out, add the
    // polynomial (0xc2 << 120 | 1); bit 63 carries into bit 64.
    let carries = _mm_srai_epi32::<31>(_mm_shuffle_epi32::<0xd3>(h));
    let poly_and_carry = _mm_set_epi64x(0xc200_0000_0000_0001_u64 as i64, 1);
    let h = _mm_xor_si128(_mm_add_epi64(h, h), _mm_and_si128(carries, poly_and_carry));
    let mut powers = [_mm_setzero_si128(); POWERS + 3];
    let mut p = h;
    powers[POWERS - 1] = h;
    for i in (0..POWERS - 1).rev() {
        p = ghash_mul(p, h);
        powers[i] = p;
    }
    powers
}

#[cfg(test)]
mod tests {
    use super::*;

    fn block_bytes(b: __m128i) -> [u8; 16] {
        let mut out = [0u8; 16];
        // SAFETY: 16 writable bytes.
        unsafe { _mm_storeu_si128(out.as_mut_ptr().cast(), b) };
        out
    }

    fn hex(s: &str) -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    // FIPS-197 appendix C.1 and C.3.
    #[test]
    fn key_schedules_match_fips_197() {
        if !(is_x86_feature_detected!("aes")
            && is_x86_feature_detected!("pclmulqdq")
            && is_x86_feature_detected!("ssse3"))
        {
            eprintln!("skipped: CPU lacks AES-NI");
            return;
        }
        let plain = hex("00112233445566778899aabbccddeeff");
        for (key, expect) in [
            (
                "000102030405060708090a0b0c0d0e0f",
                "69c4e0d86a7b0430d8cdb78070b4c55a",
            ),
            (
                "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f",
                "8ea2b7ca516745bfeafc49904b496089",
            ),
        ] {
            // SAFETY: AES-NI, PCLMULQDQ and SSSE3 present (checked above); 16 readable bytes.
            let out = unsafe {
                let k = Schedule::new(&hex(key)).unwrap();
                encrypt_block(
                    &k.aes.round_keys,
                    k.aes.rounds,
                    _mm_loadu_si128(plain.as_ptr().cast()),
                )
            };
            assert_eq!(block_bytes(out).to_vec(), hex(expect), "key {key}");
        }
    }
}
