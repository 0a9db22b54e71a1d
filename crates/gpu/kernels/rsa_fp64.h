/*
 * FP64 arithmetic (-DRSA_FP64=1): a CRT half's exponentiation with 52-bit limbs held in
 * doubles, the limb products formed by the FP64 pipe's fused multiply-add; on one thread (two
 * threads per request) or over a group of lanes (8, 16, 32 threads per request, at the end of
 * this file). C++ (templates on the limb count); compiled by NVRTC after rsa_core.h and
 * rsa_group.h, and for the host by emulate.cpp.
 *
 * Why: an RSA-2048 signature on 32-bit limbs is about 10.6 M IMADs, and the IMAD pipe caps a
 * GPU at that count. A 1024-bit prime is 20 limbs of 52 bits instead of 32 of 32 bits: 400 limb
 * products per multiplication instead of 1,024, each two DFMAs and one DADD on the FP64 pipe
 * (as fast as the IMAD pipe on an H100) plus 64-bit integer additions on the integer pipe.
 *
 * A product a*b of two 52-bit integers (a, b < 2^52, exact in a double) splits exactly (the
 * technique of Emmart, Zheng and Weems, ARITH 2018):
 *   h = fma_rz(a, b, 2^104)           = 2^104 + H*2^52,  H = floor(a*b / 2^52)
 *   l = fma_rz(a, b, (2^104 + 2^52) - h) = 2^52 + L,     L = a*b - H*2^52 < 2^52
 * Both results keep their exponent, so their bit patterns are a constant plus H or L, and the
 * integer additions sum bit patterns. The constants are multiples of 2^52: the multiplications
 * remove them as a limb leaves the bottom of the accumulator (its count is known by then), the
 * squaring with each addition. Only h rounds (toward zero, as asked); every other FP64
 * operation here is exact, so the host emulation runs the whole launch in round-toward-zero
 * mode and computes what the device does. A row adds one product's low part and the previous
 * limb's high part into a limb (one three-input 64-bit addition) and keeps nothing else live.
 *
 * Montgomery multiplication is CIOS with R = 2^(52K): step i adds a*b_i and q*m (q chosen so
 * the lowest limb becomes a multiple of 2^52) into 64-bit accumulators and moves them down one
 * limb; on one thread b's limbs are read from memory (one load a step), a and m stay in
 * registers.
 *
 * Constant time as the 32-bit core: no branch or index depends on a secret; the window table
 * (in local memory) is scanned whole under a mask; every value is an integer, never subnormal.
 */
#ifndef RSA_FP64_H
#define RSA_FP64_H

#ifdef __CUDACC__
#define RSA_FFN __device__ __forceinline__ static
RSA_FFN double rsa_f_fma_rz(double a, double b, double c) { return __fma_rz(a, b, c); }
RSA_FFN rsa_u64 rsa_f_bits(double x) { return (rsa_u64)__double_as_longlong(x); }
RSA_FFN double rsa_f_double(rsa_u64 x) { return __longlong_as_double((long long)x); }
#else
#include <math.h>
#include <string.h>
#define RSA_FFN static inline
/* The emulator sets the rounding mode toward zero for the launch (emulate.cpp). */
RSA_FFN double rsa_f_fma_rz(double a, double b, double c) { return fma(a, b, c); }
RSA_FFN rsa_u64 rsa_f_bits(double x) {
    rsa_u64 u;
    memcpy(&u, &x, sizeof u);
    return u;
}
RSA_FFN double rsa_f_double(rsa_u64 x) {
    double d;
    memcpy(&d, &x, sizeof d);
    return d;
}
#endif

/* A loop the compiler must not unroll: the window table's scan, whose unrolled loads it would
 * otherwise hoist into registers (all 16 entries at once: 255 registers and spills). */
#ifdef __CUDACC__
#define RSA_ROLLED _Pragma("unroll 1")
#else
#define RSA_ROLLED
#endif

