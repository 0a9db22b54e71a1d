/*
 * Group arithmetic: one CRT half's exponentiation spread over a group of G threads (lanes) of
 * one warp, G = 4, 8 or 16. Every number mod a prime of N limbs is held L = N / G limbs per lane
 * (lane k: limbs kL .. kL+L-1), in registers. C++ (templates on N and G); compiled by NVRTC
 * after rsa_core.h, and for the host by emulate.cpp, where the warp intrinsics are emulated.
 *
 * Montgomery multiplication is CIOS across the group: step i broadcasts limb i of b from its
 * lane (shuffle), every lane adds a*b_i and q*m to its own limbs (q from lane 0's lowest limb,
 * broadcast), and the accumulator moves down one limb (each lane takes the lowest limb of the
 * lane above). The word a lane carries out of its top limb stays with that lane: after the move
 * it belongs exactly at that lane's new top limb. Carries between lanes are settled once per
 * multiplication with two ballots (generate/propagate, as a carry-lookahead adder).
 *
 * Constant time as the one-thread core: no branch or index depends on a secret; every lane
 * runs the same instructions (shuffles and ballots need all lanes of the warp); the window
 * table is scanned whole under a mask.
 */
#ifndef RSA_GROUP_H
#define RSA_GROUP_H

#ifdef __CUDACC__
#define RSA_GFN __device__ __forceinline__ static
#else
#define RSA_GFN static inline
#endif

/* Carry-chain PTX (mad.lo.cc / madc.hi.cc) in the multiply-accumulate rows: -DRSA_PTX=1 (CUDA
 * only; the host build runs the portable rows, and the device self-check compares the two). */
#ifndef RSA_PTX
#define RSA_PTX 0
#endif

/* Value of lane `src` of this lane's group. */
template <int G> RSA_GFN rsa_u32 rsa_g_shfl(rsa_u32 v, int src) {
    return __shfl_sync(0xffffffffu, v, src, G);
}

/* Bit j: predicate of lane j of this lane's group. */
template <int G> RSA_GFN rsa_u32 rsa_g_ballot(int pred) {
    unsigned int first = (threadIdx.x & 31u) & ~(unsigned int)(G - 1);
    return (__ballot_sync(0xffffffffu, pred) >> first) & (rsa_u32)((1ull << G) - 1);
}

/* t += a*b over L limbs; returns the word carried out of t's top limb (t + a*b < 2^(32(L+1))). */
template <int L> RSA_GFN rsa_u32 rsa_g_row(rsa_u32 *t, const rsa_u32 *a, rsa_u32 b) {
#if defined(__CUDACC__) && RSA_PTX
    rsa_u32 c;
    /* Low halves with one carry chain, then high halves one limb up with another. */
    asm volatile("mad.lo.cc.u32 %0, %1, %2, %0;" : "+r"(t[0]) : "r"(a[0]), "r"(b));
    RSA_UNROLL for (int k = 1; k < L; k++)
        asm volatile("madc.lo.cc.u32 %0, %1, %2, %0;" : "+r"(t[k]) : "r"(a[k]), "r"(b));
    asm volatile("addc.u32 %0, 0, 0;" : "=r"(c));
    if (L == 1) {
        asm volatile("mad.hi.u32 %0, %1, %2, %0;" : "+r"(c) : "r"(a[0]), "r"(b));
    } else {
        asm volatile("mad.hi.cc.u32 %0, %1, %2, %0;" : "+r"(t[1]) : "r"(a[0]), "r"(b));
        RSA_UNROLL for (int k = 1; k < L - 1; k++)
            asm volatile("madc.hi.cc.u32 %0, %1, %2, %0;" : "+r"(t[k + 1]) : "r"(a[k]), "r"(b));
        asm volatile("madc.hi.u32 %0, %1, %2, %0;" : "+r"(c) : "r"(a[L - 1]), "r"(b));
    }
    return c;
#else
    rsa_u64 c = 0;
    RSA_UNROLL for (int k = 0; k < L; k++) {
        c = (rsa_u64)a[k] * b + t[k] + (c >> 32);
        t[k] = (rsa_u32)c;
    }
    return (rsa_u32)(c >> 32);
#endif
}

/*
 * Settles carries between lanes: each lane's `carry` is owed to the limb just above its top
 * one (the next lane's lowest); adds them in and returns what leaves the top lane (the same on
 * every lane). After the first addition a lane's carry out is 0 or 1; with g (lanes that
 * carried out) and p (lanes of all ones, which pass a carry on) as bit masks, the carries into
 * the lanes are ((g << 1) + p) ^ p, bit G the carry out of the group.
 */
