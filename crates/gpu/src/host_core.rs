//! The host build of the kernel's arithmetic core (`kernels/rsa_core.h`, compiled by
//! `build.rs`), with safe wrappers: key records, the CRT private-key operation for one request,
//! and Montgomery arithmetic modulo the public modulus (blinding, public checks).
//!
//! Numbers are little-endian `u32` limbs, as in the kernel. Limb counts are checked here, so the
//! C code never reads or writes outside a buffer.

use std::os::raw::c_int;
use zeroize::Zeroize;

mod ffi {
    use std::os::raw::c_int;
    extern "C" {
        pub fn rsa_host_neg_inv32(m0: u32) -> u32;
        pub fn rsa_host_pow2_mod(r: *mut u32, k: c_int, m: *const u32, n: c_int);
        pub fn rsa_host_mont_mul(
            r: *mut u32,
            a: *const u32,
            b: *const u32,
            m: *const u32,
            m0inv: u32,
            n: c_int,
        );
        pub fn rsa_host_prep_key(key: *mut u32, n: c_int);
        pub fn rsa_host_crt(out: *mut u32, input: *const u32, key: *const u32, n: c_int);
        pub fn rsa_host_exp_public(
            r: *mut u32,
            a: *const u32,
            e: u64,
            m: *const u32,
            m0inv: u32,
            rr: *const u32,
            n: c_int,
        );
    }

    /// The CUDA entry point compiled for the host once per kernel shape (`build.rs` names each
    /// `rsa_emulate_launch_w{window}` or `..._w{window}_s{threads per request}`): one signature,
    /// the kernel's arguments after the prime's limb count and the grid.
    macro_rules! emulated_launches {
        ($($name:ident),*) => {
            extern "C" {
                $(
                    pub fn $name(
                        half: c_int,
                        grid: u32,
                        block: u32,
                        out: *mut u32,
                        input: *const u32,
                        keys: *const u32,
                        key_index: *const u32,
                        count: u32,
                    ) -> c_int;
                )*
            }
        };
    }
    emulated_launches!(
        rsa_emulate_launch_w4,
        rsa_emulate_launch_w5,
        rsa_emulate_launch_w6,
        rsa_emulate_launch_w5_s2,
        rsa_emulate_launch_w5_s2_f64,
        rsa_emulate_launch_w4_s2_f64,
        rsa_emulate_launch_w4_s8_f64,
        rsa_emulate_launch_w4_s16_f64,
        rsa_emulate_launch_w4_s32_f64,
        rsa_emulate_launch_w5_s8,
        rsa_emulate_launch_w5_s16,
        rsa_emulate_launch_w5_s32,
        rsa_emulate_launch_w5_s16_sh,
        rsa_emulate_launch_w4_s16_sh
    );
}

/// Limbs per prime the core supports (RSA-2048, -3072, -4096).
pub const HALF_LIMBS: [usize; 3] = [32, 48, 64];

/// The index of primes of `half` limbs in [`HALF_LIMBS`] (and in anything kept per key size).
pub fn size_index(half: usize) -> usize {
    match half {
        32 => 0,
        48 => 1,
        _ => 2,
    }
}
/// Largest modulus the generic helpers take (`RSA_MAX_LIMBS` in the C core).
const MAX_LIMBS: usize = 128;

/// The key record layout shared with the C core (`RSA_K_*` in `rsa_core.h`).
pub struct KeyLayout;

impl KeyLayout {
    /// Words in a key record for primes of `half` limbs.
    pub const fn words(half: usize) -> usize {
        9 * half + 4
    }
    const fn p(_half: usize) -> usize {
        0
    }
    const fn q(half: usize) -> usize {
        half
    }
    const fn dp(half: usize) -> usize {
        2 * half
    }
    const fn dq(half: usize) -> usize {
        3 * half + 1
    }
    const fn qinv(half: usize) -> usize {
        8 * half + 2
    }
}

/// Big-endian bytes to `limbs` little-endian 32-bit limbs; `None` if the value does not fit.
pub fn be_to_limbs(be: &[u8], limbs: usize) -> Option<Vec<u32>> {
    let start = be.iter().position(|&b| b != 0).unwrap_or(be.len());
    let be = &be[start..];
    if be.len() > 4 * limbs {
        return None;
    }
    let mut out = vec![0u32; limbs];
    for (limb, chunk) in out.iter_mut().zip(be.rchunks(4)) {
        let mut bytes = [0u8; 4];
        bytes[4 - chunk.len()..].copy_from_slice(chunk);
        *limb = u32::from_be_bytes(bytes);
    }
    Some(out)
}

