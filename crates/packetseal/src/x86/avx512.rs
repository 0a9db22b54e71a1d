//! The AVX-512 width: AES-CTR four blocks to a `zmm` register, eight registers in flight;
//! GHASH with VPCLMULQDQ, one reduction per packet (per 128-block window for longer messages).

use std::arch::x86_64::*;

use super::{byte_reverse_mask, reduce, Lanes, Parts, Schedule, WINDOW};

pub(crate) fn available() -> bool {
    is_x86_feature_detected!("avx512f")
        && is_x86_feature_detected!("avx512bw")
        && is_x86_feature_detected!("avx512vl")
        && super::shared_instructions()
}

#[repr(C, align(64))]
pub(crate) struct Key {
    schedule: Schedule,
    /// The round keys, each in all four lanes of a 512-bit register.
    wide_round_keys: [__m512i; 15],
}

impl Key {
    /// Callers have checked [`available`].
    pub(crate) fn new(key: &[u8]) -> Option<Box<Key>> {
        // SAFETY: `available()` held (SealKey checks it first), so AES-NI, PCLMULQDQ, SSSE3
        // and AVX-512 F exist.
        unsafe {
            let schedule = Schedule::new(key)?;
            let wide_round_keys = broadcast_round_keys(&schedule.aes.round_keys);
            Some(Box::new(Key {
                schedule,
                wide_round_keys,
            }))
        }
    }

    /// `text[..in_len]` is encrypted in place and `extra` into `text[in_len..]`; `in_len` is a
    /// multiple of 16 or `extra` is empty, and `text.len() == in_len + extra.len()` (checked by
    /// `SealKey::seal`).
    pub(crate) fn seal(
        &self,
        nonce: &[u8; 12],
        aad: &[u8],
        text: &mut [u8],
        in_len: usize,
        extra: &[u8],
        tag: &mut [u8; 16],
    ) {
        debug_assert!(in_len.is_multiple_of(16) || extra.is_empty());
        debug_assert_eq!(text.len(), in_len + extra.len());
        // SAFETY: a Key is only built where `available()` held; lengths as documented above.
        unsafe {
            if self.schedule.aes.rounds == 10 {
                seal_with::<10>(self, nonce, aad, text, in_len, extra, tag)
            } else {
                seal_with::<14>(self, nonce, aad, text, in_len, extra, tag)
            }
        }
    }
}

impl Drop for Key {
    fn drop(&mut self) {
        super::wipe(&mut self.wide_round_keys);
    }
}

#[target_feature(enable = "avx512f")]
fn broadcast_round_keys(rk: &[__m128i; 15]) -> [__m512i; 15] {
    rk.map(|k| _mm512_broadcast_i32x4(k))
}

/// The lanes of a 512-bit register XORed into one block.
#[target_feature(enable = "avx512f,avx512vl")]
fn fold_lanes(z: __m512i) -> __m128i {
    let y = _mm256_xor_si256(_mm512_castsi512_si256(z), _mm512_extracti64x4_epi64::<1>(z));
    _mm_xor_si128(_mm256_castsi256_si128(y), _mm256_extracti128_si256::<1>(y))
}

/// Mask of the first `bytes` (≤ 64) bytes of a 512-bit register.
#[inline(always)]
fn byte_mask(bytes: usize) -> __mmask64 {
    if bytes >= 64 {
        u64::MAX
    } else {
        (1u64 << bytes) - 1
    }
}

/// GHASH products not yet reduced: four lanes each of the low, middle and high parts.
pub(crate) struct Products {
    lo: __m512i,
    mi: __m512i,
    hi: __m512i,
}

impl Products {
    #[target_feature(enable = "avx512f")]
    fn new() -> Products {
        Products {
            lo: _mm512_setzero_si512(),
            mi: _mm512_setzero_si512(),
            hi: _mm512_setzero_si512(),
        }
    }

