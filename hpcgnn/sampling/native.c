/* hpcgnn's sampling kernels in C: the loops that torch ops can only express in many passes.
 *
 * Built when hpcgnn is installed (setup.py), else on first use (hpcgnn/sampling/build.py), with no torch header, and called
 * through ctypes with tensors' data pointers. Every function computes exactly what the torch ops
 * of hpcgnn/sampling/neighbor.py compute (the same key in, the same random numbers of it, the same
 * batch out, bit for bit), so a machine without a compiler makes the same batches, only slower.
 *
 * Work is cut into chunks that `threads` threads take in turn (pthreads, not OpenMP: torch's wheels
 * bring their own OpenMP runtime, and a second one would keep a thread pool of its own beside it),
 * so a thread slowed by a busy core takes fewer chunks instead of holding the others up. What a
 * chunk writes depends only on the chunk. The helper threads are kept between calls (the pool below).
 *
 * Ids are int64; col may be int32 or int64 (col_is_int32).
 */
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

/* The source this library was built from (the first 16 hex digits of native.c's SHA-256, passed by whoever builds
 * it: setup.py, hpcgnn/sampling/build.py): a library that answers otherwise is not used. */
#ifndef HPCGNN_SOURCE_HASH
#define HPCGNN_SOURCE_HASH "unknown"
#endif
const char *hpcgnn_source_hash(void) { return HPCGNN_SOURCE_HASH; }
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

int64_t hpcgnn_job_bytes(void) { return (int64_t)sizeof(struct job); }

/* Chunks of the job until none is left (none at all in a buffer not yet, or no longer, in use); returns how
 * many it did. */
int64_t hpcgnn_job_help(void *job) {
    struct job *j = (struct job *)job;
    const int64_t chunks = __atomic_load_n(&j->chunks, __ATOMIC_ACQUIRE);
    int64_t did = 0;
    for (int64_t c; chunks && (c = __atomic_fetch_add(&j->next, 1, __ATOMIC_RELAXED)) < chunks; did++) {
        j->fn(j->ctx, c);
        __atomic_fetch_add(&j->done, 1, __ATOMIC_RELEASE); /* what the chunk wrote comes before */
    }
    return did;
}

static void *job_thread(void *job) {
    (void)hpcgnn_job_help(job);
    return NULL;
}

/* The team's helper threads, kept between calls: a typed batch makes some forty kernel calls, and a thread started
 * and joined for each cost more than waking a waiting one (on a 2-core VM, by hand: ~15 us before a new thread ran
 * and ~30 us with its join, ~6 us to wake one; its stack mapped and unmapped each time). One call at a time holds
 * the pool (pool.busy); another meanwhile starts threads of its own, as every call did before. A helper waits on a
 * condition (no spinning: a core taken by another process is not fought for), takes chunks of the job it is
 * handed, and leaves it; the caller returns once no helper is inside its job (pool.inside), so the job, on its
 * stack, is never read after. Helpers block every signal (the process's go to its other threads). A child of
 * fork() has none of the parent's helpers: pool_forked starts it with an empty pool. */
static struct {
    pthread_mutex_t lock;
    pthread_cond_t wake;
    struct job *job;  /* the job helpers are handed now */
    int wanted;       /* helpers still to join it */
    int size, busy;   /* helpers started; whether a call holds the pool */
    int64_t inside;   /* helpers inside a job (atomic) */
    int at_fork;      /* whether pool_forked is registered */
} pool = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, NULL, 0, 0, 0, 0, 0};

static void *pool_thread(void *arg) {
    (void)arg;
    pthread_mutex_lock(&pool.lock);
    for (;;) {
        while (pool.wanted == 0) pthread_cond_wait(&pool.wake, &pool.lock);
        struct job *j = pool.job;
        pool.wanted--;
        __atomic_fetch_add(&pool.inside, 1, __ATOMIC_RELAXED); /* under the lock: the caller, taking it, sees it */
        pthread_mutex_unlock(&pool.lock);
        hpcgnn_job_help(j);
        __atomic_fetch_sub(&pool.inside, 1, __ATOMIC_RELEASE);
        pthread_mutex_lock(&pool.lock);
    }
    return NULL;
}

static void pool_forked(void) { /* in a child of fork(): its only thread is the one that forked */
    pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
    pthread_cond_t wake = PTHREAD_COND_INITIALIZER;
    pool.lock = lock;
    pool.wake = wake;
    pool.job = NULL;
    pool.wanted = pool.size = pool.busy = 0;
    pool.inside = 0;
}

/* Hands job j to up to `helpers` helpers of the pool (started now where it has fewer); returns how many it was
 * handed to, or -1 where another call holds the pool. */
static int pool_hand(struct job *j, int helpers) {
    pthread_mutex_lock(&pool.lock);
    if (pool.busy) {
        pthread_mutex_unlock(&pool.lock);
        return -1;
    }
    if (!pool.at_fork) pool.at_fork = pthread_atfork(NULL, NULL, pool_forked) == 0;
    if (pool.size < helpers) {
        sigset_t all, before;
        sigfillset(&all);
        pthread_sigmask(SIG_SETMASK, &all, &before);
        for (pthread_t t; pool.size < helpers && pthread_create(&t, NULL, pool_thread, NULL) == 0; pool.size++)
            pthread_detach(t);
        pthread_sigmask(SIG_SETMASK, &before, NULL);
    }
    pool.busy = 1;
    pool.job = j;
    pool.wanted = helpers < pool.size ? helpers : pool.size;
    for (int k = 0; k < pool.wanted; k++) pthread_cond_signal(&pool.wake);
    int handed = pool.wanted;
    pthread_mutex_unlock(&pool.lock);
    return handed;
}

/* The pool back from the job handed out, whose chunks are all taken: helpers not yet in it no longer join it, and
 * once those in it have left it, the next call may hold the pool. */
static void pool_release(void) {
    pthread_mutex_lock(&pool.lock);
    pool.wanted = 0;
    pool.job = NULL;
    pthread_mutex_unlock(&pool.lock);
    while (__atomic_load_n(&pool.inside, __ATOMIC_ACQUIRE) > 0) sched_yield();
    pthread_mutex_lock(&pool.lock);
    pool.busy = 0;
    pthread_mutex_unlock(&pool.lock);
}