#define RSA_F_MASK52 0xfffffffffffffull
/* Bit patterns: 2^52 (whose mantissa field holds an integer below 2^52 added to it), 2^104
 * (likewise for multiples of 2^52), and 2^104 + 2^52. */
#define RSA_F_B52 0x4330000000000000ull
#define RSA_F_B104 0x4670000000000000ull
#define RSA_F_B104_52 0x4670000000000001ull
/* What a multiplication step's bit patterns add to a limb beyond its integers, mod 2^64: the
 * lowest limb gets two low halves, the top one two high halves, the others two of each. */
#define RSA_F_BIAS_LOW (2 * RSA_F_B52)
#define RSA_F_BIAS_MID (2 * RSA_F_B52 + 2 * RSA_F_B104)
#define RSA_F_BIAS_TOP (2 * RSA_F_B104)

/* Steps of a multiplication unrolled together (the accumulators move down a limb a step: in
 * an unrolled run that is renaming, between runs moves). */
#ifndef RSA_F_UNROLL
#define RSA_F_UNROLL 2
#endif

/* The one-thread kernel's squarings by rsa_f_mont_sqr (fewer products, more registers). */
#ifndef RSA_F_SQR
#define RSA_F_SQR 1
#endif

/* 52-bit limbs for a prime of N 32-bit limbs: enough for 32N bits. */
#define RSA_F_LIMBS(N) ((32 * (N) + 51) / 52)

/* An integer below 2^52 as a double (exact). */
RSA_FFN double rsa_f_of(rsa_u64 x) {
    return rsa_f_double(x | RSA_F_B52) - rsa_f_double(RSA_F_B52);
}

/* The bit patterns of a*b's high part (H + B104) and low part (L + B52). */
RSA_FFN void rsa_f_split(double a, double b, rsa_u64 *hi, rsa_u64 *lo) {
    double h = rsa_f_fma_rz(a, b, rsa_f_double(RSA_F_B104));
    double l = rsa_f_fma_rz(a, b, rsa_f_double(RSA_F_B104_52) - h);
    *hi = rsa_f_bits(h);
    *lo = rsa_f_bits(l);
}

/* t += a*b over L limbs, each product's low part at its limb and its high part one limb up;
 * returns the top product's high part, owed to the limb above t. Bit patterns (see the top). */
template <int L> RSA_FFN rsa_u64 rsa_f_row(rsa_u64 *t, const double *a, double b) {
    rsa_u64 h, l, up = 0;
    RSA_UNROLL for (int k = 0; k < L; k++) {
        rsa_f_split(a[k], b, &h, &l);
        t[k] += l + up;
        up = h;
    }
    return up;
}

/* -m^-1 mod 2^52 for odd m (m's lowest 64 bits; Newton: a fixed number of steps). */
RSA_FFN rsa_u64 rsa_f_neg_inv52(rsa_u64 m0) {
    rsa_u64 inv = 1;
    for (int i = 0; i < 6; i++) inv *= 2 - m0 * inv;
    return (0 - inv) & RSA_F_MASK52;
}

/* L 52-bit limbs, from limb `first`, of a number of N 32-bit limbs in x; each an integer in a
 * double. */
template <int N, int L> RSA_FFN void rsa_f_from32(double *out, const rsa_u32 *x, int first) {
    RSA_UNROLL for (int k = 0; k < L; k++) {
        int bit = 52 * (first + k), w = bit / 32, s = bit % 32;
        rsa_u64 v = 0;
        if (w < N) v = (rsa_u64)x[w] >> s;
        if (w + 1 < N) v |= (rsa_u64)x[w + 1] << (32 - s);
        if (s > 12 && w + 2 < N) v |= (rsa_u64)x[w + 2] << (64 - s);
        out[k] = rsa_f_of(v & RSA_F_MASK52);
    }
}

/* C 32-bit limbs, from limb `first`, of a number of K 52-bit limbs, limb k being limb(k) (an
 * integer below 2^52); the value must fit. */