/// Limbs to `len` big-endian bytes (the value must fit; higher bytes are dropped).
pub fn limbs_to_be(limbs: &[u32], len: usize) -> Vec<u8> {
    let mut out = vec![0u8; len];
    for (chunk, limb) in out.rchunks_mut(4).zip(limbs) {
        let bytes = limb.to_be_bytes();
        chunk.copy_from_slice(&bytes[4 - chunk.len()..]);
    }
    out
}

fn bit_len(be: &[u8]) -> usize {
    match be.iter().position(|&b| b != 0) {
        Some(i) => (be.len() - i) * 8 - be[i].leading_zeros() as usize,
        None => 0,
    }
}

/// Why key components were refused. Never carries key material.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CoreKeyError {
    #[error("RSA-{0} is not supported by the GPU core (2048, 3072 or 4096 bits with two equal-size odd primes)")]
    Unsupported(usize),
}

/// A prepared CRT key record: what the kernel reads for each request of this key.
/// Zeroized on drop; `Debug` shows only the size.
pub struct CrtKey {
    half: usize,
    record: Vec<u32>,
}

impl std::fmt::Debug for CrtKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CrtKey({} limbs per prime)", self.half)
    }
}

impl Drop for CrtKey {
    fn drop(&mut self) {
        self.record.zeroize();
    }
}

impl CrtKey {
    /// From the big-endian CRT components of a key whose modulus has `modulus_bits` bits.
    pub fn from_components(
        modulus_bits: usize,
        p: &[u8],
        q: &[u8],
        dp: &[u8],
        dq: &[u8],
        qinv: &[u8],
    ) -> Result<Self, CoreKeyError> {
        let bad = || CoreKeyError::Unsupported(modulus_bits);
        let half = match modulus_bits {
            2048 | 3072 | 4096 => modulus_bits / 64,
            _ => return Err(bad()),
        };
        let odd = |x: &[u8]| x.last().is_some_and(|b| b & 1 == 1);
        if bit_len(p) != 32 * half || bit_len(q) != 32 * half || !odd(p) || !odd(q) {
            return Err(bad());
        }
        let mut record = vec![0u32; KeyLayout::words(half)];
        let mut put = |at: usize, v: &[u8], limbs: usize| -> Result<(), CoreKeyError> {
            let mut l = be_to_limbs(v, limbs).ok_or_else(bad)?;
            record[at..at + limbs].copy_from_slice(&l);
            l.zeroize();
            Ok(())
        };
        put(KeyLayout::p(half), p, half)?;
        put(KeyLayout::q(half), q, half)?;
        put(KeyLayout::dp(half), dp, half)?;
        put(KeyLayout::dq(half), dq, half)?;
        put(KeyLayout::qinv(half), qinv, half)?;
        // SAFETY: the record has KeyLayout::words(half) words, the layout rsa_host_prep_key
        // reads and writes for primes of `half` limbs; half is 32, 48 or 64 (≤ RSA_MAX_HALF).
        unsafe { ffi::rsa_host_prep_key(record.as_mut_ptr(), half as c_int) };
        Ok(CrtKey { half, record })
    }

    /// Limbs per prime (32, 48 or 64); requests have twice as many.
    pub fn half(&self) -> usize {
        self.half
    }

    /// The key record as the kernel reads it.
    pub fn record(&self) -> &[u32] {
        &self.record
    }

    /// The same key with the CRT exponents replaced (big-endian), e.g. p-2 and q-2 to invert
    /// by Fermat.
    pub fn with_exponents(&self, dp: &[u8], dq: &[u8]) -> Result<Self, CoreKeyError> {
        let bad = || CoreKeyError::Unsupported(64 * self.half);
        let half = self.half;
        let mut record = self.record.clone();
        let mut dpl = be_to_limbs(dp, half).ok_or_else(bad)?;
        let mut dql = be_to_limbs(dq, half).ok_or_else(bad)?;
        record[KeyLayout::dp(half)..KeyLayout::dp(half) + half].copy_from_slice(&dpl);
        record[KeyLayout::dq(half)..KeyLayout::dq(half) + half].copy_from_slice(&dql);
        dpl.zeroize();
        dql.zeroize();
        Ok(CrtKey { half, record })
    }