/* fn(ctx, c) for every chunk, on up to `threads` threads (this one included: the pool's helpers, or threads of
 * its own where another call holds the pool) and whichever helpers the job buffer j was handed to; returns once
 * every chunk is done, helpers' included. */
static void shared_chunks(int threads, int64_t chunks, chunk_fn fn, void *ctx, struct job *j) {
    pthread_t helpers[MAX_THREADS];
    int started = 0, pooled = -1;
    j->fn = fn;
    j->ctx = ctx;
    __atomic_store_n(&j->chunks, chunks, __ATOMIC_RELEASE);
    if (threads > MAX_THREADS) threads = MAX_THREADS;
    if (threads > chunks) threads = (int)chunks;
    if (threads > 1) pooled = pool_hand(j, threads - 1);
    if (pooled < 0)
        for (int k = 1; k < threads; k++)
            if (pthread_create(&helpers[started], NULL, job_thread, j) == 0) started++;
    hpcgnn_job_help(j);
    if (pooled >= 0) pool_release();
    for (int k = 0; k < started; k++) pthread_join(helpers[k], NULL);
    while (__atomic_load_n(&j->done, __ATOMIC_ACQUIRE) < chunks) sched_yield(); /* a helper's last chunk */
}

/* fn(ctx, c) for every chunk c < chunks, on up to `threads` threads (this one included): a job no helper sees. */
static void parallel_chunks(int threads, int64_t chunks, chunk_fn fn, void *ctx) {
    struct job j = {0, 0, 0, NULL, NULL};
    shared_chunks(threads, chunks, fn, ctx, &j);
}

/* parallel_chunks for kernels that check their items: a chunk that meets a bad one writes -1 - its index to
 * chunk_bad[chunk] (scratch of `chunks` entries) and stops. Returns 0, or the first chunk's such code. job: NULL,
 * or a fresh job buffer that helpers may be handed (shared_chunks). */
static int64_t checked_chunks(int threads, int64_t chunks, chunk_fn fn, void *ctx, int64_t *chunk_bad, void *job) {
    for (int64_t c = 0; c < chunks; c++) chunk_bad[c] = 0;
    if (job)
        shared_chunks(threads, chunks, fn, ctx, (struct job *)job);
    else
        parallel_chunks(threads, chunks, fn, ctx);
    for (int64_t c = 0; c < chunks; c++)
        if (chunk_bad[c] < 0) return chunk_bad[c];
    return 0;
}

/* The index-th uniform number in [0, 1) of a key: SplitMix64's output for state key + (index + 1) * gamma,
 * its top 53 bits over 2^53 (hpcgnn.rng.counter_uniform computes the same with torch ops). */
static inline double counter_uniform(uint64_t key, int64_t index) {
    uint64_t z = key + (uint64_t)(index + 1) * 0x9E3779B97F4A7C15ULL;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    z ^= z >> 31;
    return (double)(z >> 11) * 0x1.0p-53;
}

/* One hop's plan: the output slots (sum over nodes of min(deg, fanout)) and the nodes that draw a
 * subset (deg > fanout), nbig, the stride of the hop's uniform numbers; per chunk of nodes,
 * where its slots and its drawing nodes start (chunk_slot, chunk_big: chunks + 1 entries).
 * A node outside [0, rows) returns -1 - its index (the first such), and nothing is sampled.
 * The chunks are counted on up to `threads` threads, then summed in order. */
struct plan {
    const int64_t *rowptr, *nodes;
    int64_t rows, m, fanout, chunks;
    int64_t *chunk_slot, *chunk_big;
};

static void plan_chunk(void *ctx, int64_t c) { /* chunk c's slots and drawing nodes (or -1 - its first bad node) */
    const struct plan *k = (const struct plan *)ctx;
    int64_t slots = 0, nbig = 0;
    for (int64_t i = chunk_start(k->m, k->chunks, c), end = chunk_start(k->m, k->chunks, c + 1); i < end; i++) {
        if (i + AHEAD < end && (uint64_t)k->nodes[i + AHEAD] < (uint64_t)k->rows)
            PREFETCH(k->rowptr + k->nodes[i + AHEAD]);
        if ((uint64_t)k->nodes[i] >= (uint64_t)k->rows) {
            k->chunk_slot[c] = -1 - i;
            return;
        }
        int64_t deg = k->rowptr[k->nodes[i] + 1] - k->rowptr[k->nodes[i]];
        slots += deg > k->fanout ? k->fanout : deg;
        nbig += deg > k->fanout;
    }
    k->chunk_slot[c] = slots;
    k->chunk_big[c] = nbig;
}

int64_t hpcgnn_hop_plan(const int64_t *rowptr, int64_t rows, const int64_t *nodes, int64_t m, int64_t fanout,
                        int64_t chunks, int64_t *chunk_slot, int64_t *chunk_big, int threads) {
    struct plan k = {rowptr, nodes, rows, m, fanout, chunks, chunk_slot, chunk_big};
    int64_t bad = checked_chunks(threads, chunks, plan_chunk, &k, chunk_slot, NULL); /* a bad node's code there */
    if (bad < 0) return bad;
    int64_t slots = 0, nbig = 0;
    for (int64_t c = 0; c < chunks; c++) { /* each chunk's counts become where it starts */
        int64_t s = chunk_slot[c], b = chunk_big[c];
        chunk_slot[c] = slots;
        chunk_big[c] = nbig;
        slots += s;
        nbig += b;
    }
    chunk_slot[chunks] = slots;
    chunk_big[chunks] = nbig;
    return slots;
}

struct hop {
    const int64_t *rowptr, *nodes, *chunk_slot, *chunk_big;
    const void *col;
    int col_is_int32;
    int64_t m, fanout, chunks, nbig, row_base;
    uint64_t key;
    int64_t *row_out, *nbr_out;
};

#define BLOCK 16 /* rows whose positions are found (and their neighbours asked for) before any is read */