template <int K, int C, class Limb>
RSA_FFN void rsa_f_to32(rsa_u32 *out, int first, const Limb &limb) {
    RSA_UNROLL for (int i = 0; i < C; i++) {
        int bit = 32 * (first + i), k = bit / 52, s = bit % 52;
        rsa_u64 v = limb(k) >> s;
        if (s > 20 && k + 1 < K) v |= limb(k + 1) << (52 - s);
        out[i] = (rsa_u32)v;
    }
}

/* dst = entry idx of a table of RSA_TABLE entries of L limbs, every entry read under a mask
 * (constant time in idx); the scan stays a loop (RSA_ROLLED). */
template <int L> RSA_FFN void rsa_f_select(double *dst, const double *table, rsa_u32 idx) {
    rsa_u64 sel[L];
    RSA_UNROLL for (int k = 0; k < L; k++) sel[k] = 0;
    RSA_ROLLED for (int e = 0; e < RSA_TABLE; e++) {
        rsa_u64 mask = (rsa_u64)0 - (rsa_u64)(rsa_ct_is_zero((rsa_u32)e ^ idx) & 1);
        RSA_UNROLL for (int k = 0; k < L; k++) sel[k] |= rsa_f_bits(table[e * L + k]) & mask;
    }
    RSA_UNROLL for (int k = 0; k < L; k++) dst[k] = rsa_f_double(sel[k]);
}

/*
 * The end of a multiplication: t (K limbs, not normalized, plus `top` above them; the value
 * below 2m < 2^(52K+1)) normalized to 52-bit limbs, m subtracted once under a mask when the
 * value is not below m; to r as doubles and to ri (may be null) as integers.
 */
template <int K>
RSA_FFN void rsa_f_settle(double *r, rsa_u64 *ri, rsa_u64 *t, rsa_u64 top, const double *m) {
    rsa_u64 c = 0;
    RSA_UNROLL for (int j = 0; j < K; j++) {
        rsa_u64 v = t[j] + c;
        c = v >> 52;
        t[j] = v & RSA_F_MASK52;
    }
    top += c;
    rsa_u64 d[K], borrow = 0;
    RSA_UNROLL for (int j = 0; j < K; j++) {
        rsa_u64 mj = rsa_f_bits(m[j] + rsa_f_double(RSA_F_B52)) & RSA_F_MASK52;
        rsa_u64 v = t[j] - mj - borrow;
        borrow = v >> 63;
        d[j] = v & RSA_F_MASK52;
    }
    /* keep t only when top == 0 and the subtraction borrowed (t < m). */
    rsa_u64 keep = (rsa_u64)0 - ((1 ^ (top & 1)) & borrow);
    RSA_UNROLL for (int j = 0; j < K; j++) {
        rsa_u64 v = (t[j] & keep) | (d[j] & ~keep);
        if (ri) ri[j] = v;
        r[j] = rsa_f_of(v);
    }
}

/*
 * Montgomery multiplication: r = a*b*R^-1 mod m, R = 2^(52K), for a, b < m (b's limbs read
 * from memory, bm); r < m, as doubles (r) and as integers (ri, may be null). r may alias a.
 */