    /// The private-key operation on one request with the host build of the kernel core:
    /// `input^d mod n`, `input` of `2·half` limbs and below the modulus.
    pub fn crt(&self, input: &[u32]) -> Vec<u32> {
        let mut out = vec![0u32; 2 * self.half];
        self.crt_into(input, &mut out);
        out
    }

    /// Like [`CrtKey::crt`], into `out` (`2·half` limbs).
    pub fn crt_into(&self, input: &[u32], out: &mut [u32]) {
        crt_record(&self.record, self.half, input, out);
    }
}

/// The kernel's per-request body on the host, for a raw key record (as a backend sees it).
/// Panics if the buffer sizes do not match `half`.
pub fn crt_record(record: &[u32], half: usize, input: &[u32], out: &mut [u32]) {
    assert!(HALF_LIMBS.contains(&half), "unsupported limb count {half}");
    assert_eq!(record.len(), KeyLayout::words(half));
    assert_eq!(input.len(), 2 * half);
    assert_eq!(out.len(), 2 * half);
    // SAFETY: sizes checked above: the record has the layout for `half`, input and out have
    // 2·half limbs each and do not alias (distinct borrows).
    unsafe {
        ffi::rsa_host_crt(
            out.as_mut_ptr(),
            input.as_ptr(),
            record.as_ptr(),
            half as c_int,
        )
    };
}

/// Runs the CUDA kernel's entry point (`kernels/rsa_kernel.cu`, compiled for the host) over a
/// whole grid: `count` requests of primes of `half` limbs in blocks of `block` threads, request
/// `i` using key record `key_index[i]` of `keys`. What the device would compute, thread by
/// thread. Panics if a buffer is too small or a key index out of range (which would make the
/// kernel read out of bounds).
pub fn emulate_launch(
    half: usize,
    block: u32,
    keys: &[u32],
    key_index: &[u32],
    input: &[u32],
    out: &mut [u32],
) {
    emulate_launch_windowed(DEFAULT_WINDOW, half, block, keys, key_index, input, out)
}

/// The exponent window width (bits) the kernel is built with unless told otherwise.
pub const DEFAULT_WINDOW: u32 = 5;
/// Window widths the kernel can be built with (`-DRSA_WINDOW`), for measuring on a device.
pub const WINDOWS: [u32; 3] = [4, 5, 6];

/// [`emulate_launch`] with the kernel built for exponent windows of `window` bits (one of
/// [`WINDOWS`]).
pub fn emulate_launch_windowed(
    window: u32,
    half: usize,
    block: u32,
    keys: &[u32],
    key_index: &[u32],
    input: &[u32],
    out: &mut [u32],
) {
    let shape = KernelShape {
        window,
        threads_per_request: 1,
        table_shared: false,
        carry_chains: false,
        fp64: false,
    };
    emulate_launch_shaped(shape, half, block, keys, key_index, input, out)
}

/// A kernel's shape: what `-D` options it is built with (`kernels/rsa_kernel.cu`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KernelShape {
    /// Exponent window width, one of [`WINDOWS`].
    pub window: u32,
    /// Threads per request, one of [`THREADS_PER_REQUEST`]: 1, 2 (one per CRT half), or 8, 16,
    /// 32 (a group of 4, 8, 16 lanes per CRT half, `kernels/rsa_group.h`).
    pub threads_per_request: u32,
    /// The group kernels' window table in shared memory instead of a local array per thread.
    pub table_shared: bool,
    /// The group kernels' multiply-accumulate rows as PTX carry chains (`mad.lo.cc`,
    /// `madc.hi.cc`) instead of portable C. CUDA only: the host emulation runs the portable
    /// rows, and the device's self-check compares the two.
    pub carry_chains: bool,
    /// Each CRT half's exponentiation in FP64 arithmetic (52-bit limbs in doubles, products by
    /// fused multiply-add: `kernels/rsa_fp64.h`) instead of 32-bit integer multiply-adds: on one
    /// thread with 2 threads per request, or over a group; the window table in local memory.
    pub fp64: bool,
}

/// Threads per request a kernel can be built for.
pub const THREADS_PER_REQUEST: [u32; 5] = [1, 2, 8, 16, 32];