static void hop_chunk(void *ctx, int64_t c) {
    const struct hop *h = (const struct hop *)ctx;
    const int64_t *rowptr = h->rowptr, *nodes = h->nodes, fanout = h->fanout, nbig = h->nbig;
    const int32_t *col32 = (const int32_t *)h->col;
    const int64_t *col64 = (const int64_t *)h->col;
    int64_t slot = h->chunk_slot[c], b = h->chunk_big[c], end = chunk_start(h->m, h->chunks, c + 1);
    /* Which of a drawing row's offsets are drawn: a bit per offset, grown to the chunk's largest degree, its bits
     * cleared after each row (Floyd's "drawn before?" in one test, where a scan of the draws took fanout / 2). */
    uint64_t *seen = NULL;
    int64_t seen_words = 0;
    for (int64_t block = chunk_start(h->m, h->chunks, c); block < end; block += BLOCK) {
        int64_t block_end = block + BLOCK < end ? block + BLOCK : end, first_slot = slot;
        /* First the block's positions in col, written where its neighbours go, each asked for at once... */
        for (int64_t i = block; i < block_end; i++) {
            if (i + 2 * BLOCK < end) PREFETCH(rowptr + nodes[i + 2 * BLOCK]); /* the block after next's rows */
            int64_t start = rowptr[nodes[i]], deg = rowptr[nodes[i] + 1] - start, row = h->row_base + i;
            if (deg > fanout) {
                if ((deg + 63) >> 6 > seen_words) {
                    free(seen);
                    seen_words = (deg + 63) >> 6;
                    seen = (uint64_t *)calloc((size_t)seen_words, sizeof(uint64_t));
                }
                for (int64_t j = 0; j < fanout; j++) {
                    int64_t top = deg - fanout + j; /* every earlier draw is below top: top is never drawn yet */
                    int64_t t = (int64_t)(counter_uniform(h->key, j * nbig + b) * (double)(top + 1));
                    if (t > top) t = top;
                    if (seen[t >> 6] >> (t & 63) & 1) t = top;
                    seen[t >> 6] |= 1ULL << (t & 63);
                    int64_t p = start + t;
                    PREFETCH(h->col_is_int32 ? (const void *)(col32 + p) : (const void *)(col64 + p));
                    h->row_out[slot] = row;
                    h->nbr_out[slot++] = p;
                }
                for (int64_t s = slot - fanout; s < slot; s++) seen[(h->nbr_out[s] - start) >> 6] = 0;
                b++;
            } else {
                for (int64_t j = 0; j < deg; j += 8) /* a line holds 16 int32 or 8 int64 entries */
                    PREFETCH(h->col_is_int32 ? (const void *)(col32 + start + j) : (const void *)(col64 + start + j));
                for (int64_t j = 0; j < deg; j++) {
                    h->row_out[slot] = row;
                    h->nbr_out[slot++] = start + j;
                }
            }
        }
        /* ...then read, by which time they are on their way. */
        if (h->col_is_int32)
            for (int64_t s = first_slot; s < slot; s++) h->nbr_out[s] = col32[h->nbr_out[s]];
        else
            for (int64_t s = first_slot; s < slot; s++) h->nbr_out[s] = col64[h->nbr_out[s]];
    }
    free(seen);
}

/* One hop: for node i, row = row_base + i and nbr = its neighbours, all of them (deg <= fanout) or the
 * subset Floyd's algorithm draws from the uniform numbers u[j, b] (number j * nbig + b of the hop's
 * key, for the b-th drawing node): at step j, t = min(floor(u * (top + 1)), top) with
 * top = deg - fanout + j; t if not drawn before, else top (neighbor.floyd_sample). Chunks as
 * hpcgnn_hop_plan cut them. */
void hpcgnn_hop_fill(const int64_t *rowptr, const void *col, int col_is_int32, const int64_t *nodes, int64_t m,
                     int64_t fanout, int64_t chunks, const int64_t *chunk_slot, const int64_t *chunk_big,
                     int64_t key, int64_t nbig, int64_t row_base, int64_t *row_out, int64_t *nbr_out, int threads) {
    struct hop h = {rowptr, nodes, chunk_slot, chunk_big, col, col_is_int32, m, fanout, chunks, nbig, row_base,
                    (uint64_t)key, row_out, nbr_out};
    parallel_chunks(threads, chunks, hop_chunk, &h);
}

/* After chunks that each wrote their ids at the start of their own part of found (chunk c's part begins at
 * chunk_start(n, chunks, c), chunk_found[c] ids long, or holds -1 - i for a bad id i): the first bad id's
 * code, or the parts moved together after found[:count] and the new count. */
static int64_t join_parts(int64_t *found, int64_t count, int64_t *parts, int64_t n, int64_t chunks,
                          const int64_t *chunk_found) {
    for (int64_t c = 0; c < chunks; c++)
        if (chunk_found[c] < 0) return chunk_found[c];
    for (int64_t c = 0; c < chunks; c++) {
        if (found) {
            int64_t *part = parts + chunk_start(n, chunks, c);
            if (found + count != part) memmove(found + count, part, sizeof(int64_t) * (size_t)chunk_found[c]);
        }
        count += chunk_found[c];
    }
    return count;
}

struct marking {
    const int64_t *ids;
    uint8_t *mark;
    int64_t size, n, chunks;
    int64_t *found, *chunk_found;
};

static void mark_chunk(void *ctx, int64_t c) {
    const struct marking *k = (const struct marking *)ctx;
    int64_t i = chunk_start(k->n, k->chunks, c), end = chunk_start(k->n, k->chunks, c + 1);
    int64_t *out = k->found + i, count = 0; /* this chunk's part of found: as long as its ids */
    for (; i < end; i++) {
        if (i + AHEAD < end) PREFETCH(k->mark + k->ids[i + AHEAD]);
        int64_t id = k->ids[i];
        if ((uint64_t)id >= (uint64_t)k->size) { /* outside the map: the chunk reports it, and marks nothing more */
            k->chunk_found[c] = -1 - i;
            return;
        }
        /* No branch on the map (whether an id is new is a coin toss to the CPU): every id is written to out,
         * and the count moves past it when it is new. Threads may each find the same id: numbering dedups. */
        uint8_t state = __atomic_load_n(k->mark + id, __ATOMIC_RELAXED), absent = state == 0;
        __atomic_store_n(k->mark + id, (uint8_t)(state | absent), __ATOMIC_RELAXED);
        out[count] = id;
        count += absent;
    }
    k->chunk_found[c] = count;
}

