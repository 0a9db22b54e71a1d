/*
 * CUDA entry points around rsa_core.h (concatenated in front of this text by src/cuda.rs and
 * compiled by NVRTC at run time).
 *
 * Mapping: one thread per request (RSA_SPLIT=1), or two (RSA_SPLIT=2, one per CRT half), with
 * n a compile-time constant (one kernel per key size, so loops unroll); requests of a batch
 * share the key table (few keys per batch). Both run the host-tested functions of rsa_core.h;
 * docs/benchmarks.md has what each mapping measured on a device.
 */
/* The host emulation (emulate.cpp) is built once per window width and makes these static. */
#ifndef RSA_ENTRY_LINKAGE
#define RSA_ENTRY_LINKAGE extern "C"
#endif
/* Threads per request: 1 (the whole operation on one thread), or 2 (-DRSA_SPLIT=2: the CRT
 * halves on neighbouring threads, mq handed over in shared memory, the even thread combines). */
#ifndef RSA_SPLIT
#define RSA_SPLIT 1
#endif
/* Largest block the split kernel's shared hand-over is sized for (the host checks launches). */
#define RSA_MAX_BLOCK 256

#if RSA_SPLIT == 1
#define RSA_KERNEL(N)                                                                          \
    RSA_ENTRY_LINKAGE __global__ void rsa_crt_batch_##N(rsa_u32 *out, const rsa_u32 *in,       \
                                                        const rsa_u32 *keys,                   \
                                                        const rsa_u32 *key_index,              \
                                                        unsigned int count) {                  \
        unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;                                 \
        if (i >= count) return; /* count is public */                                          \
        rsa_u32 work[RSA_WORK_WORDS(N)];                                                       \
        rsa_crt(out + (rsa_u64)i * 2 * N, in + (rsa_u64)i * 2 * N,                             \
                keys + (rsa_u64)key_index[i] * RSA_KEY_WORDS(N), N, work);                     \
    }
#elif RSA_SPLIT == 2
#define RSA_KERNEL(N)                                                                          \
    RSA_ENTRY_LINKAGE __global__ void rsa_crt_batch_##N(rsa_u32 *out, const rsa_u32 *in,       \
                                                        const rsa_u32 *keys,                   \
                                                        const rsa_u32 *key_index,              \
                                                        unsigned int count) {                  \
        __shared__ rsa_u32 mq_shared[(RSA_MAX_BLOCK / 2) * N];                                 \
        unsigned int slot = threadIdx.x >> 1, half = threadIdx.x & 1;                          \
        unsigned int i = blockIdx.x * (blockDim.x >> 1) + slot;                                \
        int active = i < count; /* public; every thread reaches the barrier */                \
        rsa_u32 work[RSA_HALF_WORK_WORDS(N) + N];                                              \
        rsa_u32 *res = work + RSA_HALF_WORK_WORDS(N);                                          \
        const rsa_u32 *key = keys + (rsa_u64)(active ? key_index[i] : 0) * RSA_KEY_WORDS(N);   \
        if (active) rsa_crt_half(res, in + (rsa_u64)i * 2 * N, key, (int)half, N, work);       \
        if (active && half)                                                                    \
            for (int j = 0; j < N; j++) mq_shared[slot * N + j] = res[j];                      \
        __syncthreads();                                                                       \
        if (active && !half)                                                                   \
            rsa_crt_combine(out + (rsa_u64)i * 2 * N, res, mq_shared + slot * N, key, N, work);\
    }
#else
#error "RSA_SPLIT must be 1 or 2"
#endif

RSA_KERNEL(32)
RSA_KERNEL(48)
RSA_KERNEL(64)