impl KernelShape {
    /// Lanes per CRT half of a group kernel (`None` for one or two threads per request).
    pub fn group(&self) -> Option<u32> {
        (self.threads_per_request > 2).then_some(self.threads_per_request / 2)
    }

    /// Shared memory a launch of `block` threads needs for primes of `half` limbs beyond the
    /// kernel's static arrays: the window table when it is in shared memory.
    pub fn dynamic_shared_bytes(&self, half: usize, block: u32) -> usize {
        match self.group() {
            Some(g) if self.table_shared => {
                (1usize << self.window) * (half / g as usize) * block as usize * 4
            }
            _ => 0,
        }
    }

    /// Why this shape cannot be built or launched in blocks of `block` threads, if it cannot.
    pub fn check(&self, block: u32) -> Result<(), String> {
        if !WINDOWS.contains(&self.window) {
            return Err(format!(
                "window width {}: expected one of {WINDOWS:?}",
                self.window
            ));
        }
        if !THREADS_PER_REQUEST.contains(&self.threads_per_request) {
            return Err(format!(
                "{} threads per request: expected one of {THREADS_PER_REQUEST:?}",
                self.threads_per_request
            ));
        }
        if self.fp64 && (self.threads_per_request == 1 || self.table_shared) {
            return Err(
                "FP64 arithmetic needs 2, 8, 16 or 32 threads per request and its window table in local memory"
                    .into(),
            );
        }
        if (self.table_shared || self.carry_chains) && self.group().is_none() {
            return Err(
                "a shared window table and carry chains need 8, 16 or 32 threads per request"
                    .into(),
            );
        }
        let tpr = self.threads_per_request;
        if self.group().is_some() && !block.is_multiple_of(32) {
            return Err(format!(
                "the group kernels exchange values across whole warps: a block that is a multiple of 32 threads, not {block}"
            ));
        }
        if tpr > 1 && (!block.is_multiple_of(tpr) || block > MAX_SPLIT_BLOCK) {
            return Err(format!(
                "{tpr} threads per request need a block that is a multiple of {tpr} of at most {MAX_SPLIT_BLOCK} threads, not {block}"
            ));
        }
        Ok(())
    }
}

/// Largest block the kernels with several threads per request take (`RSA_MAX_BLOCK` in
/// `kernels/rsa_kernel.cu`: their shared hand-over is sized for it).
pub const MAX_SPLIT_BLOCK: u32 = 256;

/// [`emulate_launch`] with the kernel built in `shape`. With several threads per request each
/// block's threads run at once (OS threads and a real barrier for two; fibers exchanging values
/// as warp shuffles and ballots for a group); `block` must suit the shape
/// ([`KernelShape::check`]).
pub fn emulate_launch_shaped(
    shape: KernelShape,
    half: usize,
    block: u32,
    keys: &[u32],
    key_index: &[u32],
    input: &[u32],
    out: &mut [u32],
) {
    assert!(HALF_LIMBS.contains(&half), "unsupported limb count {half}");
    let KernelShape {
        window,
        threads_per_request,
        table_shared,
        fp64,
        ..
    } = shape;
    let launch = match (window, threads_per_request, table_shared, fp64) {
        (4, 1, false, false) => ffi::rsa_emulate_launch_w4,
        (5, 1, false, false) => ffi::rsa_emulate_launch_w5,
        (6, 1, false, false) => ffi::rsa_emulate_launch_w6,
        (5, 2, false, false) => ffi::rsa_emulate_launch_w5_s2,
        (5, 2, false, true) => ffi::rsa_emulate_launch_w5_s2_f64,
        (4, 2, false, true) => ffi::rsa_emulate_launch_w4_s2_f64,
        (4, 8, false, true) => ffi::rsa_emulate_launch_w4_s8_f64,
        (4, 16, false, true) => ffi::rsa_emulate_launch_w4_s16_f64,
        (4, 32, false, true) => ffi::rsa_emulate_launch_w4_s32_f64,
        (5, 8, false, false) => ffi::rsa_emulate_launch_w5_s8,
        (5, 16, false, false) => ffi::rsa_emulate_launch_w5_s16,
        (5, 32, false, false) => ffi::rsa_emulate_launch_w5_s32,
        (5, 16, true, false) => ffi::rsa_emulate_launch_w5_s16_sh,
        (4, 16, true, false) => ffi::rsa_emulate_launch_w4_s16_sh,
        _ => panic!("no emulated kernel for {shape:?}"),
    };
    if let Err(e) = shape.check(block) {
        panic!("{e}");
    }
    let count = key_index.len();
    let words = KeyLayout::words(half);
    assert!(block > 0);
    assert_eq!(keys.len() % words, 0);
    assert!(key_index.iter().all(|&k| (k as usize) < keys.len() / words));
    assert!(input.len() >= count * 2 * half && out.len() >= count * 2 * half);
    let grid = (count as u32 * threads_per_request).div_ceil(block);
    static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _g = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    // SAFETY: sizes checked above (the thread(s) of every request i < count read input/out at
    // i·2·half limbs and a key record at key_index[i]·words, all in bounds; threads past count
    // write nothing, and a group kernel's read request 0, which exists as count > 0); the
    // emulator's globals are guarded by ONE_AT_A_TIME, and a block's OS threads are joined (its
    // fibers finished) before the launch returns.
    let rc = unsafe {
        launch(
            half as c_int,
            grid,
            block,
            out.as_mut_ptr(),
            input.as_ptr(),
            keys.as_ptr(),
            key_index.as_ptr(),
            count as u32,
        )
    };
    assert_eq!(rc, 0);
}