/* An id's state in `mark`, a byte per id of the map (1/8 of the table's size, so far more of it stays in
 * the caches than of the table): 2 where the id is in the map, 1 where this round found it new, 0 else.
 * Marks the ids of ids[:n] in neither state 1 nor 2 and appends them to found[count:] (in no set order, and
 * an id may come twice when two threads met it at once: hpcgnn_number_found sorts and dedups them).
 * Returns the new count. Called once per list of candidates; hpcgnn_number_found ends the round.
 * chunk_found: scratch of `chunks` entries. An id outside [0, size) returns -1 - its index; marks made
 * are left (the caller clears the 1s). */
int64_t hpcgnn_mark_new(uint8_t *mark, int64_t size, const int64_t *ids, int64_t n, int64_t *found, int64_t count,
                        int64_t chunks, int64_t *chunk_found, int threads) {
    struct marking k = {ids, mark, size, n, chunks, found + count, chunk_found};
    parallel_chunks(threads, chunks, mark_chunk, &k);
    return join_parts(found, count, k.found, n, chunks, chunk_found); /* on a bad id the caller clears the marks */
}

static int compare_ids(const void *x, const void *y) {
    int64_t a = *(const int64_t *)x, b = *(const int64_t *)y;
    return (a > b) - (a < b);
}

static void radix_sort(int64_t *a, int64_t n, int64_t max_id) {
    if (n < 2) return;
    int64_t *tmp = (int64_t *)malloc(sizeof(int64_t) * (size_t)n);
    if (!tmp) { /* no memory for the radix passes: sorted in place, slower */
        qsort(a, (size_t)n, sizeof(int64_t), compare_ids);
        return;
    }
    int64_t *src = a, *dst = tmp;
    for (int shift = 0; shift < 64 && (max_id >> shift) > 0; shift += 11) {
        int64_t count[2049];
        memset(count, 0, sizeof(count));
        for (int64_t i = 0; i < n; i++) count[((src[i] >> shift) & 2047) + 1]++;
        for (int d = 0; d < 2048; d++) count[d + 1] += count[d];
        for (int64_t i = 0; i < n; i++) dst[count[(src[i] >> shift) & 2047]++] = src[i];
        int64_t *t = src;
        src = dst;
        dst = t;
    }
    if (src != a) memcpy(a, src, sizeof(int64_t) * (size_t)n);
    free(tmp);
}

struct numbering {
    int64_t *table, *found, *chunk_found;
    uint8_t *mark;
    int64_t size, count, total, chunks;
};

static void count_marks(void *ctx, int64_t c) { /* scan, first pass: the marks of each chunk of the table */
    struct numbering *k = (struct numbering *)ctx;
    int64_t id = chunk_start(k->size, k->chunks, c), end = chunk_start(k->size, k->chunks, c + 1), count = 0;
    for (; id < end && id % 8; id++) count += k->mark[id] & 1;
    for (; id + 8 <= end; id += 8) { /* states are 0, 1 or 2: a word's low bits summed by one multiplication */
        uint64_t word;
        memcpy(&word, k->mark + id, 8);
        count += (int64_t)(((word & LOW_BITS) * LOW_BITS) >> 56);
    }
    for (; id < end; id++) count += k->mark[id] & 1;
    k->chunk_found[c] = count;
}

static void read_marks(void *ctx, int64_t c) { /* scan, second pass: the marked ids in order, now in the map */
    struct numbering *k = (struct numbering *)ctx;
    int64_t id = chunk_start(k->size, k->chunks, c), end = chunk_start(k->size, k->chunks, c + 1);
    int64_t *out = k->found + k->chunk_found[c];
    for (; id < end && id % 8; id++)
        if (k->mark[id] & 1) {
            *out++ = id;
            k->mark[id] = 2;
        }
    for (; id + 8 <= end; id += 8) {
        uint64_t word;
        memcpy(&word, k->mark + id, 8);
        if (!(word & LOW_BITS)) continue;
        int64_t ids[8], r = 0; /* no branch per mark: each id written, kept when marked */
        for (int q = 0; q < 8; q++) {
            ids[r] = id + q;
            r += k->mark[id + q] & 1;
        }
        memcpy(out, ids, sizeof(int64_t) * (size_t)r);
        out += r;
        word = ((word | (word >> 1)) & LOW_BITS) << 1; /* 1 and 2 become 2, 0 stays */
        memcpy(k->mark + id, &word, 8);
    }
    for (; id < end; id++)
        if (k->mark[id] & 1) {
            *out++ = id;
            k->mark[id] = 2;
        }
}

static void put_found(void *ctx, int64_t c) {
    struct numbering *k = (struct numbering *)ctx;
    for (int64_t r = chunk_start(k->count, k->chunks, c), end = chunk_start(k->count, k->chunks, c + 1); r < end; r++) {
        if (r + AHEAD < end) PREFETCH_W(k->table + k->found[r + AHEAD]);
        k->table[k->found[r]] = k->total + r;
    }
}

/* Ends a round of hpcgnn_mark_new (found[:count], an id possibly twice): the distinct ids, sorted (as
 * torch.unique gives them) into found, each put in the map as total, total + 1, ..., its state 2;
 * returns how many. Few ids against a large table are radix-sorted; many are read back in order
 * from the marks (a scan of the table's marks, no sort). chunk_found: scratch of chunks + 1 entries. */
int64_t hpcgnn_number_found(int64_t *table, uint8_t *mark, int64_t size, int64_t *found, int64_t count,
                            int64_t total, int64_t chunks, int64_t *chunk_found, int threads) {
    struct numbering k = {table, found, chunk_found, mark, size, count, total, chunks};
    if (count * 16 < size) {
        radix_sort(found, count, size - 1);
        int64_t distinct = 0;
        for (int64_t r = 0; r < count; r++) {
            mark[found[r]] = 2;
            if (distinct == 0 || found[r] != found[distinct - 1]) found[distinct++] = found[r];
        }
        k.count = distinct;
    } else {
        parallel_chunks(threads, chunks, count_marks, &k);
        k.count = 0;
        for (int64_t c = 0; c < chunks; c++) { /* where each chunk's ids go */
            int64_t n = chunk_found[c];
            chunk_found[c] = k.count;
            k.count += n;
        }
        parallel_chunks(threads, chunks, read_marks, &k);
    }
    parallel_chunks(threads, chunks, put_found, &k);
    return k.count;
}

