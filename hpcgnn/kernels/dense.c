/* A replicated rank's id map: an array over every id, and a state byte per id that says which are in the map. */
#include "kernels.h"

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