/// Pairs of 32-bit limbs as 64-bit limbs (little-endian; an even count).
fn to_u64_limbs(a: &[u32]) -> Vec<u64> {
    a.chunks_exact(2)
        .map(|p| u64::from(p[0]) | (u64::from(p[1]) << 32))
        .collect()
}

/// -m0⁻¹ mod 2⁶⁴ for odd m0 (Newton: each step doubles the correct low bits, 1 → 64).
fn neg_inv64(m0: u64) -> u64 {
    let mut inv = 1u64;
    for _ in 0..6 {
        inv = inv.wrapping_mul(2u64.wrapping_sub(m0.wrapping_mul(inv)));
    }
    inv.wrapping_neg()
}

/// Montgomery multiplication with 64-bit limbs (CIOS): a·b·R⁻¹ mod m for a, b < m, with
/// R = 2^(64·n). Constant time: loops run over the public length, 64×64→128-bit products have
/// no data-dependent timing on the CPUs rampart runs on, and the final subtraction is selected
/// by a mask.
fn mont_mul64(a: &[u64], b: &[u64], m: &[u64], m0inv: u64) -> Vec<u64> {
    const MAX: usize = MAX_LIMBS / 2;
    let n = m.len();
    assert!(n <= MAX && a.len() == n && b.len() == n);
    let mut t = [0u64; MAX + 2];
    for &bi in b {
        let mut c: u128 = 0;
        for j in 0..n {
            c = u128::from(a[j]) * u128::from(bi) + u128::from(t[j]) + (c >> 64);
            t[j] = c as u64;
        }
        c = u128::from(t[n]) + (c >> 64);
        t[n] = c as u64;
        t[n + 1] = (c >> 64) as u64;
        let q = t[0].wrapping_mul(m0inv);
        c = u128::from(q) * u128::from(m[0]) + u128::from(t[0]);
        for j in 1..n {
            c = u128::from(q) * u128::from(m[j]) + u128::from(t[j]) + (c >> 64);
            t[j - 1] = c as u64;
        }
        c = u128::from(t[n]) + (c >> 64);
        t[n - 1] = c as u64;
        t[n] = t[n + 1] + (c >> 64) as u64;
    }
    // t < 2m: subtract m, keep t when (t[n]:t) < m (no top word and a borrow).
    let mut d = [0u64; MAX];
    let mut borrow = 0u64;
    for j in 0..n {
        let (x, b1) = t[j].overflowing_sub(m[j]);
        let (x, b2) = x.overflowing_sub(borrow);
        d[j] = x;
        borrow = u64::from(b1 | b2);
    }
    let keep = 0u64.wrapping_sub((1 ^ (t[n] & 1)) & borrow);
    (0..n).map(|j| (t[j] & keep) | (d[j] & !keep)).collect()
}