    /// Adds the four products `d[i] * h[i]` (`d` byte-reflected).
    #[target_feature(enable = "avx512f,vpclmulqdq")]
    fn add(&mut self, d: __m512i, h: __m512i) {
        self.lo = _mm512_xor_si512(self.lo, _mm512_clmulepi64_epi128::<0x00>(d, h));
        self.mi = _mm512_ternarylogic_epi32::<0x96>(
            self.mi,
            _mm512_clmulepi64_epi128::<0x01>(d, h),
            _mm512_clmulepi64_epi128::<0x10>(d, h),
        );
        self.hi = _mm512_xor_si512(self.hi, _mm512_clmulepi64_epi128::<0x11>(d, h));
    }

    /// Adds `acc * H^n`, the running hash carried into a window of `n` blocks, where `powers`
    /// points at H^n in `h_powers`.
    ///
    /// # Safety
    /// `powers` has three more entries after it (true for any H^n, n ≥ 1).
    #[target_feature(enable = "avx512f,vpclmulqdq")]
    unsafe fn add_carry(&mut self, acc: __m128i, powers: *const __m128i) {
        // SAFETY: four entries from H^n, as the caller promised; lanes 1..3 of the data are
        // zero, so only acc * H^n is added.
        let h = unsafe { _mm512_loadu_si512(powers.cast()) };
        self.add(_mm512_zextsi128_si512(acc), h);
    }

    /// The sum of everything added, reduced to one field element.
    #[target_feature(enable = "avx512f,avx512vl,pclmulqdq")]
    fn reduce(&self) -> __m128i {
        reduce(
            fold_lanes(self.lo),
            fold_lanes(self.mi),
            fold_lanes(self.hi),
        )
    }
}

// ---- AES-CTR ----

/// Encrypts `K` registers of counter blocks with `NR` rounds, all rounds interleaved.
#[target_feature(enable = "avx512f,vaes")]
fn encrypt_4x<const NR: usize, const K: usize>(
    rk: &[__m512i; 15],
    mut x: [__m512i; K],
) -> [__m512i; K] {
    for v in x.iter_mut() {
        *v = _mm512_xor_si512(*v, rk[0]);
    }
    for key in &rk[1..NR] {
        for v in x.iter_mut() {
            *v = _mm512_aesenc_epi128(*v, *key);
        }
    }
    for v in x.iter_mut() {
        *v = _mm512_aesenclast_epi128(*v, rk[NR]);
    }
    x
}

/// Counter blocks for GCM's `inc32`: each lane holds the nonce and its counter in native
/// order in the last dword; `to_block` swaps that dword to big-endian.
pub(crate) struct Counter {
    lanes: __m512i,
    to_block: __m512i,
    step: __m512i,
}

impl Counter {
    #[target_feature(enable = "avx512f,avx512bw")]
    fn new(nonce: __m128i, first: u32) -> Counter {
        // Lanes 0..3 count first, first + 1, first + 2, first + 3.
        let offsets = _mm512_set_epi32(3, 0, 0, 0, 2, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0);
        let start = _mm512_set4_epi32(first as i32, 0, 0, 0);
        Counter {
            lanes: _mm512_add_epi32(
                _mm512_add_epi32(_mm512_broadcast_i32x4(nonce), offsets),
                start,
            ),
            to_block: _mm512_broadcast_i32x4(_mm_set_epi64x(
                0x0c0d_0e0f_0b0a_0908,
                0x0706_0504_0302_0100,
            )),
            step: _mm512_set4_epi32(4, 0, 0, 0),
        }
    }

    /// The next four counter blocks.
    #[target_feature(enable = "avx512f,avx512bw")]
    fn next(&mut self) -> __m512i {
        let blocks = _mm512_shuffle_epi8(self.lanes, self.to_block);
        self.lanes = _mm512_add_epi32(self.lanes, self.step);
        blocks
    }
}

// ---- the seal ----

/// Registers of keystream made per round trip on the one-pass path: eight 512-bit registers
/// (32 blocks) in flight keep both AES units of a core with two busy through the rounds'
/// latency.
const WIDE: usize = 8;
const _: () = assert!(WINDOW.is_multiple_of(WIDE * 64));

/// The plaintext of one packet as quiche's writer holds it: `in_len` bytes already in the output
/// buffer (encrypted in place), then the stream data still in the send buffer.
#[derive(Clone, Copy)]
struct Plaintext {
    /// The output buffer; its first `in_len` bytes are plaintext.
    out: *mut u8,
    in_len: usize,
    extra: *const u8,
    total: usize,
}

