/*
 * RSA-CRT arithmetic core shared by the CUDA kernel and the host build.
 *
 * The same text is compiled twice: by the host C compiler (build.rs, via rsa_host.c), where
 * RSA_FN is `static inline`, and by NVRTC at run time (src/cuda.rs concatenates it in front of
 * rsa_kernel.cu), where RSA_FN is `__device__ static inline`. Tests run the host build against
 * BoringSSL, so the kernel's arithmetic is tested on machines without a GPU.
 *
 * Numbers are little-endian arrays of 32-bit limbs. A prime of a key of B bits has n = B/64
 * limbs (32, 48 or 64); R = 2^(32n). Constant time: no branch and no memory index depends on
 * a secret value; loops depend only on public sizes (n, exponent bit count). Exponent windows
 * are selected from the table by scanning every entry under a mask.
 */
#ifndef RSA_CORE_H
#define RSA_CORE_H

#ifdef __CUDACC__
#define RSA_FN __device__ static inline
/* Full unrolling keeps the squaring's and the reduction's limb arrays in registers (n is a
 * compile-time constant in every kernel). -DRSA_NO_UNROLL leaves it to the compiler. */
#ifndef RSA_NO_UNROLL
#define RSA_UNROLL _Pragma("unroll")
#endif
typedef unsigned int rsa_u32;
typedef unsigned long long rsa_u64;
#else
#include <stdint.h>
#define RSA_FN static inline
typedef uint32_t rsa_u32;
typedef uint64_t rsa_u64;
#endif

#ifndef RSA_UNROLL
#define RSA_UNROLL
#endif

/* Largest prime, in limbs (RSA-4096: two 2048-bit primes). */
#define RSA_MAX_HALF 64
/* Largest modulus handled by the generic helpers (the full RSA-4096 modulus on the host). */
#define RSA_MAX_LIMBS 128
/* Fixed window width (bits) and table size. The width is public and fixed per build: 5 unless
 * the compiler is given another (-DRSA_WINDOW=4..6, for measuring the kernel on a device). */
#ifndef RSA_WINDOW
#define RSA_WINDOW 5
#endif
#if RSA_WINDOW < 4 || RSA_WINDOW > 6
#error "RSA_WINDOW must be 4, 5 or 6"
#endif
#define RSA_TABLE (1 << RSA_WINDOW)
/* Exponent bits processed for primes of n limbs: 32n rounded up to whole windows. The exponent
 * has a spare zero word above its n limbs, so the last window's read stays inside it. */
#define RSA_EXP_BITS(n) (((32 * (n) + RSA_WINDOW - 1) / RSA_WINDOW) * RSA_WINDOW)

/*
 * A prepared key is one flat array of 32-bit words ("key record"), item layout shared with
 * src/core.rs (KeyLayout). Offsets for primes of n limbs:
 */
#define RSA_K_P(n) 0                        /* p, n limbs */
#define RSA_K_Q(n) (n)                      /* q, n limbs */
#define RSA_K_DP(n) (2 * (n))               /* d mod (p-1), n+1 limbs (spare zero word) */
#define RSA_K_DQ(n) (3 * (n) + 1)           /* d mod (q-1), n+1 limbs */
#define RSA_K_ONE_P(n) (4 * (n) + 2)        /* R mod p */
#define RSA_K_ONE_Q(n) (5 * (n) + 2)        /* R mod q */
#define RSA_K_RRR_P(n) (6 * (n) + 2)        /* R^3 mod p */
#define RSA_K_RRR_Q(n) (7 * (n) + 2)        /* R^3 mod q */
#define RSA_K_QINV(n) (8 * (n) + 2)         /* q^-1 * R mod p */
#define RSA_K_P0INV(n) (9 * (n) + 2)        /* -p^-1 mod 2^32 */
#define RSA_K_Q0INV(n) (9 * (n) + 3)        /* -q^-1 mod 2^32 */
#define RSA_KEY_WORDS(n) (9 * (n) + 4)

/* Scratch words rsa_crt needs: one half's (the window table plus two numbers), and mp, mq. */
#define RSA_WORK_WORDS(n) (RSA_TABLE * (n) + 4 * (n))

/* All ones when x == 0, else zero. */
RSA_FN rsa_u32 rsa_ct_is_zero(rsa_u32 x) {
    return (rsa_u32)0 - ((~x & (x - 1)) >> 31);
}