struct lookup {
    const int64_t *table, *ids;
    const uint8_t *mark;
    int64_t size, n, chunks;
    int64_t *out, *chunk_bad;
};

static void lookup_chunk(void *ctx, int64_t c) {
    const struct lookup *k = (const struct lookup *)ctx;
    const int64_t *restrict table = k->table, *ids = k->ids; /* ids and out may be one array: not restrict */
    const uint8_t *restrict mark = k->mark;
    int64_t *out = k->out;
    const uint64_t size = (uint64_t)k->size;
    int64_t i = chunk_start(k->n, k->chunks, c), end = chunk_start(k->n, k->chunks, c + 1);
    for (; i < end; i++) {
        if (i + AHEAD < end && (uint64_t)ids[i + AHEAD] < size) {
            PREFETCH(table + ids[i + AHEAD]);
            PREFETCH(mark + ids[i + AHEAD]);
        }
        int64_t id = ids[i];
        if ((uint64_t)id >= size) {
            k->chunk_bad[c] = -1 - i;
            return;
        }
        out[i] = table[id] | -(int64_t)(mark[id] != 2); /* -1 outside the map, with no branch */
    }
}

/* A dense map's lookups: out[i] = table[ids[i]] where the id is in the map (its state 2), else -1. The table
 * itself is not cleared between batches (only the state bytes are), so an entry outside the map is stale.
 * out may be ids itself (a walk's last hop looks its sources up in place, in the edge index); an id out of
 * range is reported before its own entry is written.
 * Returns 0, or -1 - the index of an id outside [0, size). chunk_bad: scratch of `chunks` entries. */
int64_t hpcgnn_dense_get(const int64_t *table, const uint8_t *mark, int64_t size, const int64_t *ids, int64_t n,
                         int64_t *out, int64_t chunks, int64_t *chunk_bad, int threads) {
    struct lookup k = {table, ids, mark, size, n, chunks, out, chunk_bad};
    return checked_chunks(threads, chunks, lookup_chunk, &k, chunk_bad, NULL);
}

/* ------------------------------------------------------------------------------------------------------
 * A batch's id map as a hash table: a partitioned rank's, whose memory follows the batch, not the graph.
 * Open addressing with linear probing; keys are -1 where empty. The capacity is a power of two and at
 * least twice the keys the map will hold (native.py grows it before a call), so probes stay short and
 * an insert always finds an empty slot. Threads insert with compare-and-swap: each id goes in once, by
 * whichever thread meets it first, so the ids a round inserts are distinct. Keys are only ever removed
 * all at once (the caller refills them with -1). */

static inline uint64_t hash_slot(int64_t id, int shift) { /* Fibonacci hashing: the product's top bits */
    return ((uint64_t)id * 0x9E3779B97F4A7C15ULL) >> shift;
}

static inline int hash_shift(int64_t capacity) { return 64 - __builtin_ctzll((unsigned long long)capacity); }

struct hashing {
    int64_t *keys, *vals;
    const int64_t *ids, *values;
    int64_t capacity, n, chunks, total;
    int64_t *found, *chunk_found, *out;
};

/* Inserts a chunk's ids absent from the map: with their values (put), or appended to this chunk's part
 * of found, their values left for hpcgnn_hash_number (a round of new ids). */