template <int K>
RSA_FFN void rsa_f_mont_mul(double *r, rsa_u64 *ri, const double *a, const double *bm,
                            const double *m, rsa_u64 m0inv) {
    rsa_u64 t[K + 1];
    RSA_UNROLL for (int j = 0; j <= K; j++) t[j] = 0;
    /* The constants the bit patterns bring stay in the accumulators (mod 2^64) until a limb
     * leaves through the bottom, whose constant is then known: at step i the lowest limb has
     * been in the middle i times and at the bottom once. */
    rsa_u64 bottom = RSA_F_BIAS_LOW;
#ifdef __CUDACC__
#pragma unroll RSA_F_UNROLL
#endif
    for (int i = 0; i < K; i++) {
        t[K] += rsa_f_row<K>(t, a, bm[i]);
        /* Only t's lowest 52 bits matter for q, and the patterns' constants are multiples of
         * 2^52. */
        rsa_u64 q = (t[0] * m0inv) & RSA_F_MASK52;
        t[K] += rsa_f_row<K>(t, m, rsa_f_of(q));
        /* t[0] less its constant is a multiple of 2^52: move down one limb, keeping the carry. */
        rsa_u64 carry = (t[0] - bottom) >> 52;
        bottom += RSA_F_BIAS_MID;
        RSA_UNROLL for (int j = 0; j < K; j++) t[j] = t[j + 1];
        t[K] = 0;
        t[0] += carry;
    }
    /* Limb j has been at positions j+1 .. K: in the middle K-1-j times, at the top once. */
    RSA_UNROLL for (int j = 0; j < K; j++)
        t[j] -= (rsa_u64)(K - 1 - j) * RSA_F_BIAS_MID + RSA_F_BIAS_TOP;
    rsa_f_settle<K>(r, ri, t, 0, m);
}

/*
 * Montgomery squaring (-DRSA_F_SQR=1): r = a*a*R^-1 mod m for a < m; r may alias a. The square
 * first (each cross product a_i*a_j, i < j, once, then doubled; then the diagonal), then the
 * reduction: K(K+1)/2 + K^2 limb products instead of 2K^2. Fully unrolled, so the 2K-limb
 * square stays in registers; every addition takes its part's constant off with it (a
 * three-input addition with a constant is no dearer than one without), so the limbs hold true
 * values throughout.
 */
template <int K>
RSA_FFN void rsa_f_mont_sqr(double *r, const double *a, const double *m, rsa_u64 m0inv) {
    rsa_u64 w[2 * K + 1];
    RSA_UNROLL for (int p = 0; p <= 2 * K; p++) w[p] = 0;
    rsa_u64 h, l, up;
    /* Row i: a_i*a_j for j > i, low parts at i+j, high parts one limb up. */
    RSA_UNROLL for (int i = 0; i < K - 1; i++) {
        rsa_f_split(a[i], a[i + 1], &h, &l);
        w[2 * i + 1] += l - RSA_F_B52;
        up = h;
        RSA_UNROLL for (int j = i + 2; j < K; j++) {
            rsa_f_split(a[i], a[j], &h, &l);
            w[i + j] += l + up - (RSA_F_B52 + RSA_F_B104);
            up = h;
        }
        w[i + K] += up - RSA_F_B104;
    }
    RSA_UNROLL for (int p = 0; p < 2 * K; p++) w[p] += w[p];
    RSA_UNROLL for (int i = 0; i < K; i++) {
        rsa_f_split(a[i], a[i], &h, &l);
        w[2 * i] += l - RSA_F_B52;
        w[2 * i + 1] += h - RSA_F_B104;
    }
    /* Reduction: row i adds q_i*m at limb i, which makes limb i a multiple of 2^52; its carry
     * goes to limb i+1. */
    RSA_UNROLL for (int i = 0; i < K; i++) {
        rsa_u64 q = (w[i] * m0inv) & RSA_F_MASK52;
        double qd = rsa_f_of(q);
        rsa_f_split(m[0], qd, &h, &l);
        w[i] += l - RSA_F_B52;
        up = h;
        RSA_UNROLL for (int j = 1; j < K; j++) {
            rsa_f_split(m[j], qd, &h, &l);
            w[i + j] += l + up - (RSA_F_B52 + RSA_F_B104);
            up = h;
        }
        w[i + K] += up - RSA_F_B104;
        w[i + 1] += w[i] >> 52;
    }
    rsa_f_settle<K>(r, (rsa_u64 *)0, w + K, w[2 * K], m);
}

