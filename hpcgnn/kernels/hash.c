#include "kernels.h"

/* A batch's id map as a hash table: a partitioned rank's, whose memory follows the batch, not the graph.
 * Open addressing with linear probing; keys are -1 where empty. The capacity is a power of two and at
 * least twice the keys the map will hold (hashtable.py grows it before a call), so probes stay short and
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