static void insert_chunk(void *ctx, int64_t c) {
    const struct hashing *k = (const struct hashing *)ctx;
    const int shift = hash_shift(k->capacity);
    const uint64_t mask = (uint64_t)k->capacity - 1;
    int64_t i = chunk_start(k->n, k->chunks, c), end = chunk_start(k->n, k->chunks, c + 1);
    int64_t *out = k->found ? k->found + i : NULL, count = 0;
    for (; i < end; i++) {
        if (i + AHEAD < end && k->ids[i + AHEAD] >= 0)
            PREFETCH_W(k->keys + hash_slot(k->ids[i + AHEAD], shift));
        int64_t id = k->ids[i];
        if (id < 0) { /* not an id: the chunk reports it */
            k->chunk_found[c] = -1 - i;
            return;
        }
        for (uint64_t s = hash_slot(id, shift);; s = (s + 1) & mask) {
            int64_t key = __atomic_load_n(k->keys + s, __ATOMIC_RELAXED);
            if (key == id) break;
            if (key != -1) continue;
            if (__atomic_compare_exchange_n(k->keys + s, &key, id, 0, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
                if (k->values) k->vals[s] = k->values[i];
                if (out) out[count] = id;
                count++;
                break;
            }
            if (key == id) break; /* another thread put it there first */
        }
    }
    k->chunk_found[c] = count;
}

/* Inserts ids[:n] absent from the map. With values (put): as values[i]; found may be NULL. Without:
 * appended to found[count:] (distinct, in no set order), values to be set by hpcgnn_hash_number.
 * Returns the new count, or -1 - i for an id below 0. chunk_found: scratch of `chunks` entries. */
int64_t hpcgnn_hash_insert(int64_t *keys, int64_t *vals, int64_t capacity, const int64_t *ids, const int64_t *values,
                           int64_t n, int64_t *found, int64_t count, int64_t chunks, int64_t *chunk_found, int threads) {
    struct hashing k = {keys, vals, ids, values, capacity, n, chunks, 0, found ? found + count : NULL, chunk_found, NULL};
    parallel_chunks(threads, chunks, insert_chunk, &k);
    return join_parts(found, count, k.found, n, chunks, chunk_found);
}

static inline int64_t hash_find(const int64_t *keys, int64_t capacity, int shift, int64_t id) {
    const uint64_t mask = (uint64_t)capacity - 1;
    if (id < 0) return -1;
    for (uint64_t s = hash_slot(id, shift);; s = (s + 1) & mask) {
        int64_t key = keys[s];
        if (key == id) return (int64_t)s;
        if (key == -1) return -1;
    }
}

static void get_chunk(void *ctx, int64_t c) {
    const struct hashing *k = (const struct hashing *)ctx;
    const int shift = hash_shift(k->capacity);
    for (int64_t i = chunk_start(k->n, k->chunks, c), end = chunk_start(k->n, k->chunks, c + 1); i < end; i++) {
        if (i + AHEAD < end && k->ids[i + AHEAD] >= 0) {
            uint64_t s = hash_slot(k->ids[i + AHEAD], shift);
            PREFETCH(k->keys + s);
            PREFETCH(k->vals + s);
        }
        int64_t s = hash_find(k->keys, k->capacity, shift, k->ids[i]);
        k->out[i] = s < 0 ? -1 : k->vals[s];
    }
}

/* out[i] = the value of ids[i], or -1 where it is not in the map. */
void hpcgnn_hash_get(const int64_t *keys, const int64_t *vals, int64_t capacity, const int64_t *ids, int64_t n,
                     int64_t *out, int64_t chunks, int threads) {
    struct hashing k = {(int64_t *)keys, (int64_t *)vals, ids, NULL, capacity, n, chunks, 0, NULL, NULL, out};
    parallel_chunks(threads, chunks, get_chunk, &k);
}

static void number_chunk(void *ctx, int64_t c) {
    const struct hashing *k = (const struct hashing *)ctx;
    const int shift = hash_shift(k->capacity);
    for (int64_t r = chunk_start(k->n, k->chunks, c), end = chunk_start(k->n, k->chunks, c + 1); r < end; r++)
        k->vals[hash_find(k->keys, k->capacity, shift, k->found[r])] = k->total + r;
}

/* Ends a round of hpcgnn_hash_insert without values: found[:count] (distinct) sorted, as torch.unique
 * gives them, and each given the value total, total + 1, ... */
void hpcgnn_hash_number(int64_t *keys, int64_t *vals, int64_t capacity, int64_t *found, int64_t count, int64_t total,
                        int64_t chunks, int threads) {
    int64_t max_id = 0;
    for (int64_t r = 0; r < count; r++) max_id = found[r] > max_id ? found[r] : max_id;
    radix_sort(found, count, max_id);
    struct hashing k = {keys, vals, found, NULL, capacity, count, chunks, total, found, NULL, NULL};
    parallel_chunks(threads, chunks, number_chunk, &k);
}

/* ------------------------------------------------------------------------------------------------------
 * Feature rows: out[at[i]] = src[index[i]] (at NULL: out[i]), rows of row_bytes. A row's cache lines are asked
 * for AHEAD rows before it is copied, so many rows are on their way from memory at once.
 *
 * A batch's rows of STREAM_BYTES or more are written past the caches (x86's non-temporal stores). They cannot
 * stay in the caches anyway, and a line written the usual way is first read from memory, so a gather of such a
 * batch moved half again as many bytes as it writes. By hand, 527k rows of 512 bytes on 2 threads, two runs:
 * 16.1-17.1 and 12.0-12.8 ms written the usual way, 13.1-15.8 and 8.8-9.5 streamed (one thread: 23.8-31.5
 * against 16.1-18.2). A smaller batch is written the usual way: it can still be in the caches when the model
 * reads it. */
#define STREAM_BYTES ((int64_t)16 << 20)
#define LINE 64

#if defined(__x86_64__)
#include <emmintrin.h>
#if !defined(HPCGNN_NO_F16C)
#include <cpuid.h>
#include <immintrin.h>
/* Whether the CPU has AVX and the OS keeps its registers (cpuid and xgetbv: older compilers' builtins do not all
 * know every feature); with F16C too, where f16c. */
static int has_avx(int f16c) {
    unsigned a, b, c, d, lo, hi;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return 0;
    if (!(c & (1u << 27)) || !(c & (1u << 28)) || (f16c && !(c & (1u << 29)))) return 0; /* OSXSAVE, AVX, F16C */
    __asm__ __volatile__("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return (lo & 6u) == 6u; /* the XMM and YMM states enabled */
}

/* BYTES from s to o through registers: all read, then all written (see stream_lines). */
#define STREAM_BLOCK_AVX(BYTES)                                                                              \
    for (; n - b >= (BYTES); b += (BYTES)) {                                                                 \
        __m256i v[(BYTES) / 32];                                                                             \
        for (int q = 0; q < (BYTES) / 32; q++) v[q] = _mm256_loadu_si256((const __m256i *)(s + b + 32 * q)); \
        for (int q = 0; q < (BYTES) / 32; q++) _mm256_stream_si256((__m256i *)(o + b + 32 * q), v[q]);       \
    }

static inline __attribute__((target("avx"), always_inline)) void stream_lines_avx(char *o, const char *s,
                                                                                size_t n) {
    size_t b = 0;
    STREAM_BLOCK_AVX(512) /* 16 registers */
    STREAM_BLOCK_AVX(256)
    STREAM_BLOCK_AVX(128)
    STREAM_BLOCK_AVX(64)
}

static int avx_streams(void) { /* asked once; threads that race here all store the same answer */
    static int avx = -1;
    int has = __atomic_load_n(&avx, __ATOMIC_RELAXED);
    if (has < 0) __atomic_store_n(&avx, has = has_avx(0), __ATOMIC_RELAXED);
    return has;
}
#else
static int avx_streams(void) { return 0; }
#endif

/* n bytes (whole lines, o at a line's start) from s to o, past the caches: blocks of up to 512 bytes (a row of 128
 * floats whole) read into registers, then written, so that a block's reads all go out before any store can hold them
 * up. Read and written in turn, 32 bytes at a time, a gather of 345k random rows of 512 bytes took 13.5 ms on two
 * threads against 9.5 (30.3 against 22.8 on one; every second row of 690k, 12.5 against 9.0; by hand, medians of 10,
 * on a 2-core AMD EPYC VM). */
#define STREAM_BLOCK_SSE2(BYTES)                                                                          \
    for (; n - b >= (BYTES); b += (BYTES)) {                                                              \
        __m128i v[(BYTES) / 16];                                                                          \
        for (int q = 0; q < (BYTES) / 16; q++) v[q] = _mm_loadu_si128((const __m128i *)(s + b + 16 * q)); \
        for (int q = 0; q < (BYTES) / 16; q++) _mm_stream_si128((__m128i *)(o + b + 16 * q), v[q]);       \
    }

static inline __attribute__((always_inline)) void stream_lines(char *o, const char *s, size_t n) {
    size_t b = 0;
    STREAM_BLOCK_SSE2(256) /* 16 registers */
    STREAM_BLOCK_SSE2(128)
    STREAM_BLOCK_SSE2(64)
}

/* The streamed stores are ordered before whatever this thread does next (the threads' joins then order them for
 * the caller). */
static void stream_done(void) { _mm_sfence(); }
#define CAN_STREAM 1
#else
static inline void stream_lines(char *o, const char *s, size_t n) { memcpy(o, s, n); }
static void stream_done(void) {}
static int avx_streams(void) { return 0; }
#define CAN_STREAM 0
#endif

/* The bytes from which a gather's rows are written past the caches (0: never, on this CPU's kind). */
int64_t hpcgnn_stream_bytes(void) { return CAN_STREAM ? STREAM_BYTES : 0; }

/* Whether a gather writing out_bytes writes them past the caches: 0 no, 1 by SSE2's stores, 2 by AVX's. */
static int streams(int64_t out_bytes) { return CAN_STREAM && out_bytes >= STREAM_BYTES ? 1 + avx_streams() : 0; }

/* memcpy(o, s, n), the whole lines of o streamed (by lines(o, s, bytes)). */
#define COPY_STREAMED(lines)                                                   \
    size_t head = (LINE - ((uintptr_t)o & (LINE - 1))) & (LINE - 1);           \
    if (head > n) head = n;                                                    \
    const size_t body = (n - head) & ~(size_t)(LINE - 1);                      \
    if (head) memcpy(o, s, head); /* (no call where none: a row's lines are whole) */ \
    lines(o + head, s + head, body);                                           \
    if (n - head - body) memcpy(o + head + body, s + head + body, n - head - body);

static inline __attribute__((always_inline)) void copy_streamed(char *o, const char *s, size_t n) {
    COPY_STREAMED(stream_lines)
}
static inline void copy_cached(char *o, const char *s, size_t n) { memcpy(o, s, n); }

struct rows {
    const char *src;
    char *out;
    const int64_t *index, *at;
    int64_t rows, row_bytes, n, chunks, *chunk_bad;
    int stream; /* write past the caches: streams() */
};

/* rows_chunk's loop, with the row copy it is given, inlined: through calls per row (to the copy, and to memcpy for
 * a row's empty head and tail), the 345k random rows above took 13.1 ms on two threads against 10.8 inlined. */
static inline __attribute__((always_inline)) void rows_loop(const struct rows *k, int64_t c,
                                                            void (*copy)(char *, const char *, size_t)) {
    int64_t i = chunk_start(k->n, k->chunks, c), end = chunk_start(k->n, k->chunks, c + 1);
    const size_t size = (size_t)k->row_bytes;
    for (int64_t a = i; a < end && a < i + AHEAD; a++) /* the first rows' checks come with their copies */
        if ((uint64_t)k->index[a] < (uint64_t)k->rows) PREFETCH(k->src + (size_t)k->index[a] * size);
    for (; i < end; i++) {
        if (i + AHEAD < end && (uint64_t)k->index[i + AHEAD] < (uint64_t)k->rows) {
            const char *ahead = k->src + (size_t)k->index[i + AHEAD] * size;
            for (size_t b = 0; b < size; b += 64) PREFETCH(ahead + b);
        }
        int64_t r = k->index[i];
        if ((uint64_t)r >= (uint64_t)k->rows) { /* outside src: the chunk reports it */
            k->chunk_bad[c] = -1 - i;
            break;
        }
        copy(k->out + (size_t)(k->at ? k->at[i] : i) * size, k->src + (size_t)r * size, size);
    }
    if (k->stream) stream_done();
}

#if CAN_STREAM && !defined(HPCGNN_NO_F16C)
static inline __attribute__((target("avx"), always_inline)) void copy_streamed_avx(char *o, const char *s,
                                                                                 size_t n) {
    COPY_STREAMED(stream_lines_avx)
}

__attribute__((target("avx"))) static void rows_chunk_avx(const struct rows *k, int64_t c) {
    rows_loop(k, c, copy_streamed_avx);
}
#else
static void rows_chunk_avx(const struct rows *k, int64_t c) { rows_loop(k, c, copy_streamed); }
#endif

static void rows_chunk(void *ctx, int64_t c) {
    const struct rows *k = (const struct rows *)ctx;
    if (k->stream == 2)
        rows_chunk_avx(k, c);
    else if (k->stream)
        rows_loop(k, c, copy_streamed);
    else
        rows_loop(k, c, copy_cached);
}

/* Copies rows index[:n] of src (rows x row_bytes) into out, at rows at[:n] of it (NULL: rows 0..n-1; the caller
 * checks them); returns 0, or -1 - i for an index outside [0, rows) (out then holds only some of the rows).
 * chunk_bad: scratch of `chunks` entries. job: NULL, or a fresh job buffer for helpers (hpcgnn_job_help). */
int64_t hpcgnn_gather_rows(const void *src, int64_t rows, int64_t row_bytes, const int64_t *index, int64_t n, void *out,
                           const int64_t *at, int64_t chunks, int64_t *chunk_bad, int threads, void *job) {
    struct rows k = {(const char *)src, (char *)out, index, at, rows, row_bytes, n, chunks, chunk_bad,
                     streams(n * row_bytes)};
    return checked_chunks(threads, chunks, rows_chunk, &k, chunk_bad, job);
}

/* Feature rows stored as bfloat16 or float16, gathered as float32: out[i] = src[index[i]] widened, exactly as
 * torch's .float() widens them (a bfloat16 is the top half of the float32 of its value; a float16 is widened by
 * the arithmetic of torch's own scalar conversion, fp16_ieee_to_fp32_value, subnormals and NaNs included). One
 * pass over the rows, where a gather then an upcast would write the narrow rows and read them again. */

static inline uint32_t f32_bits(float f) {
    uint32_t b;
    memcpy(&b, &f, sizeof b);
    return b;
}

static inline float f32_of(uint32_t b) {
    float f;
    memcpy(&f, &b, sizeof f);
    return f;
}

static inline uint32_t f16_widened(uint16_t h) {
    const uint32_t w = (uint32_t)h << 16, sign = w & 0x80000000u, two_w = w + w;
    const float normalized = f32_of((two_w >> 4) + (0xE0u << 23)) * 0x1.0p-112f;
    const float denormalized = f32_of((two_w >> 17) | (126u << 23)) - 0.5f;
    return sign | (two_w < (1u << 27) ? f32_bits(denormalized) : f32_bits(normalized));
}

#if defined(__x86_64__) && !defined(HPCGNN_NO_F16C) /* (set by native.py where this fails) */
/* float16 rows by the CPU's own conversion (F16C: eight values an instruction, the same bits as the arithmetic
 * above, which widens the last few of a row), where the CPU has it: the arithmetic alone, on this build's portable
 * baseline, is slower than torch's gather and upcast (19 ms against 12 for 350k rows of 128 on 2 threads). */
__attribute__((target("avx,f16c"))) static void f16_row_f16c(const uint16_t *s, uint32_t *o, size_t cols, int stream) {
    size_t j = 0;
    if (stream) { /* up to a line's start, then whole lines (16 values) streamed */
        for (; j < cols && ((uintptr_t)(o + j) & (LINE - 1)); j++) o[j] = f16_widened(s[j]);
        for (; j + 16 <= cols; j += 16) {
            _mm256_stream_ps((float *)(o + j), _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(s + j))));
            _mm256_stream_ps((float *)(o + j + 8), _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(s + j + 8))));
        }
    }
    for (; j + 8 <= cols; j += 8)
        _mm256_storeu_ps((float *)(o + j), _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(s + j))));
    for (; j < cols; j++) o[j] = f16_widened(s[j]);
}

