/* The thread pool and its jobs: work cut into chunks that a team of threads takes from one counter. */
#include "kernels.h"

/* The source this library was built from (the first 16 hex digits of the SHA-256 of the sources, passed by whoever
 * builds it: setup.py, hpcgnn/kernels/build.py): a library that answers otherwise is not used. */
#ifndef HPCGNN_SOURCE_HASH
#define HPCGNN_SOURCE_HASH "unknown"
#endif
const char *hpcgnn_source_hash(void) { return HPCGNN_SOURCE_HASH; }

int64_t hpcgnn_job_bytes(void) { return (int64_t)sizeof(struct job); }

/* The counter's value before adding 1 to it, atomically: processes that map the same memory (the ranks of a node
 * sharing a table, hpcgnn.dist.node_table) take chunks of work in turn from it, as a team's threads do here. */
int64_t hpcgnn_take_next(int64_t *counter) { return __atomic_fetch_add(counter, 1, __ATOMIC_RELAXED); }

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
void shared_chunks(int threads, int64_t chunks, chunk_fn fn, void *ctx, struct job *j) {
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
void parallel_chunks(int threads, int64_t chunks, chunk_fn fn, void *ctx) {
    struct job j = {0, 0, 0, NULL, NULL};
    shared_chunks(threads, chunks, fn, ctx, &j);
}

/* parallel_chunks for kernels that check their items: a chunk that meets a bad one writes -1 - its index to
 * chunk_bad[chunk] (scratch of `chunks` entries) and stops. Returns 0, or the first chunk's such code. job: NULL,
 * or a fresh job buffer that helpers may be handed (shared_chunks). */
int64_t checked_chunks(int threads, int64_t chunks, chunk_fn fn, void *ctx, int64_t *chunk_bad, void *job) {
    for (int64_t c = 0; c < chunks; c++) chunk_bad[c] = 0;
    if (job)
        shared_chunks(threads, chunks, fn, ctx, (struct job *)job);
    else
        parallel_chunks(threads, chunks, fn, ctx);
    for (int64_t c = 0; c < chunks; c++)
        if (chunk_bad[c] < 0) return chunk_bad[c];
    return 0;
}