template <int N, int G> RSA_GFN rsa_u32 rsa_g_settle(rsa_u32 *t, rsa_u32 carry, int lane) {
    const int L = N / G;
    rsa_u32 in = rsa_g_shfl<G>(carry, (lane + G - 1) & (G - 1));
    in = lane == 0 ? 0 : in;
    rsa_u32 top = rsa_g_shfl<G>(carry, G - 1);
    rsa_u64 c = in;
    rsa_u32 ones = 0xffffffffu;
    RSA_UNROLL for (int k = 0; k < L; k++) {
        c += t[k];
        t[k] = (rsa_u32)c;
        c >>= 32;
        ones &= t[k];
    }
    rsa_u64 g = rsa_g_ballot<G>((int)c), p = rsa_g_ballot<G>(ones == 0xffffffffu);
    rsa_u64 sum = (g << 1) + p;
    c = ((sum ^ p) >> lane) & 1;
    RSA_UNROLL for (int k = 0; k < L; k++) {
        c += t[k];
        t[k] = (rsa_u32)c;
        c >>= 32;
    }
    return top + (rsa_u32)((sum >> G) & 1);
}

/* d = a - b; returns the group's borrow (1 when a < b), the same on every lane. Borrows between
 * lanes are settled as carries in rsa_g_settle (p: lanes whose difference is zero, which pass a
 * borrow on). d may alias a or b. */
template <int N, int G>
RSA_GFN rsa_u32 rsa_g_sub(rsa_u32 *d, const rsa_u32 *a, const rsa_u32 *b, int lane) {
    const int L = N / G;
    rsa_u32 borrow = 0, any = 0;
    RSA_UNROLL for (int k = 0; k < L; k++) {
        rsa_u64 s = (rsa_u64)a[k] - b[k] - borrow;
        d[k] = (rsa_u32)s;
        borrow = (rsa_u32)(s >> 63);
        any |= d[k];
    }
    rsa_u64 g = rsa_g_ballot<G>((int)borrow), p = rsa_g_ballot<G>(any == 0);
    rsa_u64 sum = (g << 1) + p;
    rsa_u32 in = (rsa_u32)((sum ^ p) >> lane) & 1;
    RSA_UNROLL for (int k = 0; k < L; k++) {
        rsa_u64 s = (rsa_u64)d[k] - in;
        d[k] = (rsa_u32)s;
        in = (rsa_u32)(s >> 63);
    }
    return (rsa_u32)(sum >> G) & 1;
}

/* r = t - m when (top:t) >= m, else t; requires (top:t) < 2m. r may alias t. */
template <int N, int G>
RSA_GFN void rsa_g_reduce(rsa_u32 *r, const rsa_u32 *t, rsa_u32 top, const rsa_u32 *m, int lane) {
    const int L = N / G;
    rsa_u32 d[N / G];
    rsa_u32 below = rsa_g_sub<N, G>(d, t, m, lane);
    rsa_u32 keep = (rsa_u32)0 - ((1u ^ (top & 1u)) & below);
    RSA_UNROLL for (int k = 0; k < L; k++) r[k] = (t[k] & keep) | (d[k] & ~keep);
}

/*
 * Montgomery multiplication across the group: r = a*b*R^-1 mod m with a < m and b < R (b need
 * not be reduced: the accumulator stays below a + m < 2m); r < m. r may alias a or b.
 */
template <int N, int G>
RSA_GFN void rsa_g_mont_mul(rsa_u32 *r, const rsa_u32 *a, const rsa_u32 *b, const rsa_u32 *m,
                            rsa_u32 m0inv, int lane) {
    const int L = N / G;
    rsa_u32 t[N / G];
    RSA_UNROLL for (int k = 0; k < L; k++) t[k] = 0;
    rsa_u32 carry = 0; /* owed to the limb above this lane's top one; at most 3 */
    for (int s = 0; s < G; s++) {
        RSA_UNROLL for (int j = 0; j < L; j++) {
            rsa_u32 bi = rsa_g_shfl<G>(b[j], s); /* limb sL + j of b */
            rsa_u32 c1 = rsa_g_row<N / G>(t, a, bi);
            rsa_u32 q = rsa_g_shfl<G>(t[0], 0) * m0inv;
            rsa_u32 c2 = rsa_g_row<N / G>(t, m, q); /* lane 0's lowest limb is now 0 */
            rsa_u32 low = rsa_g_shfl<G>(t[0], (lane + 1) & (G - 1));
            low = lane == G - 1 ? 0 : low;
            RSA_UNROLL for (int k = 0; k < L - 1; k++) t[k] = t[k + 1];
            rsa_u64 sum = (rsa_u64)low + carry + c1 + c2;
            t[L - 1] = (rsa_u32)sum;
            carry = (rsa_u32)(sum >> 32);
        }
    }
    rsa_u32 top = rsa_g_settle<N, G>(t, carry, lane);
    rsa_g_reduce<N, G>(r, t, top, m, lane);
}

