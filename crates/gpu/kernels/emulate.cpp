/*
 * Host emulation of the CUDA entry points: compiles rsa_kernel.cu itself (with rsa_core.h) as
 * C++, with __global__/__device__ empty. The simulated GPU launches batches through this, so
 * the kernel's own indexing (request and key offsets, the count guard) is exercised by the
 * tests, not only the arithmetic core.
 *
 * With one thread per request (RSA_SPLIT=1) a block's threads run one after another. The
 * two-threads-per-request kernel (RSA_SPLIT=2) shares memory within a block and waits at
 * __syncthreads(), so there each thread of a block runs on an OS thread of its own, the block's
 * __shared__ arrays are one static copy (blocks run one at a time), and __syncthreads() is a
 * barrier over the block's threads: what the device guarantees, and no more.
 */
#include <pthread.h>
#include <thread>
#include <vector>

#define __global__
#define __device__
#define RSA_ENTRY_LINKAGE static
struct rsa_dim3 {
    unsigned int x, y, z;
};
static rsa_dim3 blockIdx, blockDim;
static thread_local rsa_dim3 threadIdx;

#ifndef RSA_SPLIT
#define RSA_SPLIT 1
#endif
#if RSA_SPLIT == 2
#define __shared__ static
static pthread_barrier_t rsa_block_barrier;
static void __syncthreads() { pthread_barrier_wait(&rsa_block_barrier); }
#endif

#include "rsa_core.h"
#include "rsa_kernel.cu"

/* Built once per kernel shape (build.rs: -DRSA_WINDOW=W [-DRSA_SPLIT=2]
 * -DRSA_EMULATE_LAUNCH=...), so tests cover every shape the CUDA build can be given. */
#ifndef RSA_EMULATE_LAUNCH
#define RSA_EMULATE_LAUNCH rsa_emulate_launch
#endif

static int rsa_emulate_thread(int half, unsigned int t, rsa_u32 *out, const rsa_u32 *in,
                              const rsa_u32 *keys, const rsa_u32 *key_index,
                              unsigned int count) {
    threadIdx.x = t;
    switch (half) {
    case 32: rsa_crt_batch_32(out, in, keys, key_index, count); return 0;
    case 48: rsa_crt_batch_48(out, in, keys, key_index, count); return 0;
    case 64: rsa_crt_batch_64(out, in, keys, key_index, count); return 0;
    default: return -1;
    }
}

/* Runs a grid of `grid` blocks of `block` threads of the kernel for primes of `half` limbs.
 * Returns 0, or -1 for an unsupported size. Not thread-safe (one emulated launch at a time). */
extern "C" int RSA_EMULATE_LAUNCH(int half, unsigned int grid, unsigned int block,
                                  rsa_u32 *out, const rsa_u32 *in, const rsa_u32 *keys,
                                  const rsa_u32 *key_index, unsigned int count) {
    if (half != 32 && half != 48 && half != 64) return -1;
    blockDim.x = block;
    for (unsigned int b = 0; b < grid; b++) {
        blockIdx.x = b;
#if RSA_SPLIT == 2
        pthread_barrier_init(&rsa_block_barrier, nullptr, block);
        std::vector<std::thread> threads;
        for (unsigned int t = 0; t < block; t++)
            threads.emplace_back(rsa_emulate_thread, half, t, out, in, keys, key_index, count);
        for (auto &t : threads) t.join();
        pthread_barrier_destroy(&rsa_block_barrier);
#else
        for (unsigned int t = 0; t < block; t++)
            rsa_emulate_thread(half, t, out, in, keys, key_index, count);
#endif
    }
    return 0;
}
