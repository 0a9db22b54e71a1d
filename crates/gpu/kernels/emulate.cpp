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
 *
 * The group kernels (RSA_SPLIT = 8, 16, 32: rsa_group.h) exchange registers between lanes with
 * __shfl_sync and __ballot_sync. There each thread of a block is a fiber (ucontext) on one OS
 * thread; a shuffle or ballot writes the lane's value, waits until every thread of the block
 * has written (the fibers run round robin until then), and reads its source lane's: the
 * warp-synchronous exchange the device does, with one barrier per exchange (two alternating
 * buffers, so a lane never overwrites a value another has yet to read).
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

#ifndef RSA_SPLIT
#define RSA_SPLIT 1
#endif
#define RSA_FIBERS (RSA_SPLIT > 2)
#if RSA_SPLIT == 2
static thread_local rsa_dim3 threadIdx;
#define __shared__ static
static pthread_barrier_t rsa_block_barrier;
static void __syncthreads() { pthread_barrier_wait(&rsa_block_barrier); }
#elif RSA_FIBERS
#include <string.h>
#include <ucontext.h>
#define __shared__ static
/* Largest emulated block (RSA_MAX_BLOCK in rsa_kernel.cu). */
#define RSA_EMU_MAX_BLOCK 256
struct rsa_fiber {
    ucontext_t ctx;
    rsa_dim3 idx;
    int done;
    int parity;
    std::vector<char> stack;
};
static std::vector<rsa_fiber> rsa_fibers;
static unsigned int rsa_cur;
static ucontext_t rsa_scheduler;
static unsigned long rsa_generation;
static unsigned int rsa_arrived;
static unsigned int rsa_exchange[2][RSA_EMU_MAX_BLOCK];
#define threadIdx (rsa_fibers[rsa_cur].idx)
/* The kernel's dynamic shared memory (the window table with -DRSA_TABLE_SHARED=1): the most
 * any launch asks for, 64 entries of 16 limbs per thread. */
#define RSA_DYNAMIC_SHARED static rsa_u32 rsa_table_shared[RSA_EMU_MAX_BLOCK * 64 * 16];
/* Back to the scheduler, which resumes the next fiber. */
static void rsa_yield() { swapcontext(&rsa_fibers[rsa_cur].ctx, &rsa_scheduler); }
/* Returns once every thread of the block has arrived. */
static void rsa_block_wait() {
    unsigned long g = rsa_generation;
    if (++rsa_arrived == blockDim.x) {
        rsa_arrived = 0;
        rsa_generation++;
        return;
    }
    while (rsa_generation == g) rsa_yield();
}
static void __syncthreads() { rsa_block_wait(); }
/* This thread's value is written, the block waits, the buffer is read (see the top). */
static unsigned int *rsa_exchanged(unsigned int v) {
    rsa_fiber &f = rsa_fibers[rsa_cur];
    unsigned int *buf = rsa_exchange[f.parity];
    f.parity ^= 1;
    buf[f.idx.x] = v;
    rsa_block_wait();
    return buf;
}
static unsigned int __shfl_sync(unsigned int, unsigned int v, int src, int width) {
    unsigned int t = threadIdx.x;
    unsigned int *buf = rsa_exchanged(v);
    return buf[(t & ~(unsigned int)(width - 1)) + ((unsigned int)src & (unsigned int)(width - 1))];
}
static unsigned int __ballot_sync(unsigned int, int pred) {
    unsigned int t = threadIdx.x;
    unsigned int *buf = rsa_exchanged(pred != 0);
    unsigned int warp = t & ~31u, mask = 0;
    for (unsigned int l = 0; l < 32 && warp + l < blockDim.x; l++) mask |= buf[warp + l] << l;
    return mask;
}
#else
static thread_local rsa_dim3 threadIdx;
#endif

#include "rsa_core.h"
#if RSA_FIBERS
#include "rsa_group.h"
#endif
#if RSA_FP64
#include <cfenv>
#include "rsa_fp64.h"
#endif
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
#if RSA_FP64
    /* rsa_fp64.h's one rounding fma is __fma_rz on the device; its other operations are exact
     * in any mode. Each emulated thread (an OS thread, or a fiber, whose context carries its
     * own mode) sets it. */
    std::fesetround(FE_TOWARDZERO);
#endif
    switch (half) {
    case 32: rsa_crt_batch_32(out, in, keys, key_index, count); return 0;
    case 48: rsa_crt_batch_48(out, in, keys, key_index, count); return 0;
    case 64: rsa_crt_batch_64(out, in, keys, key_index, count); return 0;
    default: return -1;
    }
}

/* Runs a grid of `grid` blocks of `block` threads of the kernel for primes of `half` limbs.
 * Returns 0, or -1 for an unsupported size. Not thread-safe (one emulated launch at a time). */
#if RSA_FIBERS
/* The launch's arguments, for the fibers' entry (makecontext passes no pointers portably). */
static struct {
    int half;
    rsa_u32 *out;
    const rsa_u32 *in, *keys, *key_index;
    unsigned int count;
} rsa_args;
static void rsa_fiber_main() {
    rsa_fiber &f = rsa_fibers[rsa_cur];
    rsa_emulate_thread(rsa_args.half, f.idx.x, rsa_args.out, rsa_args.in, rsa_args.keys,
                       rsa_args.key_index, rsa_args.count);
    rsa_fibers[rsa_cur].done = 1; /* returns to the scheduler (uc_link) */
}
#endif

extern "C" int RSA_EMULATE_LAUNCH(int half, unsigned int grid, unsigned int block,
                                  rsa_u32 *out, const rsa_u32 *in, const rsa_u32 *keys,
                                  const rsa_u32 *key_index, unsigned int count) {
    if (half != 32 && half != 48 && half != 64) return -1;
#if RSA_FP64
    int caller_rounding = std::fegetround();
#endif
    blockDim.x = block;
    for (unsigned int b = 0; b < grid; b++) {
        blockIdx.x = b;
#if RSA_FIBERS
        if (block > RSA_EMU_MAX_BLOCK || block % RSA_SPLIT) return -1;
        rsa_args = {half, out, in, keys, key_index, count};
        rsa_fibers.assign(block, rsa_fiber());
        rsa_generation = 0;
        rsa_arrived = 0;
        for (unsigned int t = 0; t < block; t++) {
            rsa_fiber &f = rsa_fibers[t];
            f.idx = {t, 0, 0};
            f.done = 0;
            f.parity = 0;
            f.stack.resize(256 * 1024);
            getcontext(&f.ctx);
            f.ctx.uc_stack.ss_sp = f.stack.data();
            f.ctx.uc_stack.ss_size = f.stack.size();
            f.ctx.uc_link = &rsa_scheduler;
            makecontext(&f.ctx, rsa_fiber_main, 0);
        }
        for (unsigned int left = block; left > 0;) {
            left = 0;
            for (rsa_cur = 0; rsa_cur < block; rsa_cur++) {
                if (rsa_fibers[rsa_cur].done) continue;
                swapcontext(&rsa_scheduler, &rsa_fibers[rsa_cur].ctx);
                left += !rsa_fibers[rsa_cur].done;
            }
        }
#elif RSA_SPLIT == 2
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
#if RSA_FP64
    std::fesetround(caller_rounding); /* the caller's thread ran fibers, or none */
#endif
    return 0;
}