/*
 * One CRT half on one thread with FP64 arithmetic: res = (in mod m)^dm mod m as in
 * rsa_crt_half (rsa_core.h), whose 32-bit code brings the input into this arithmetic's
 * Montgomery form. With R32 = 2^(32N) and R = 2^(52K) = R32 * 2^E (32-bit Montgomery
 * products mont(a, b) = a*b*R32^-1):
 *   u = mont(R32^3, 1) = R32^2,  y = mont(2^E, u) = 2^E * R32 = R mod m (the form of 1),
 *   x = mont(mont(REDC(in), R32^3), y) = in * R32 * 2^E = in * R mod m.
 * `work`: RSA_HALF_WORK_WORDS(N) words of scratch for those 32-bit steps.
 */
template <int N>
RSA_FFN void rsa_f_crt_half(rsa_u32 *res, const rsa_u32 *in, const rsa_u32 *key, int half,
                            rsa_u32 *work) {
    const int K = RSA_F_LIMBS(N), E = 52 * RSA_F_LIMBS(N) - 32 * N;
    const rsa_u32 *m32 = key + (half ? RSA_K_Q(N) : RSA_K_P(N));
    rsa_u32 m0inv32 = key[half ? RSA_K_Q0INV(N) : RSA_K_P0INV(N)];
    const rsa_u32 *rrr = key + (half ? RSA_K_RRR_Q(N) : RSA_K_RRR_P(N));
    const rsa_u32 *exp = key + (half ? RSA_K_DQ(N) : RSA_K_DP(N));
    rsa_u32 *x = work, *y = work + N, *u = work + 2 * N;
    /* u = R32^2 mod m (R32^3 * 1 * R32^-1), then y = 2^E * R32^2 * R32^-1 = R mod m. */
    RSA_UNROLL for (int j = 0; j < N; j++) y[j] = 0;
    y[0] = 1;
    rsa_mont_mul(u, rrr, y, m32, m0inv32, N);
    y[0] = 0;
    y[E / 32] = (rsa_u32)1 << (E % 32);
    rsa_mont_mul(y, y, u, m32, m0inv32, N);
    /* x = in*R32 mod m as in rsa_crt_half, then x*y*R32^-1 = in*R mod m. */
    rsa_redc(x, in, m32, m0inv32, N);
    rsa_mont_mul(x, x, rrr, m32, m0inv32, N);
    rsa_mont_mul(x, x, y, m32, m0inv32, N);

    double m[K], r[K], b[K];
    rsa_f_from32<N, K>(m, m32, 0);
    rsa_u64 m0inv = rsa_f_neg_inv52((rsa_u64)m32[0] | ((rsa_u64)m32[1] << 32));
    /* The window table: x^e in Montgomery form for e < RSA_TABLE. */
    double table[RSA_TABLE * K], xm[K];
    rsa_f_from32<N, K>(table, y, 0);
    rsa_f_from32<N, K>(xm, x, 0);
    RSA_UNROLL for (int j = 0; j < K; j++) table[K + j] = xm[j];
    for (int e = 2; e < RSA_TABLE; e++)
        rsa_f_mont_mul<K>(table + e * K, (rsa_u64 *)0, table + (e - 1) * K, xm, m, m0inv);
    int pos = RSA_EXP_BITS(N) - RSA_WINDOW;
    rsa_f_select<K>(r, table, rsa_window(exp, pos));
    while (pos > 0) {
        pos -= RSA_WINDOW;
#ifdef __CUDACC__
#pragma unroll 1
#endif
        for (int s = 0; s < RSA_WINDOW; s++) {
#if RSA_F_SQR
            rsa_f_mont_sqr<K>(r, r, m, m0inv);
#else
            RSA_UNROLL for (int j = 0; j < K; j++) b[j] = r[j];
            rsa_f_mont_mul<K>(r, (rsa_u64 *)0, r, b, m, m0inv);
#endif
        }
        rsa_f_select<K>(b, table, rsa_window(exp, pos));
        rsa_f_mont_mul<K>(r, (rsa_u64 *)0, r, b, m, m0inv);
    }
    /* Out of the Montgomery domain: r * 1 * R^-1, fully reduced. */
    RSA_UNROLL for (int j = 0; j < K; j++) b[j] = 0;
    b[0] = 1;
    rsa_u64 ri[K];
    rsa_f_mont_mul<K>(r, ri, r, b, m, m0inv);
    rsa_f_to32<K, N>(res, 0, [&](int k) { return ri[k]; });
}