/// An odd modulus prepared for Montgomery arithmetic (public values only).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Modulus {
    m: Vec<u32>,
    m0inv: u32,
    /// R² mod m.
    rr: Vec<u32>,
    /// m in 64-bit limbs and -m⁻¹ mod 2⁶⁴, for the host's own Montgomery multiplication when
    /// the limb count is even (every RSA modulus): a quarter of the 32-bit core's products.
    m64: Vec<u64>,
    m0inv64: u64,
}

impl Modulus {
    /// From big-endian bytes; `limbs` fixes R = 2^(32·limbs). `None` if even or too large.
    pub fn new(be: &[u8], limbs: usize) -> Option<Self> {
        if limbs == 0 || limbs > MAX_LIMBS || be.last().is_none_or(|b| b & 1 != 1) {
            return None;
        }
        let m = be_to_limbs(be, limbs)?;
        if m.iter().all(|&l| l == 0) || m == [1] {
            return None;
        }
        // SAFETY: m has `limbs` ≤ RSA_MAX_LIMBS limbs.
        let m0inv = unsafe { ffi::rsa_host_neg_inv32(m[0]) };
        let mut rr = vec![0u32; limbs];
        // SAFETY: rr and m have `limbs` limbs.
        unsafe {
            ffi::rsa_host_pow2_mod(
                rr.as_mut_ptr(),
                (64 * limbs) as c_int,
                m.as_ptr(),
                limbs as c_int,
            )
        };
        let m64 = if limbs.is_multiple_of(2) {
            to_u64_limbs(&m)
        } else {
            Vec::new()
        };
        let m0inv64 = m64.first().map_or(0, |&m0| neg_inv64(m0));
        Some(Modulus {
            m,
            m0inv,
            rr,
            m64,
            m0inv64,
        })
    }

    pub fn limbs(&self) -> usize {
        self.m.len()
    }

    pub fn value(&self) -> &[u32] {
        &self.m
    }

    /// R² mod m.
    pub fn rr(&self) -> &[u32] {
        &self.rr
    }

    /// a·b·R⁻¹ mod m, for a, b < m. Constant time.
    pub fn mont_mul(&self, a: &[u32], b: &[u32]) -> Vec<u32> {
        let n = self.m.len();
        assert!(a.len() == n && b.len() == n, "operand sizes");
        if !self.m64.is_empty() {
            let r = mont_mul64(&to_u64_limbs(a), &to_u64_limbs(b), &self.m64, self.m0inv64);
            return r
                .iter()
                .flat_map(|&w| [w as u32, (w >> 32) as u32])
                .collect();
        }
        self.mont_mul_core(a, b)
    }

    /// [`Modulus::mont_mul`] by the kernel's own 32-bit core (built for the host).
    pub fn mont_mul_core(&self, a: &[u32], b: &[u32]) -> Vec<u32> {
        let n = self.m.len();
        assert!(a.len() == n && b.len() == n, "operand sizes");
        let mut r = vec![0u32; n];
        // SAFETY: r, a, b and m all have n ≤ RSA_MAX_LIMBS limbs; the core allows aliasing of
        // inputs, and r is a fresh buffer.
        unsafe {
            ffi::rsa_host_mont_mul(
                r.as_mut_ptr(),
                a.as_ptr(),
                b.as_ptr(),
                self.m.as_ptr(),
                self.m0inv,
                n as c_int,
            )
        };
        r
    }

