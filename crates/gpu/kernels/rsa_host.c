/*
 * Host build of the kernel's arithmetic core (rsa_core.h), plus the one-time key preparation
 * and the public-exponent helpers the engine runs on the CPU (blinding set-up). Compiled by
 * build.rs; called from src/core.rs. Buffers are sized by the caller (see core.rs).
 */
#include "rsa_core.h"

/* 2^k mod m (m odd, m > 1): k doublings, each followed by one conditional subtraction. */
static void pow2_mod(uint32_t *r, int k, const uint32_t *m, int n) {
    for (int j = 0; j < n; j++) r[j] = 0;
    r[0] = 1;
    for (int i = 0; i < k; i++) {
        uint32_t carry = 0;
        for (int j = 0; j < n; j++) {
            uint32_t v = r[j];
            r[j] = (v << 1) | carry;
            carry = v >> 31;
        }
        rsa_reduce_once(r, r, carry, m, n);
    }
}

uint32_t rsa_host_neg_inv32(uint32_t m0) { return rsa_neg_inv32(m0); }

void rsa_host_pow2_mod(uint32_t *r, int k, const uint32_t *m, int n) { pow2_mod(r, k, m, n); }

void rsa_host_mont_mul(uint32_t *r, const uint32_t *a, const uint32_t *b, const uint32_t *m,
                       uint32_t m0inv, int n) {
    rsa_mont_mul(r, a, b, m, m0inv, n);
}

/*
 * Completes a key record whose p, q, dp, dq slots are filled and whose QINV slot holds q^-1 mod p
 * (plain): Montgomery constants, qinv*R mod p, exponent bit count.
 */
void rsa_host_prep_key(uint32_t *key, int n) {
    uint32_t rr[RSA_MAX_HALF];
    for (int half = 0; half < 2; half++) {
        const uint32_t *m = key + (half ? RSA_K_Q(n) : RSA_K_P(n));
        uint32_t m0inv = rsa_neg_inv32(m[0]);
        key[half ? RSA_K_Q0INV(n) : RSA_K_P0INV(n)] = m0inv;
        pow2_mod(key + (half ? RSA_K_ONE_Q(n) : RSA_K_ONE_P(n)), 32 * n, m, n);
        pow2_mod(rr, 64 * n, m, n);
        rsa_mont_mul(key + (half ? RSA_K_RRR_Q(n) : RSA_K_RRR_P(n)), rr, rr, m, m0inv, n);
        if (!half) /* qinv * R^2 * R^-1 = qinv * R mod p */
            rsa_mont_mul(key + RSA_K_QINV(n), key + RSA_K_QINV(n), rr, m, m0inv, n);
    }
    for (int j = 0; j < RSA_MAX_HALF; j++) rr[j] = 0;
}

/* The private-key operation for one request (the kernel's per-thread body). */
void rsa_host_crt(uint32_t *out, const uint32_t *in, const uint32_t *key, int n) {
    uint32_t work[RSA_WORK_WORDS(RSA_MAX_HALF)];
    rsa_crt(out, in, key, n, work);
    for (int j = 0; j < RSA_WORK_WORDS(RSA_MAX_HALF); j++) ((volatile uint32_t *)work)[j] = 0;
}

/*
 * r = a^e mod m for a public exponent e (square-and-multiply; branches on e are fine: public).
 * a < m; rr = R^2 mod m; r may not alias a.
 */
void rsa_host_exp_public(uint32_t *r, const uint32_t *a, uint64_t e, const uint32_t *m,
                         uint32_t m0inv, const uint32_t *rr, int n) {
    uint32_t am[RSA_MAX_LIMBS], unit[RSA_MAX_LIMBS];
    for (int j = 0; j < n; j++) unit[j] = 0;
    unit[0] = 1;
    rsa_mont_mul(am, a, rr, m, m0inv, n);
    rsa_mont_mul(r, unit, rr, m, m0inv, n); /* R mod m: one */
    for (int bit = 63; bit >= 0; bit--) {
        rsa_mont_mul(r, r, r, m, m0inv, n);
        if ((e >> bit) & 1) rsa_mont_mul(r, r, am, m, m0inv, n);
    }
    rsa_mont_mul(r, r, unit, m, m0inv, n);
}