#ifdef RSA_GROUP_H
/*
 * The group mapping (-DRSA_FP64=1 with 8, 16 or 32 threads per request): one CRT half over a
 * group of G lanes as in rsa_group.h, each lane holding L = K/G of the K 52-bit limbs (K rounded
 * up to a multiple of G; the spare limbs of m are zero). Step j of the multiplication
 * broadcasts b's limb j and q (two 32-bit shuffles each) and moves the accumulator down one
 * limb (each lane takes the next lane's lowest); the high parts of a lane's top products wait
 * in `over` for the limb that moves into its top. Carries between lanes are settled once per
 * multiplication, with ballots as in rsa_g_settle.
 */

/* 52-bit limbs of a group kernel's numbers: RSA_F_LIMBS rounded up to whole lanes. */
#define RSA_FG_LIMBS(N, G) ((RSA_F_LIMBS(N) + (G) - 1) / (G) * (G))

template <int G> RSA_FFN rsa_u64 rsa_fg_shfl(rsa_u64 v, int src) {
    rsa_u32 lo = rsa_g_shfl<G>((rsa_u32)v, src);
    rsa_u32 hi = rsa_g_shfl<G>((rsa_u32)(v >> 32), src);
    return ((rsa_u64)hi << 32) | lo;
}

/* Normalizes this lane's L limbs (52 bits each) with `in` added at the bottom; returns the
 * carry out of its top. */
template <int L> RSA_FFN rsa_u64 rsa_fg_carry(rsa_u64 *t, rsa_u64 in) {
    rsa_u64 c = in;
    RSA_UNROLL for (int k = 0; k < L; k++) {
        rsa_u64 v = t[k] + c;
        c = v >> 52;
        t[k] = v & RSA_F_MASK52;
    }
    return c;
}

/* Settles carries between lanes (each lane's `carry` is owed to the next lane's lowest limb)
 * and returns what leaves the top lane: a carry into each lane, then a generate/propagate
 * ballot for the 0-or-1 carries that remain. */
template <int L, int G> RSA_FFN rsa_u64 rsa_fg_settle(rsa_u64 *t, rsa_u64 carry, int lane) {
    rsa_u64 in = rsa_fg_shfl<G>(carry, (lane + G - 1) & (G - 1));
    in = lane == 0 ? 0 : in;
    rsa_u64 top = rsa_fg_shfl<G>(carry, G - 1);
    rsa_u64 c = rsa_fg_carry<L>(t, in);
    rsa_u64 ones = RSA_F_MASK52;
    RSA_UNROLL for (int k = 0; k < L; k++) ones &= t[k];
    rsa_u64 g = rsa_g_ballot<G>((int)c), p = rsa_g_ballot<G>(ones == RSA_F_MASK52);
    rsa_u64 sum = (g << 1) + p;
    rsa_fg_carry<L>(t, ((sum ^ p) >> lane) & 1);
    return top + ((sum >> G) & 1);
}

/* Group Montgomery multiplication: r = a*b*R^-1 mod m, R = 2^(52K), for a, b < m, this
 * lane's L limbs of each; r < m, as doubles (r) and integers (ri, may be null). r may alias a
 * or b. */