/* r = a + b mod m for a, b < m. */
template <int N, int G>
RSA_GFN void rsa_g_add_mod(rsa_u32 *r, const rsa_u32 *a, const rsa_u32 *b, const rsa_u32 *m,
                           int lane) {
    const int L = N / G;
    rsa_u32 t[N / G];
    rsa_u64 c = 0;
    RSA_UNROLL for (int k = 0; k < L; k++) {
        c += (rsa_u64)a[k] + b[k];
        t[k] = (rsa_u32)c;
        c >>= 32;
    }
    rsa_u32 top = rsa_g_settle<N, G>(t, (rsa_u32)c, lane);
    rsa_g_reduce<N, G>(r, t, top, m, lane);
}

/* r = a - b mod m for a, b < m: the difference, plus m under a mask when it borrowed. */
template <int N, int G>
RSA_GFN void rsa_g_sub_mod(rsa_u32 *r, const rsa_u32 *a, const rsa_u32 *b, const rsa_u32 *m,
                           int lane) {
    const int L = N / G;
    rsa_u32 mask = (rsa_u32)0 - rsa_g_sub<N, G>(r, a, b, lane);
    rsa_u64 c = 0;
    RSA_UNROLL for (int k = 0; k < L; k++) {
        c += (rsa_u64)r[k] + (m[k] & mask);
        r[k] = (rsa_u32)c;
        c >>= 32;
    }
    rsa_g_settle<N, G>(r, (rsa_u32)c, lane); /* what leaves the top is the borrow, paid back */
}

/*
 * out = c + h*q (2N limbs, c + h*q < 2^(64N)) with h, q, c this lane's limbs. The product runs
 * as the Montgomery loop without reduction: limb i is final in lane 0's lowest limb at step i,
 * where lane 0 stores it; the high N limbs are stored by their lanes at the end. Stored only
 * when `store` (every lane runs every step either way).
 */
template <int N, int G>
RSA_GFN void rsa_g_mul_add_store(rsa_u32 *out, const rsa_u32 *h, const rsa_u32 *q,
                                 const rsa_u32 *c, int lane, int store) {
    const int L = N / G;
    rsa_u32 t[N / G];
    RSA_UNROLL for (int k = 0; k < L; k++) t[k] = c[k];
    rsa_u32 carry = 0;
    for (int s = 0; s < G; s++) {
        RSA_UNROLL for (int j = 0; j < L; j++) {
            rsa_u32 hi = rsa_g_shfl<G>(h[j], s);
            rsa_u32 c1 = rsa_g_row<N / G>(t, q, hi);
            if (store && lane == 0) out[s * L + j] = t[0];
            rsa_u32 low = rsa_g_shfl<G>(t[0], (lane + 1) & (G - 1));
            low = lane == G - 1 ? 0 : low;
            RSA_UNROLL for (int k = 0; k < L - 1; k++) t[k] = t[k + 1];
            rsa_u64 sum = (rsa_u64)low + carry + c1;
            t[L - 1] = (rsa_u32)sum;
            carry = (rsa_u32)(sum >> 32);
        }
    }
    rsa_g_settle<N, G>(t, carry, lane);
    if (store)
        RSA_UNROLL for (int k = 0; k < L; k++) out[N + lane * L + k] = t[k];
}

/*
 * CRT recombination across a group: out = mq + h*q with h = (mp - mq) * qinv mod p; mp, mq
 * this lane's limbs; out 2N limbs, stored when `store`.
 */
template <int N, int G>
RSA_GFN void rsa_g_combine(rsa_u32 *out, const rsa_u32 *mp, const rsa_u32 *mq, const rsa_u32 *key,
                           int lane, int store) {
    const int L = N / G;
    rsa_u32 p[N / G], q[N / G], qinv[N / G], h[N / G];
    RSA_UNROLL for (int k = 0; k < L; k++) {
        p[k] = key[RSA_K_P(N) + lane * L + k];
        q[k] = key[RSA_K_Q(N) + lane * L + k];
        qinv[k] = key[RSA_K_QINV(N) + lane * L + k];
    }
    rsa_g_reduce<N, G>(h, mq, 0, p, lane); /* mq < q < 2p: mq mod p */
    rsa_g_sub_mod<N, G>(h, mp, h, p, lane);
    rsa_g_mont_mul<N, G>(h, qinv, h, p, key[RSA_K_P0INV(N)], lane); /* qinv is stored times R */
    rsa_g_mul_add_store<N, G>(out, h, q, mq, lane, store);
}

/* out = entry idx of a table of RSA_TABLE entries of L limbs per lane, entry e's limb k at
 * tab[(e*L + k) * stride]; every entry read, under a mask (constant time in idx). */