impl Plaintext {
    /// 64 bytes of plaintext from `off` (< `total`); bytes at or past `total` read as zero and
    /// are not touched.
    ///
    /// # Safety
    /// `out..out + in_len` and `extra..extra + total - in_len` readable; the CPU has AVX-512 BW.
    #[inline(always)]
    unsafe fn load(&self, off: usize) -> __m512i {
        let valid = byte_mask(self.total - off);
        // SAFETY (all three): every byte the mask selects lies inside one of the two parts;
        // masked-off bytes are not accessed (AVX-512 masked loads suppress them, faults
        // included), so the second part's pointer may be formed from before its start.
        unsafe {
            if off + 64 <= self.in_len {
                _mm512_loadu_si512(self.out.add(off).cast())
            } else if off >= self.in_len {
                _mm512_maskz_loadu_epi8(valid, self.extra.add(off - self.in_len).cast())
            } else {
                let first = byte_mask(self.in_len - off);
                let a = _mm512_maskz_loadu_epi8(first, self.out.add(off).cast());
                let b = _mm512_maskz_loadu_epi8(
                    valid & !first,
                    self.extra.wrapping_sub(self.in_len - off).cast(),
                );
                _mm512_or_si512(a, b)
            }
        }
    }
}

/// Encrypts the whole plaintext into `text.out` and adds every ciphertext block's GHASH product
/// to `sum`, block `j` times the power at `powers + j`. Each register of ciphertext is hashed as
/// soon as it is made, with no dependence between products, so the hashing overlaps the next
/// registers' AES rounds.
///
/// # Safety
/// As [`Plaintext::load`], and `out..out + total` writable; `powers` points into `h_powers` with
/// `total.div_ceil(16)` powers and then at least three more entries after it; the CPU has the
/// features named.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,vaes,vpclmulqdq")]
unsafe fn encrypt_and_hash<const NR: usize>(
    rk: &[__m512i; 15],
    ctr: &mut Counter,
    text: Plaintext,
    mut powers: *const __m128i,
    sum: &mut Products,
) {
    let reverse = _mm512_broadcast_i32x4(byte_reverse_mask());
    let mut off = 0;
    while text.total - off >= WIDE * 64 {
        let ks = encrypt_4x::<NR, WIDE>(rk, std::array::from_fn(|_| ctr.next()));
        for (i, k) in ks.iter().enumerate() {
            // SAFETY: off + 64 * i + 64 <= total; `powers + 4 * i` has four powers of this
            // packet's blocks.
            unsafe {
                let c = _mm512_xor_si512(text.load(off + 64 * i), *k);
                _mm512_storeu_si512(text.out.add(off + 64 * i).cast(), c);
                let h = _mm512_loadu_si512(powers.add(4 * i).cast());
                sum.add(_mm512_shuffle_epi8(c, reverse), h);
            }
        }
        // SAFETY: stays within `h_powers` (the packet has 4 * WIDE more blocks).
        powers = unsafe { powers.add(4 * WIDE) };
        off += WIDE * 64;
    }
    if off == text.total {
        return;
    }
    // The rest, at most WIDE registers, encrypted together: one, four or eight at once,
    // whichever covers it (a spare register's rounds cost less than a second pass's latency;
    // one register covers an ACK-only packet).
    let mut ks = [_mm512_setzero_si512(); WIDE];
    if text.total - off <= 64 {
        ks[0] = encrypt_4x::<NR, 1>(rk, [ctr.next()])[0];
    } else if text.total - off <= 4 * 64 {
        ks[..4].copy_from_slice(&encrypt_4x::<NR, 4>(
            rk,
            std::array::from_fn(|_| ctr.next()),
        ));
    } else {
        ks = encrypt_4x::<NR, WIDE>(rk, std::array::from_fn(|_| ctr.next()));
    }
    for k in ks.iter() {
        if off >= text.total {
            break;
        }
        let m = byte_mask(text.total - off);
        // SAFETY: the mask covers only bytes below `total`; masked-off bytes are neither read
        // nor written. The four powers loaded start at a block of this packet; past its last
        // block they run into the lengths block's power and the zero padding, multiplied by
        // zeroed lanes.
        unsafe {
            let c = _mm512_xor_si512(text.load(off), *k);
            _mm512_mask_storeu_epi8(text.out.add(off).cast(), m, c);
            // GHASH pads the last block with zeros, not with keystream.
            let c = _mm512_maskz_mov_epi8(m, c);
            let h = _mm512_loadu_si512(powers.cast());
            sum.add(_mm512_shuffle_epi8(c, reverse), h);
            powers = powers.add(4);
        }
        off += 64;
    }
}

