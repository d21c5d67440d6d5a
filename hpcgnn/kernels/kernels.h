/* hpcgnn's sampling kernels in C: the loops that torch ops can only express in many passes. What every file of them
 * shares: the prefetch distance, work cut into chunks for a team of threads (threads.c), the id lists' helpers
 * (ids.c), and the counter-based uniform numbers (SplitMix64) the hops draw from.
 *
 * Built when hpcgnn is installed (setup.py), else on first use (hpcgnn/kernels/build.py), with no torch
 * header, and called through ctypes with tensors' data pointers (kernels/build.py's SIGNATURES, checked against the
 * definitions here by tests/test_native.py). Every function computes exactly what its torch twin computes
 * (kernels/twins.py: the same key in, the same random numbers of it, the same batch out, bit for bit), so a machine
 * without a compiler makes the same batches, only slower.
 *
 * The files, one concern each: threads.c (the thread pool and its jobs), hops.c (a hop's plan and its draws), times.c (the
 * part of each time-sorted neighbour list a node may draw from as of its time),
 * ids.c (id lists: joining chunks' parts, sorting), dense.c (a replicated rank's id map over every id), hash.c (a
 * partitioned rank's id map, a hash table), gather.c (feature rows, plain or widened from 16 bits), aggregate.c
 * (exact inference's sums and means of every in-neighbour's row, straight from the CSR).
 *
 * Work is cut into chunks that `threads` threads take in turn (pthreads, not OpenMP: torch's wheels
 * bring their own OpenMP runtime, and a second one would keep a thread pool of its own beside it),
 * so a thread slowed by a busy core takes fewer chunks instead of holding the others up. What a
 * chunk writes depends only on the chunk. The helper threads are kept between calls (threads.c).
 *
 * Ids are int64; col may be int32 or int64 (col_is_int32). Only the hpcgnn_* functions are exported; what the
 * files share among themselves is hidden (HIDDEN).
 */
#ifndef HPCGNN_KERNELS_H
#define HPCGNN_KERNELS_H
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* Loads run ahead of their use by this many items: the rows' neighbour lists and the id maps are far
 * larger than the caches, so each item waits on memory unless many are in flight at once.
 *
 * Where the lines go: into L2 (prefetcht1 on x86). A core tracks its L1 misses in a few miss buffers (an Intel
 * core's 10-16 line fill buffers), and a prefetch into L1, prefetchnta included, holds one until its line arrives,
 * so few lines are in flight per core; a prefetch into L2 is tracked by L2's longer queue. On an Emerald Rapids
 * core that made a typed batch's row gather 1.6x faster and its sampling 1.15x; on an AMD Zen 4 (EPYC) core, the
 * typed loader 1.17x and the default graph's 1.13x (docs/benchmarks.md). */
#define AHEAD 16
#define PREFETCH_HINT 2 /* prefetcht1 */
#define PREFETCH(p) __builtin_prefetch((const void *)(p), 0, PREFETCH_HINT)
/* A line about to be written (prefetchw where the compiler may use it; else a read prefetch, the same hint). */
#define PREFETCH_W(p) __builtin_prefetch((const void *)(p), 1, PREFETCH_HINT)
#define MAX_THREADS 64
#define HIDDEN __attribute__((visibility("hidden")))
#define LOW_BITS 0x0101010101010101ULL /* the lowest bit of each of a word's bytes */

typedef void (*chunk_fn)(void *ctx, int64_t chunk);

/* Chunk c of n items: [n * c / chunks, n * (c + 1) / chunks). */
static inline int64_t chunk_start(int64_t n, int64_t chunks, int64_t c) { return (int64_t)((__int128)n * c / chunks); }

/* Work cut into chunks that a team of threads takes from one counter. A thread outside the team may help (the
 * sampling thread of a two-stage loader, while its next batch waits for room, helps the gathering thread with its
 * rows) where the caller hands it the job: a buffer of hpcgnn_job_bytes() zeroed bytes, a new one for each piece
 * of work, so a helper late for one finds no chunk left in it, never another's. ctx is the caller's, on its
 * stack: only a thread holding a chunk reads it, and the caller returns only once every chunk is done. */
struct job {
    int64_t chunks; /* stored last (release): a helper that reads it reads fn and ctx too */
    int64_t next, done;
    chunk_fn fn;
    void *ctx;
};


/* threads.c: fn(ctx, c) for every chunk, on up to `threads` threads (see there). */
HIDDEN void shared_chunks(int threads, int64_t chunks, chunk_fn fn, void *ctx, struct job *j);
HIDDEN void parallel_chunks(int threads, int64_t chunks, chunk_fn fn, void *ctx);
HIDDEN int64_t checked_chunks(int threads, int64_t chunks, chunk_fn fn, void *ctx, int64_t *chunk_bad, void *job);
int64_t hpcgnn_job_help(void *job);

/* ids.c */
HIDDEN int64_t join_parts(int64_t *found, int64_t count, int64_t *parts, int64_t n, int64_t chunks,
                          const int64_t *chunk_found);
HIDDEN void radix_sort(int64_t *a, int64_t n, int64_t max_id);

/* The index-th uniform number in [0, 1) of a key: SplitMix64's output for state key + (index + 1) * gamma,
 * its top 53 bits over 2^53 (hpcgnn.rng.counter_uniform computes the same with torch ops). */
static inline double counter_uniform(uint64_t key, int64_t index) {
    uint64_t z = key + (uint64_t)(index + 1) * 0x9E3779B97F4A7C15ULL;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    z ^= z >> 31;
    return (double)(z >> 11) * 0x1.0p-53;
}

#endif
