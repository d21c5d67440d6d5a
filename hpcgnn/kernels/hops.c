/* A hop of the neighbour sampler: its plan (the output slots, the nodes that draw), then its draws (Floyd's, from
 * the hop's key) and its rows and neighbours written. */
#include "kernels.h"

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
    int64_t *row_out, *nbr_out, *eid_out;
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
        /* ...the positions kept where the edges' ids are asked for (where their features are)... */
        if (h->eid_out) memcpy(h->eid_out + first_slot, h->nbr_out + first_slot, (size_t)(slot - first_slot) * 8);
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
 * hpcgnn_hop_plan cut them. eid_out (or NULL): each edge's position in col, its id. */
void hpcgnn_hop_fill(const int64_t *rowptr, const void *col, int col_is_int32, const int64_t *nodes, int64_t m,
                     int64_t fanout, int64_t chunks, const int64_t *chunk_slot, const int64_t *chunk_big,
                     int64_t key, int64_t nbig, int64_t row_base, int64_t *row_out, int64_t *nbr_out,
                     int64_t *eid_out, int threads) {
    struct hop h = {rowptr, nodes, chunk_slot, chunk_big, col, col_is_int32, m, fanout, chunks, nbig, row_base,
                    (uint64_t)key, row_out, nbr_out, eid_out};
    parallel_chunks(threads, chunks, hop_chunk, &h);
}
