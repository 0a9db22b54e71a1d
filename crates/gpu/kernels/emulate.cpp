/*
 * Host emulation of the CUDA entry points: compiles rsa_kernel.cu itself (with rsa_core.h) as
 * C++, with __global__/__device__ empty and blockIdx/threadIdx/blockDim as globals, and runs
 * every thread of a grid in turn. The simulated GPU launches batches through this, so the
 * kernel's own indexing (request and key offsets, the count guard) is exercised by the tests,
 * not only the arithmetic core.
 */
#define __global__
#define __device__
#define RSA_ENTRY_LINKAGE static
struct rsa_dim3 {
    unsigned int x, y, z;
};
static rsa_dim3 blockIdx, threadIdx, blockDim;

#include "rsa_core.h"
#include "rsa_kernel.cu"

/* Built once per window width (build.rs: -DRSA_WINDOW=W -DRSA_EMULATE_LAUNCH=...), so tests
 * cover every width the CUDA build can be given. */
#ifndef RSA_EMULATE_LAUNCH
#define RSA_EMULATE_LAUNCH rsa_emulate_launch
#endif

/* Runs a grid of `grid` blocks of `block` threads of the kernel for primes of `half` limbs.
 * Returns 0, or -1 for an unsupported size. Not thread-safe (one emulated launch at a time). */
extern "C" int RSA_EMULATE_LAUNCH(int half, unsigned int grid, unsigned int block,
                                  rsa_u32 *out, const rsa_u32 *in, const rsa_u32 *keys,
                                  const rsa_u32 *key_index, unsigned int count) {
    blockDim.x = block;
    for (unsigned int b = 0; b < grid; b++) {
        blockIdx.x = b;
        for (unsigned int t = 0; t < block; t++) {
            threadIdx.x = t;
            switch (half) {
            case 32: rsa_crt_batch_32(out, in, keys, key_index, count); break;
            case 48: rsa_crt_batch_48(out, in, keys, key_index, count); break;
            case 64: rsa_crt_batch_64(out, in, keys, key_index, count); break;
            default: return -1;
            }
        }
    }
    return 0;
}