/* Whether the CPU has F16C and AVX and the OS keeps the AVX registers. */
int hpcgnn_f16c(void) { return has_avx(1); }
#else /* (not called: hpcgnn_f16c() says no, and the rows take torch's two steps) */
static void f16_row_f16c(const uint16_t *s, uint32_t *o, size_t cols, int stream) {
    (void)stream;
    for (size_t j = 0; j < cols; j++) o[j] = f16_widened(s[j]);
}

int hpcgnn_f16c(void) { return 0; }
#endif

/* A bfloat16 row widened: each value the top half of its float32. */
static void bf16_row(const uint16_t *s, uint32_t *o, size_t cols, int stream) {
    size_t j = 0;
#if CAN_STREAM
    if (stream) { /* up to a line's start, then whole lines (16 values) streamed */
        const __m128i zero = _mm_setzero_si128();
        for (; j < cols && ((uintptr_t)(o + j) & (LINE - 1)); j++) o[j] = (uint32_t)s[j] << 16;
        for (; j + 16 <= cols; j += 16) {
            const __m128i a = _mm_loadu_si128((const __m128i *)(s + j)), b = _mm_loadu_si128((const __m128i *)(s + j + 8));
            _mm_stream_si128((__m128i *)(o + j), _mm_unpacklo_epi16(zero, a));
            _mm_stream_si128((__m128i *)(o + j + 4), _mm_unpackhi_epi16(zero, a));
            _mm_stream_si128((__m128i *)(o + j + 8), _mm_unpacklo_epi16(zero, b));
            _mm_stream_si128((__m128i *)(o + j + 12), _mm_unpackhi_epi16(zero, b));
        }
    }
#else
    (void)stream;
#endif
    for (; j < cols; j++) o[j] = (uint32_t)s[j] << 16;
}