template <int L>
RSA_GFN void rsa_g_select(rsa_u32 *out, const rsa_u32 *tab, int stride, rsa_u32 idx) {
    RSA_UNROLL for (int k = 0; k < L; k++) out[k] = 0;
    for (int e = 0; e < RSA_TABLE; e++) {
        rsa_u32 mask = rsa_ct_is_zero((rsa_u32)e ^ idx);
        RSA_UNROLL for (int k = 0; k < L; k++) out[k] |= tab[(e * L + k) * stride] & mask;
    }
}

/*
 * The Montgomery form of a CRT half's input across the group: x = in*R mod m, where `in` has
 * 2N limbs (in < pq, read by every lane), and rr = R^2 mod m, this lane's limbs of each; m and
 * m0inv this lane's, rrr the key's R^3 mod m (every lane's limbs).
 */
template <int N, int G>
RSA_GFN void rsa_g_input(rsa_u32 *x, rsa_u32 *rr, const rsa_u32 *in, const rsa_u32 *m,
                         rsa_u32 m0inv, const rsa_u32 *rrr, int lane) {
    const int L = N / G;
    rsa_u32 y[N / G], u[N / G];
    RSA_UNROLL for (int k = 0; k < L; k++) {
        u[k] = rrr[lane * L + k];
        y[k] = 0;
    }
    y[0] = lane == 0 ? 1 : 0;
    /* R^2 = R^3 * 1 * R^-1; then in = lo + hi*R gives in*R = lo*R^2*R^-1 + hi*R^3*R^-1. */
    rsa_g_mont_mul<N, G>(rr, u, y, m, m0inv, lane);
    RSA_UNROLL for (int k = 0; k < L; k++) {
        x[k] = in[lane * L + k];
        y[k] = in[N + lane * L + k];
    }
    rsa_g_mont_mul<N, G>(x, rr, x, m, m0inv, lane);
    rsa_g_mont_mul<N, G>(y, u, y, m, m0inv, lane);
    rsa_g_add_mod<N, G>(x, x, y, m, lane);
}

/*
 * One CRT half across the group: res = (in mod m)^dm mod m with (m, dm) = (p, dp) for half 0,
 * (q, dq) for half 1; `in` has 2N limbs (in < pq, read by every lane), res this lane's L limbs.
 * tab: this lane's window table, entry e's limb k at tab[(e*L + k) * stride] (a local array
 * with stride 1, or shared memory interleaved across the block's threads).
 */
template <int N, int G>
RSA_GFN void rsa_g_crt_half(rsa_u32 *res, const rsa_u32 *in, const rsa_u32 *key, int half,
                            int lane, rsa_u32 *tab, int stride) {
    const int L = N / G;
    const rsa_u32 *mk = key + (half ? RSA_K_Q(N) : RSA_K_P(N));
    const rsa_u32 *rrr = key + (half ? RSA_K_RRR_Q(N) : RSA_K_RRR_P(N));
    const rsa_u32 *one = key + (half ? RSA_K_ONE_Q(N) : RSA_K_ONE_P(N));
    const rsa_u32 *exp = key + (half ? RSA_K_DQ(N) : RSA_K_DP(N));
    rsa_u32 m0inv = key[half ? RSA_K_Q0INV(N) : RSA_K_P0INV(N)];
    rsa_u32 m[N / G], x[N / G], y[N / G], u[N / G], r[N / G];
    RSA_UNROLL for (int k = 0; k < L; k++) m[k] = mk[lane * L + k];
    rsa_g_input<N, G>(x, r, in, m, m0inv, rrr, lane); /* in mod m, Montgomery form */
    /* Window table: x^e in Montgomery form for e < RSA_TABLE. */
    RSA_UNROLL for (int k = 0; k < L; k++) {
        r[k] = one[lane * L + k];
        tab[k * stride] = r[k];
    }
    for (int e = 1; e < RSA_TABLE; e++) {
        rsa_g_mont_mul<N, G>(r, x, r, m, m0inv, lane);
        RSA_UNROLL for (int k = 0; k < L; k++) tab[(e * L + k) * stride] = r[k];
    }
    int pos = RSA_EXP_BITS(N) - RSA_WINDOW;
    rsa_g_select<N / G>(r, tab, stride, rsa_window(exp, pos));
    while (pos > 0) {
        pos -= RSA_WINDOW;
        for (int s = 0; s < RSA_WINDOW; s++) rsa_g_mont_mul<N, G>(r, r, r, m, m0inv, lane);
        rsa_g_select<N / G>(y, tab, stride, rsa_window(exp, pos));
        rsa_g_mont_mul<N, G>(r, r, y, m, m0inv, lane);
    }
    RSA_UNROLL for (int k = 0; k < L; k++) u[k] = 0;
    u[0] = lane == 0 ? 1 : 0;
    rsa_g_mont_mul<N, G>(res, r, u, m, m0inv, lane); /* out of the Montgomery domain */
}

#endif /* RSA_GROUP_H */