/* -m0^-1 mod 2^32 for odd m0 (Newton: a fixed number of steps). */
RSA_FN rsa_u32 rsa_neg_inv32(rsa_u32 m0) {
    rsa_u32 inv = 1;
    for (int i = 0; i < 5; i++) inv *= 2u - m0 * inv;
    return (rsa_u32)0 - inv;
}

/* r = t - m when (top:t) >= m, else t; requires (top:t) < 2m. r may alias t. */
RSA_FN void rsa_reduce_once(rsa_u32 *r, const rsa_u32 *t, rsa_u32 top, const rsa_u32 *m, int n) {
    rsa_u32 d[RSA_MAX_LIMBS];
    rsa_u32 borrow = 0;
    for (int j = 0; j < n; j++) {
        rsa_u64 s = (rsa_u64)t[j] - m[j] - borrow;
        d[j] = (rsa_u32)s;
        borrow = (rsa_u32)(s >> 63);
    }
    /* keep t only when top == 0 and the subtraction borrowed (t < m). */
    rsa_u32 keep = (rsa_u32)0 - ((1u ^ (top & 1u)) & borrow);
    for (int j = 0; j < n; j++) r[j] = (t[j] & keep) | (d[j] & ~keep);
}

/* Montgomery multiplication (CIOS): r = a*b*R^-1 mod m for a, b < m; r < m. r may alias. */
RSA_FN void rsa_mont_mul(rsa_u32 *r, const rsa_u32 *a, const rsa_u32 *b, const rsa_u32 *m,
                         rsa_u32 m0inv, int n) {
    rsa_u32 t[RSA_MAX_LIMBS + 2];
    for (int j = 0; j < n + 2; j++) t[j] = 0;
    for (int i = 0; i < n; i++) {
        rsa_u64 c = 0;
        rsa_u32 bi = b[i];
        for (int j = 0; j < n; j++) {
            c = (rsa_u64)a[j] * bi + t[j] + (c >> 32);
            t[j] = (rsa_u32)c;
        }
        c = (rsa_u64)t[n] + (c >> 32);
        t[n] = (rsa_u32)c;
        t[n + 1] = (rsa_u32)(c >> 32);
        rsa_u32 q = t[0] * m0inv;
        c = (rsa_u64)q * m[0] + t[0];
        for (int j = 1; j < n; j++) {
            c = (rsa_u64)q * m[j] + t[j] + (c >> 32);
            t[j - 1] = (rsa_u32)c;
        }
        c = (rsa_u64)t[n] + (c >> 32);
        t[n - 1] = (rsa_u32)c;
        t[n] = t[n + 1] + (rsa_u32)(c >> 32);
    }
    rsa_reduce_once(r, t, t[n], m, n);
}

/*
 * Montgomery reduction in place of a 2n-limb t < m*R: r = t*R^-1 mod m, r < m. t is
 * overwritten. Row i adds q_i*m at limb i; its carry out of limb i+n is kept in `hi` and added
 * with the next row's, so no row propagates through the limbs above it.
 */
RSA_FN void rsa_redc_in_place(rsa_u32 *r, rsa_u32 *t, const rsa_u32 *m, rsa_u32 m0inv, int n) {
    rsa_u32 hi = 0;
    RSA_UNROLL for (int i = 0; i < n; i++) {
        rsa_u32 q = t[i] * m0inv;
        rsa_u64 c = 0;
        RSA_UNROLL for (int j = 0; j < n; j++) {
            c = (rsa_u64)q * m[j] + t[i + j] + (c >> 32);
            t[i + j] = (rsa_u32)c;
        }
        rsa_u64 s = (rsa_u64)t[i + n] + (c >> 32) + hi;
        t[i + n] = (rsa_u32)s;
        hi = (rsa_u32)(s >> 32);
    }
    rsa_reduce_once(r, t + n, hi, m, n);
}

/* Montgomery reduction of a 2n-limb x < m*R: r = x*R^-1 mod m, r < m. */
RSA_FN void rsa_redc(rsa_u32 *r, const rsa_u32 *x, const rsa_u32 *m, rsa_u32 m0inv, int n) {
    rsa_u32 t[2 * RSA_MAX_HALF];
    for (int j = 0; j < 2 * n; j++) t[j] = x[j];
    rsa_redc_in_place(r, t, m, m0inv, n);
}

/*
 * Montgomery squaring: r = a*a*R^-1 mod m for a < m; r may alias a. The square's products
 * a[i]*a[j] (i < j) are computed once and doubled, then the diagonal added: n(n+1)/2
 * multiplications instead of n^2, then one reduction. Exponentiation is mostly squarings.
 */