    /// a^e mod m for a public exponent (plain values, a < m).
    pub fn pow_public(&self, a: &[u32], e: u64) -> Vec<u32> {
        let n = self.m.len();
        assert_eq!(a.len(), n, "operand size");
        let mut r = vec![0u32; n];
        // SAFETY: every buffer has n ≤ RSA_MAX_LIMBS limbs; r is distinct from a.
        unsafe {
            ffi::rsa_host_exp_public(
                r.as_mut_ptr(),
                a.as_ptr(),
                e,
                self.m.as_ptr(),
                self.m0inv,
                self.rr.as_ptr(),
                n as c_int,
            )
        };
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limbs_round_trip() {
        let mut rng = fastrand::Rng::with_seed(3);
        for len in [1usize, 3, 4, 5, 128, 256, 384, 512] {
            let mut bytes: Vec<u8> = (0..len).map(|_| rng.u8(..)).collect();
            bytes[0] |= 1;
            let limbs = be_to_limbs(&bytes, len.div_ceil(4)).unwrap();
            assert_eq!(limbs_to_be(&limbs, len), bytes);
        }
        assert_eq!(be_to_limbs(&[1, 0, 0, 0, 0], 1), None, "does not fit");
        assert_eq!(be_to_limbs(&[0, 0, 0, 0, 7], 1), Some(vec![7]));
    }

    /// Small moduli checked against u128 arithmetic.
    #[test]
    fn mont_mul_and_pow_match_u128() {
        let mut rng = fastrand::Rng::with_seed(11);
        for _ in 0..200 {
            let m = (rng.u64(3..u64::MAX) | 1) as u128;
            let mo = Modulus::new(&(m as u64).to_be_bytes(), 2).unwrap();
            let a = rng.u64(..) as u128 % m;
            let b = rng.u64(..) as u128 % m;
            let al = be_to_limbs(&(a as u64).to_be_bytes(), 2).unwrap();
            let bl = be_to_limbs(&(b as u64).to_be_bytes(), 2).unwrap();
            // a·b·R⁻¹ · R² · R⁻¹ = a·b
            let ab = mo.mont_mul(&mo.mont_mul(&al, &bl), mo.rr());
            let expect = mulmod(a, b, m);
            assert_eq!(limbs_to_be(&ab, 8), (expect as u64).to_be_bytes(), "m={m}");
            let e = rng.u64(..);
            let pw = mo.pow_public(&al, e);
            let mut x = 1u128;
            for bit in (0..64).rev() {
                x = mulmod(x, x, m);
                if e >> bit & 1 == 1 {
                    x = mulmod(x, a, m);
                }
            }
            assert_eq!(limbs_to_be(&pw, 8), (x as u64).to_be_bytes());
        }
    }

    /// The host's 64-bit Montgomery multiplication equals the kernel core's 32-bit one (same
    /// R = 2^(32·limbs)) at every RSA size, on random operands and on the extremes 0, 1 and
    /// m-1, whose products exercise the final conditional subtraction both ways.
    #[test]
    fn mont_mul_64_bit_limbs_match_the_32_bit_core() {
        let mut rng = fastrand::Rng::with_seed(17);
        for limbs in [64usize, 96, 128] {
            for _ in 0..20 {
                let mut be: Vec<u8> = (0..4 * limbs).map(|_| rng.u8(..)).collect();
                be[0] |= 0x80;
                *be.last_mut().unwrap() |= 1;
                let mo = Modulus::new(&be, limbs).unwrap();
                assert!(!mo.m64.is_empty());
                let below = |rng: &mut fastrand::Rng| {
                    let mut x: Vec<u8> = (0..4 * limbs).map(|_| rng.u8(..)).collect();
                    x[0] &= 0x7f; // below m, whose top bit is set
                    be_to_limbs(&x, limbs).unwrap()
                };
                let mut m_minus_1 = mo.value().to_vec();
                m_minus_1[0] -= 1; // m is odd
                let mut one = vec![0u32; limbs];
                one[0] = 1;
                let zero = vec![0u32; limbs];
                let mut operands = vec![zero, one, m_minus_1, mo.rr().to_vec()];
                operands.push(below(&mut rng));
                operands.push(below(&mut rng));
                for a in &operands {
                    for b in &operands {
                        assert_eq!(mo.mont_mul(a, b), mo.mont_mul_core(a, b), "{limbs} limbs");
                    }
                }
            }
        }
        // An odd limb count takes the 32-bit core.
        let mo = Modulus::new(&[0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 7], 3).unwrap();
        assert!(mo.m64.is_empty());
    }

    fn mulmod(a: u128, b: u128, m: u128) -> u128 {
        // a, b < 2^64: schoolbook on halves avoids u128 overflow.
        let mut r = 0u128;
        let mut a = a % m;
        let mut b = b;
        while b > 0 {
            if b & 1 == 1 {
                r = (r + a) % m;
            }
            a = (a << 1) % m;
            b >>= 1;
        }
        r
    }

    #[test]
    fn unsupported_sizes_are_refused() {
        let p = [0xffu8; 64];
        assert_eq!(
            CrtKey::from_components(1024, &p, &p, &p, &p, &p).unwrap_err(),
            CoreKeyError::Unsupported(1024)
        );
        let mut even = [0xffu8; 128];
        even[127] = 0xfe;
        assert!(CrtKey::from_components(2048, &even, &p, &p, &p, &p).is_err());
    }
}