/// Adds the GHASH products of `len` bytes at `data` (the last block zero-padded), block `j`
/// times the power at `powers + j`.
///
/// # Safety
/// As [`encrypt_and_hash`] for `data..data + len` and `powers`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,vpclmulqdq")]
unsafe fn hash_into(sum: &mut Products, data: *const u8, len: usize, powers: *const __m128i) {
    let reverse = _mm512_broadcast_i32x4(byte_reverse_mask());
    let mut off = 0;
    while off < len {
        let m = byte_mask(len - off);
        // SAFETY: masked to bytes below `len`; four powers from a block of this message.
        unsafe {
            let d = _mm512_maskz_loadu_epi8(m, data.add(off).cast());
            let h = _mm512_loadu_si512(powers.add(off / 16).cast());
            sum.add(_mm512_shuffle_epi8(d, reverse), h);
        }
        off += 64;
    }
}

/// The seal with `NR` rounds: the shared driver, compiled with this width's instructions so
/// that its helpers inline into it.
///
/// # Safety
/// The CPU has the features named; `text.len() == in_len + extra.len()`, and `in_len % 16 == 0`
/// or `extra` is empty.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,vaes,vpclmulqdq,aes,pclmulqdq")]
unsafe fn seal_with<const NR: usize>(
    key: &Key,
    nonce: &[u8; 12],
    aad: &[u8],
    text: &mut [u8],
    in_len: usize,
    extra: &[u8],
    tag: &mut [u8; 16],
) {
    // SAFETY: as the caller promised.
    unsafe { super::seal::<Key, NR>(key, nonce, aad, text, in_len, extra, tag) }
}

impl Lanes for Key {
    type Sum = Products;
    type Counter = Counter;

    fn schedule(&self) -> &Schedule {
        &self.schedule
    }

    fn powers(&self) -> *const __m128i {
        self.schedule.h_powers.as_ptr()
    }

    #[inline(always)]
    unsafe fn sum() -> Products {
        // SAFETY: the CPU has the instructions, as the caller promised.
        unsafe { Products::new() }
    }

    #[inline(always)]
    unsafe fn counter(nonce: __m128i, first: u32) -> Counter {
        // SAFETY: as for `sum`.
        unsafe { Counter::new(nonce, first) }
    }

    #[inline(always)]
    unsafe fn add_carry(sum: &mut Products, acc: __m128i, powers: *const __m128i) {
        // SAFETY: as the caller promised.
        unsafe { sum.add_carry(acc, powers) }
    }

    #[inline(always)]
    unsafe fn hash_into(sum: &mut Products, data: *const u8, len: usize, powers: *const __m128i) {
        // SAFETY: as the caller promised.
        unsafe { hash_into(sum, data, len, powers) }
    }

    #[inline(always)]
    unsafe fn encrypt_and_hash<const NR: usize>(
        &self,
        ctr: &mut Counter,
        text: Parts,
        powers: *const __m128i,
        sum: &mut Products,
    ) {
        let text = Plaintext {
            out: text.out,
            in_len: text.in_len,
            extra: text.extra,
            total: text.total,
        };
        // SAFETY: as the caller promised.
        unsafe { encrypt_and_hash::<NR>(&self.wide_round_keys, ctr, text, powers, sum) }
    }

    #[inline(always)]
    unsafe fn reduce(sum: &Products) -> __m128i {
        // SAFETY: as for `sum`.
        unsafe { sum.reduce() }
    }
}