RSA_FN void rsa_mont_sqr(rsa_u32 *r, const rsa_u32 *a, const rsa_u32 *m, rsa_u32 m0inv, int n) {
    rsa_u32 t[2 * RSA_MAX_HALF];
    RSA_UNROLL for (int j = 0; j < 2 * n; j++) t[j] = 0;
    RSA_UNROLL for (int i = 0; i < n - 1; i++) {
        rsa_u64 c = 0;
        RSA_UNROLL for (int j = i + 1; j < n; j++) {
            c = (rsa_u64)a[i] * a[j] + t[i + j] + (c >> 32);
            t[i + j] = (rsa_u32)c;
        }
        t[i + n] = (rsa_u32)(c >> 32); /* limb i+n is not yet written by any row */
    }
    /* double: the top bit shifted out is 0, since 2 * (off-diagonal sum) < a^2 < 2^(64n). */
    rsa_u32 carry = 0;
    RSA_UNROLL for (int j = 0; j < 2 * n; j++) {
        rsa_u32 v = t[j];
        t[j] = (v << 1) | carry;
        carry = v >> 31;
    }
    rsa_u64 c = 0;
    RSA_UNROLL for (int i = 0; i < n; i++) {
        c = (rsa_u64)a[i] * a[i] + t[2 * i] + (c >> 32);
        t[2 * i] = (rsa_u32)c;
        c = (rsa_u64)t[2 * i + 1] + (c >> 32);
        t[2 * i + 1] = (rsa_u32)c;
    }
    rsa_redc_in_place(r, t, m, m0inv, n);
}

/* out = table[idx], scanning all RSA_TABLE entries (constant time in idx). */
RSA_FN void rsa_ct_select(rsa_u32 *out, const rsa_u32 *table, rsa_u32 idx, int n) {
    for (int j = 0; j < n; j++) out[j] = 0;
    for (int k = 0; k < RSA_TABLE; k++) {
        rsa_u32 mask = rsa_ct_is_zero((rsa_u32)k ^ idx);
        const rsa_u32 *e = table + k * n;
        for (int j = 0; j < n; j++) out[j] |= e[j] & mask;
    }
}

/* RSA_WINDOW bits of exp starting at bit `pos` (pos public; exp has a spare zero word). */
RSA_FN rsa_u32 rsa_window(const rsa_u32 *exp, int pos) {
    int w = pos >> 5, s = pos & 31;
    rsa_u64 two = (rsa_u64)exp[w] | ((rsa_u64)exp[w + 1] << 32);
    return (rsa_u32)(two >> s) & (RSA_TABLE - 1);
}

/*
 * r = a^exp in the Montgomery domain (a_m = a*R mod m, one_m = R mod m), fixed 5-bit windows:
 * every window costs five squarings and one multiplication by a table entry selected in
 * constant time, whatever the exponent bits. exp_bits must be a multiple of RSA_WINDOW and exp
 * must have words up to bit exp_bits + 32. table: RSA_TABLE*n words of scratch.
 */
RSA_FN void rsa_mont_exp(rsa_u32 *r, const rsa_u32 *a_m, const rsa_u32 *exp, int exp_bits,
                         const rsa_u32 *m, rsa_u32 m0inv, const rsa_u32 *one_m, int n,
                         rsa_u32 *table) {
    rsa_u32 sel[RSA_MAX_LIMBS];
    for (int j = 0; j < n; j++) {
        table[j] = one_m[j];
        table[n + j] = a_m[j];
    }
    for (int k = 2; k < RSA_TABLE; k++)
        rsa_mont_mul(table + k * n, table + (k - 1) * n, a_m, m, m0inv, n);
    int pos = exp_bits - RSA_WINDOW;
    rsa_ct_select(r, table, rsa_window(exp, pos), n);
    while (pos > 0) {
        pos -= RSA_WINDOW;
        for (int s = 0; s < RSA_WINDOW; s++) rsa_mont_sqr(r, r, m, m0inv, n);
        rsa_ct_select(sel, table, rsa_window(exp, pos), n);
        rsa_mont_mul(r, r, sel, m, m0inv, n);
    }
}

/* Scratch words of one CRT half (rsa_crt_half): the window table plus two numbers. */
#define RSA_HALF_WORK_WORDS(n) (RSA_TABLE * (n) + 2 * (n))

