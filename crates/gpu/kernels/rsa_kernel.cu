/*
 * CUDA entry points around rsa_core.h (concatenated in front of this text by src/cuda.rs and
 * compiled by NVRTC at run time).
 *
 * Mapping: one thread per request (RSA_SPLIT=1), two (RSA_SPLIT=2, one per CRT half), or a
 * group of RSA_SPLIT/2 lanes per CRT half (RSA_SPLIT=8, 16, 32: rsa_group.h), with n a
 * compile-time constant (one kernel per key size, so loops unroll); requests of a batch share
 * the key table (few keys per batch). Every mapping runs host-tested code (rsa_core.h, and
 * rsa_group.h through the host emulation); docs/benchmarks.md has what each measured on a
 * device.
 */
/* The host emulation (emulate.cpp) is built once per window width and makes these static. */
#ifndef RSA_ENTRY_LINKAGE
#define RSA_ENTRY_LINKAGE extern "C"
#endif
/* Threads per request: 1 (the whole operation on one thread), 2 (-DRSA_SPLIT=2: the CRT
 * halves on neighbouring threads, mq handed over in shared memory, the even thread combines),
 * or 8, 16, 32 (a group of RSA_SPLIT/2 lanes per CRT half, rsa_group.h; both halves' results
 * handed over in shared memory, both groups recombine, the p group stores). */
#ifndef RSA_SPLIT
#define RSA_SPLIT 1
#endif
/* FP64 arithmetic for each CRT half (-DRSA_FP64=1, rsa_fp64.h): one thread per half with two
 * threads per request, or a group of lanes (8, 16, 32 threads per request; window table in a
 * local array). */
#ifndef RSA_FP64
#define RSA_FP64 0
#endif
#if RSA_FP64 && RSA_SPLIT == 1
#error "RSA_FP64 needs RSA_SPLIT=2, 8, 16 or 32"
#endif
#if RSA_FP64
#define RSA_HALF(res, in, key, half, N, work) rsa_f_crt_half<N>(res, in, key, half, work)
#else
#define RSA_HALF(res, in, key, half, N, work) rsa_crt_half(res, in, key, half, N, work)
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
        if (active) RSA_HALF(res, in + (rsa_u64)i * 2 * N, key, (int)half, N, work);           \
        if (active && half)                                                                    \
            for (int j = 0; j < N; j++) mq_shared[slot * N + j] = res[j];                      \
        __syncthreads();                                                                       \
        if (active && !half)                                                                   \
            rsa_crt_combine(out + (rsa_u64)i * 2 * N, res, mq_shared + slot * N, key, N, work);\
    }
#elif RSA_SPLIT == 8 || RSA_SPLIT == 16 || RSA_SPLIT == 32
#define RSA_GROUP (RSA_SPLIT / 2)
/* The window table: in shared memory (-DRSA_TABLE_SHARED=1; the launch gives each thread
 * RSA_TABLE * L words, interleaved across the block so a warp's reads hit distinct banks), or
 * in a local array per thread. */
#ifndef RSA_TABLE_SHARED
#define RSA_TABLE_SHARED 0
#endif
#if RSA_TABLE_SHARED
#ifndef RSA_DYNAMIC_SHARED /* the host emulation gives a static array */
#define RSA_DYNAMIC_SHARED extern __shared__ rsa_u32 rsa_table_shared[];
#endif
RSA_DYNAMIC_SHARED
#define RSA_TABLE_DECL(N)                                                                      \
    rsa_u32 *tab = rsa_table_shared + threadIdx.x;                                             \
    int stride = (int)blockDim.x;
#else
#define RSA_TABLE_DECL(N)                                                                      \
    rsa_u32 tab[RSA_TABLE * (N / RSA_GROUP)];                                                  \
    int stride = 1;
#endif
#if RSA_FP64
/* Each group's stage for changing limb sizes (rsa_fg_crt_half): 2K words. */
#define RSA_GROUP_HALF(N)                                                                      \
    __shared__ rsa_u32 fg_stage[(RSA_MAX_BLOCK / RSA_GROUP) * 2 * RSA_FG_LIMBS(N, RSA_GROUP)]; \
    rsa_fg_crt_half<N, RSA_GROUP>(res, in + (rsa_u64)r * 2 * N, key, half, lane,               \
                                  fg_stage + (threadIdx.x / RSA_GROUP) * 2 *                   \
                                                 RSA_FG_LIMBS(N, RSA_GROUP));
#else
#define RSA_GROUP_HALF(N)                                                                      \
    RSA_TABLE_DECL(N)                                                                          \
    rsa_g_crt_half<N, RSA_GROUP>(res, in + (rsa_u64)r * 2 * N, key, half, lane, tab, stride);
#endif
/* Every lane of a warp runs every step (shuffles and ballots need them all): lanes past `count`
 * compute request 0 again and store nothing. The block is a multiple of 2 * RSA_GROUP threads,
 * at most RSA_MAX_BLOCK (the host checks launches). */
#define RSA_KERNEL(N)                                                                          \
    RSA_ENTRY_LINKAGE __global__ void rsa_crt_batch_##N(rsa_u32 *out, const rsa_u32 *in,       \
                                                        const rsa_u32 *keys,                   \
                                                        const rsa_u32 *key_index,              \
                                                        unsigned int count) {                  \
        __shared__ rsa_u32 hand_shared[(RSA_MAX_BLOCK / RSA_SPLIT) * 2 * N];                    \
        if (count == 0) return; /* public, the same for every thread */                        \
        unsigned int slot = threadIdx.x / RSA_SPLIT;                                           \
        int half = (int)(threadIdx.x / RSA_GROUP) & 1;                                         \
        int lane = (int)(threadIdx.x & (RSA_GROUP - 1));                                       \
        unsigned int i = blockIdx.x * (blockDim.x / RSA_SPLIT) + slot;                         \
        int active = i < count;                                                                \
        unsigned int r = active ? i : 0;                                                       \
        const rsa_u32 *key = keys + (rsa_u64)key_index[r] * RSA_KEY_WORDS(N);                  \
        rsa_u32 res[N / RSA_GROUP];                                                            \
        RSA_GROUP_HALF(N)                                                                      \
        /* Both halves' results to shared memory; then both groups run the recombination on     \
         * them (the shuffles need every lane) and the p group's lanes store it. */            \
        rsa_u32 *mine = hand_shared + slot * 2 * N;                                            \
        for (int k = 0; k < N / RSA_GROUP; k++) mine[half * N + lane * (N / RSA_GROUP) + k] = res[k]; \
        __syncthreads();                                                                       \
        rsa_u32 mp[N / RSA_GROUP], mq[N / RSA_GROUP];                                          \
        for (int k = 0; k < N / RSA_GROUP; k++) {                                              \
            mp[k] = mine[lane * (N / RSA_GROUP) + k];                                          \
            mq[k] = mine[N + lane * (N / RSA_GROUP) + k];                                      \
        }                                                                                      \
        rsa_g_combine<N, RSA_GROUP>(out + (rsa_u64)r * 2 * N, mp, mq, key, lane,               \
                                    active && half == 0);                                      \
    }
#else
#error "RSA_SPLIT must be 1, 2, 8, 16 or 32"
#endif

RSA_KERNEL(32)
RSA_KERNEL(48)
RSA_KERNEL(64)