template <int K, int G>
RSA_FFN void rsa_fg_mont_mul(double *r, rsa_u64 *ri, const double *a, const double *b,
                             const double *m, rsa_u64 m0inv, int lane) {
    const int L = K / G;
    rsa_u64 t[K / G], over = 0;
    RSA_UNROLL for (int k = 0; k < L; k++) t[k] = 0;
    rsa_u64 bottom = RSA_F_BIAS_LOW; /* lane 0's lowest limb's constant, as in rsa_f_mont_mul */
    for (int s = 0; s < G; s++) {
        RSA_UNROLL for (int j = 0; j < L; j++) {
            double bi = rsa_f_double(rsa_fg_shfl<G>(rsa_f_bits(b[j]), s));
            over += rsa_f_row<L>(t, a, bi);
            rsa_u64 q = rsa_fg_shfl<G>((t[0] * m0inv) & RSA_F_MASK52, 0);
            over += rsa_f_row<L>(t, m, rsa_f_of(q));
            rsa_u64 low = rsa_fg_shfl<G>(t[0], (lane + 1) & (G - 1));
            low = lane == G - 1 ? 0 : low;
            rsa_u64 carry = lane == 0 ? (t[0] - bottom) >> 52 : 0;
            bottom += RSA_F_BIAS_MID;
            RSA_UNROLL for (int k = 0; k < L - 1; k++) t[k] = t[k + 1];
            t[L - 1] = low + over;
            over = 0;
            t[0] += carry;
        }
    }
    /* Limb p = lane*L + k has been at positions p+1 .. K (see rsa_f_mont_mul). */
    RSA_UNROLL for (int k = 0; k < L; k++)
        t[k] -= (rsa_u64)(K - 1 - (lane * L + k)) * RSA_F_BIAS_MID + RSA_F_BIAS_TOP;
    rsa_u64 c = rsa_fg_carry<L>(t, 0);
    rsa_u64 top = rsa_fg_settle<L, G>(t, c, lane);
    /* t - m, borrows between lanes settled as in rsa_g_sub; keep t when it was below m. */
    rsa_u64 d[K / G], borrow = 0, any = 0;
    RSA_UNROLL for (int k = 0; k < L; k++) {
        rsa_u64 mk = rsa_f_bits(m[k] + rsa_f_double(RSA_F_B52)) & RSA_F_MASK52;
        rsa_u64 v = t[k] - mk - borrow;
        borrow = v >> 63;
        d[k] = v & RSA_F_MASK52;
        any |= d[k];
    }
    rsa_u64 g = rsa_g_ballot<G>((int)borrow), p = rsa_g_ballot<G>(any == 0);
    rsa_u64 sum = (g << 1) + p;
    rsa_u64 in = ((sum ^ p) >> lane) & 1;
    RSA_UNROLL for (int k = 0; k < L; k++) {
        rsa_u64 v = d[k] - in;
        in = v >> 63;
        d[k] = v & RSA_F_MASK52;
    }
    rsa_u64 below = (sum >> G) & 1;
    rsa_u64 keep = (rsa_u64)0 - ((1 ^ (top & 1)) & below);
    RSA_UNROLL for (int k = 0; k < L; k++) {
        rsa_u64 v = (t[k] & keep) | (d[k] & ~keep);
        if (ri) ri[k] = v;
        r[k] = rsa_f_of(v);
    }
}

/*
 * One CRT half over a group with FP64 arithmetic: res (this lane's N/G 32-bit limbs) =
 * (in mod m)^dm mod m, as rsa_g_crt_half. The 32-bit group code brings the input into the
 * FP64 Montgomery form as rsa_f_crt_half does; numbers change limb size through `stage`
 * (2K words of shared memory for this group), with a block barrier on each side, so every
 * thread of the block must call this.
 */