struct wide_rows {
    const uint16_t *src;
    uint32_t *out; /* float32 bits */
    const int64_t *index, *at;
    int64_t rows, cols, n, chunks, *chunk_bad;
    int half;   /* float16 rows (else bfloat16) */
    int stream; /* write past the caches */
};

static void wide_rows_chunk(void *ctx, int64_t c) {
    const struct wide_rows *k = (const struct wide_rows *)ctx;
    int64_t i = chunk_start(k->n, k->chunks, c), end = chunk_start(k->n, k->chunks, c + 1);
    const size_t cols = (size_t)k->cols, row_bytes = cols * sizeof(uint16_t);
    for (int64_t a = i; a < end && a < i + AHEAD; a++)
        if ((uint64_t)k->index[a] < (uint64_t)k->rows) PREFETCH(k->src + (size_t)k->index[a] * cols);
    for (; i < end; i++) {
        if (i + AHEAD < end && (uint64_t)k->index[i + AHEAD] < (uint64_t)k->rows) {
            const char *ahead = (const char *)(k->src + (size_t)k->index[i + AHEAD] * cols);
            for (size_t b = 0; b < row_bytes; b += 64) PREFETCH(ahead + b);
        }
        int64_t r = k->index[i];
        if ((uint64_t)r >= (uint64_t)k->rows) { /* outside src: the chunk reports it */
            k->chunk_bad[c] = -1 - i;
            break;
        }
        const uint16_t *s = k->src + (size_t)r * cols;
        uint32_t *o = k->out + (size_t)(k->at ? k->at[i] : i) * cols;
        if (k->half)
            f16_row_f16c(s, o, cols, k->stream);
        else
            bf16_row(s, o, cols, k->stream);
    }
    if (k->stream) stream_done();
}

/* Rows index[:n] of src (rows x cols; bfloat16, or float16 where half, for CPUs where hpcgnn_f16c() says yes)
 * into out (float32 rows of cols), at rows at[:n] of it as hpcgnn_gather_rows puts them; returns 0, or -1 - i for
 * an index outside [0, rows). chunk_bad: scratch of `chunks` entries; job as hpcgnn_gather_rows takes it. */
int64_t hpcgnn_gather_rows_wide(const void *src, int64_t rows, int64_t cols, int half, const int64_t *index, int64_t n,
                                void *out, const int64_t *at, int64_t chunks, int64_t *chunk_bad, int threads, void *job) {
    struct wide_rows k = {(const uint16_t *)src, (uint32_t *)out, index, at, rows, cols, n, chunks, chunk_bad, half,
                          streams(n * cols * (int64_t)sizeof(float))};
    return checked_chunks(threads, chunks, wide_rows_chunk, &k, chunk_bad, job);
}
