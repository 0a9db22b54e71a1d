/*
 * CUDA entry points around rsa_core.h (concatenated in front of this text by src/cuda.rs and
 * compiled by NVRTC at run time).
 *
 * Mapping: one thread per request. Every thread runs the whole CRT operation for its request
 * with n a compile-time constant (one kernel per key size, so loops unroll); requests of a batch
 * share the key table (few keys per batch). This is the simplest mapping and keeps the exact
 * code the host tests run; whether a few threads per request (limbs split across a warp, as in
 * SSLShader) is faster must be measured on a device (see README).
 */
/* The host emulation (emulate.cpp) is built once per window width and makes these static. */
#ifndef RSA_ENTRY_LINKAGE
#define RSA_ENTRY_LINKAGE extern "C"
#endif
#define RSA_KERNEL(N)                                                                          \
    RSA_ENTRY_LINKAGE __global__ void rsa_crt_batch_##N(rsa_u32 *out, const rsa_u32 *in,              \
                                                 const rsa_u32 *keys, const rsa_u32 *key_index, \
                                                 unsigned int count) {                          \
        unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;                                 \
        if (i >= count) return; /* count is public */                                          \
        rsa_u32 work[RSA_WORK_WORDS(N)];                                                       \
        rsa_crt(out + (rsa_u64)i * 2 * N, in + (rsa_u64)i * 2 * N,                             \
                keys + (rsa_u64)key_index[i] * RSA_KEY_WORDS(N), N, work);                     \
    }

RSA_KERNEL(32)
RSA_KERNEL(48)
RSA_KERNEL(64)