/*
 * One half of the CRT private-key operation for one request: res = (in mod m)^dm mod m with
 * (m, dm) = (p, dp) for half 0 and (q, dq) for half 1. `in` has 2n limbs, in < pq; res has n.
 * work: RSA_HALF_WORK_WORDS(n). The halves are independent: the kernel may run them on two
 * threads.
 */
RSA_FN void rsa_crt_half(rsa_u32 *res, const rsa_u32 *in, const rsa_u32 *key, int half, int n,
                         rsa_u32 *work) {
    rsa_u32 *table = work;
    rsa_u32 *x = work + RSA_TABLE * n;
    rsa_u32 *unit = x + n;
    const rsa_u32 *m = key + (half ? RSA_K_Q(n) : RSA_K_P(n));
    rsa_u32 m0inv = key[half ? RSA_K_Q0INV(n) : RSA_K_P0INV(n)];
    for (int j = 0; j < n; j++) unit[j] = 0;
    unit[0] = 1;
    /* in*R^-1 (REDC), then times R^3: in*R mod m, the Montgomery form of in mod m. */
    rsa_redc(x, in, m, m0inv, n);
    rsa_mont_mul(x, x, key + (half ? RSA_K_RRR_Q(n) : RSA_K_RRR_P(n)), m, m0inv, n);
    rsa_mont_exp(res, x, key + (half ? RSA_K_DQ(n) : RSA_K_DP(n)), RSA_EXP_BITS(n), m, m0inv,
                 key + (half ? RSA_K_ONE_Q(n) : RSA_K_ONE_P(n)), n, table);
    rsa_mont_mul(res, res, unit, m, m0inv, n); /* out of the Montgomery domain */
}

/*
 * CRT recombination: out = mq + h*q with h = (mp - mq) * qinv mod p. out has 2n limbs (< pq);
 * work: 2n words.
 */
RSA_FN void rsa_crt_combine(rsa_u32 *out, const rsa_u32 *mp, const rsa_u32 *mq,
                            const rsa_u32 *key, int n, rsa_u32 *work) {
    rsa_u32 *x = work;
    rsa_u32 *h = work + n;
    const rsa_u32 *p = key + RSA_K_P(n);
    const rsa_u32 *q = key + RSA_K_Q(n);
    /* mq mod p: mq < q < 2p (equal-size primes), so one conditional subtraction. */
    rsa_reduce_once(x, mq, 0, p, n);
    /* h = mp - x mod p: subtract, add p back under a mask when it borrowed. */
    rsa_u32 borrow = 0;
    for (int j = 0; j < n; j++) {
        rsa_u64 s = (rsa_u64)mp[j] - x[j] - borrow;
        h[j] = (rsa_u32)s;
        borrow = (rsa_u32)(s >> 63);
    }
    rsa_u32 addp = (rsa_u32)0 - borrow;
    rsa_u64 c = 0;
    for (int j = 0; j < n; j++) {
        c = (rsa_u64)h[j] + (p[j] & addp) + (c >> 32);
        h[j] = (rsa_u32)c;
    }
    /* h = h * qinv mod p (qinv is stored times R). */
    rsa_mont_mul(h, h, key + RSA_K_QINV(n), p, key[RSA_K_P0INV(n)], n);
    /* out = mq + h*q (< pq, so 2n limbs hold it). */
    for (int j = 0; j < 2 * n; j++) out[j] = j < n ? mq[j] : 0;
    for (int i = 0; i < n; i++) {
        c = 0;
        for (int j = 0; j < n; j++) {
            c = (rsa_u64)h[i] * q[j] + out[i + j] + (c >> 32);
            out[i + j] = (rsa_u32)c;
        }
        for (int j = i + n; j < 2 * n; j++) {
            c = (rsa_u64)out[j] + (c >> 32);
            out[j] = (rsa_u32)c;
        }
    }
}

/*
 * The RSA private-key operation with CRT for one request on one thread: out = in^d mod pq,
 * where `in` and `out` have 2n limbs and in < pq. key: a key record (see RSA_K_*).
 * work: RSA_WORK_WORDS(n).
 */
RSA_FN void rsa_crt(rsa_u32 *out, const rsa_u32 *in, const rsa_u32 *key, int n, rsa_u32 *work) {
    rsa_u32 *mp = work + RSA_HALF_WORK_WORDS(n);
    rsa_u32 *mq = mp + n;
    rsa_crt_half(mp, in, key, 0, n, work);
    rsa_crt_half(mq, in, key, 1, n, work);
    rsa_crt_combine(out, mp, mq, key, n, work);
}

#endif /* RSA_CORE_H */