template <int N, int G>
RSA_FFN void rsa_fg_crt_half(rsa_u32 *res, const rsa_u32 *in, const rsa_u32 *key, int half,
                             int lane, rsa_u32 *stage) {
    const int L32 = N / G, K = RSA_FG_LIMBS(N, G), L = K / G, E = 52 * K - 32 * N;
    const rsa_u32 *mk = key + (half ? RSA_K_Q(N) : RSA_K_P(N));
    const rsa_u32 *rrr = key + (half ? RSA_K_RRR_Q(N) : RSA_K_RRR_P(N));
    const rsa_u32 *exp = key + (half ? RSA_K_DQ(N) : RSA_K_DP(N));
    rsa_u32 m0inv32 = key[half ? RSA_K_Q0INV(N) : RSA_K_P0INV(N)];
    rsa_u32 m32[N / G], x[N / G], y[N / G], r32[N / G];
    RSA_UNROLL for (int k = 0; k < L32; k++) m32[k] = mk[lane * L32 + k];
    rsa_g_input<N, G>(x, r32, in, m32, m0inv32, rrr, lane); /* in*R32 mod m, R32^2 mod m */
    /* y = 2^E * R32 = R mod m; x = in*R mod m. */
    RSA_UNROLL for (int k = 0; k < L32; k++)
        y[k] = lane * L32 + k == E / 32 ? (rsa_u32)1 << (E % 32) : 0;
    rsa_g_mont_mul<N, G>(y, y, r32, m32, m0inv32, lane);
    rsa_g_mont_mul<N, G>(x, x, y, m32, m0inv32, lane);

    double m[K / G], xm[K / G], rr[K / G], b[K / G];
    rsa_f_from32<N, L>(m, mk, lane * L);
    rsa_u64 m0inv = rsa_f_neg_inv52((rsa_u64)mk[0] | ((rsa_u64)mk[1] << 32));
    /* x and y to this group's stage, each lane's 52-bit limbs from it. */
    double table[RSA_TABLE * (K / G)];
    RSA_UNROLL for (int k = 0; k < L32; k++) stage[lane * L32 + k] = y[k];
    __syncthreads();
    rsa_f_from32<N, L>(table, stage, lane * L);
    __syncthreads();
    RSA_UNROLL for (int k = 0; k < L32; k++) stage[lane * L32 + k] = x[k];
    __syncthreads();
    rsa_f_from32<N, L>(xm, stage, lane * L);
    __syncthreads();
    RSA_UNROLL for (int k = 0; k < L; k++) table[L + k] = xm[k];
    for (int e = 2; e < RSA_TABLE; e++) {
        RSA_UNROLL for (int k = 0; k < L; k++) rr[k] = table[(e - 1) * L + k];
        rsa_fg_mont_mul<K, G>(rr, (rsa_u64 *)0, rr, xm, m, m0inv, lane);
        RSA_UNROLL for (int k = 0; k < L; k++) table[e * L + k] = rr[k];
    }
    int pos = RSA_EXP_BITS(N) - RSA_WINDOW;
    rsa_f_select<L>(rr, table, rsa_window(exp, pos));
    while (pos > 0) {
        pos -= RSA_WINDOW;
        for (int s = 0; s < RSA_WINDOW; s++)
            rsa_fg_mont_mul<K, G>(rr, (rsa_u64 *)0, rr, rr, m, m0inv, lane);
        rsa_f_select<L>(b, table, rsa_window(exp, pos));
        rsa_fg_mont_mul<K, G>(rr, (rsa_u64 *)0, rr, b, m, m0inv, lane);
    }
    /* Out of the Montgomery domain, fully reduced; then to 32-bit limbs through the stage. */
    RSA_UNROLL for (int k = 0; k < L; k++) b[k] = 0;
    b[0] = lane == 0 ? 1.0 : 0.0;
    rsa_u64 ri[K / G];
    rsa_fg_mont_mul<K, G>(rr, ri, rr, b, m, m0inv, lane);
    /* Each 52-bit limb as two 32-bit words (low first): the stage holds 2K words. */
    RSA_UNROLL for (int k = 0; k < L; k++) {
        stage[2 * (lane * L + k)] = (rsa_u32)ri[k];
        stage[2 * (lane * L + k) + 1] = (rsa_u32)(ri[k] >> 32);
    }
    __syncthreads();
    rsa_f_to32<K, L32>(res, lane * L32, [&](int k) {
        return (rsa_u64)stage[2 * k] | ((rsa_u64)stage[2 * k + 1] << 32);
    });
}
#endif /* RSA_GROUP_H */

#endif /* RSA_FP64_H */
