#include "kernels.h"

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("fp-contract=off") /* no fused multiply-add, whatever the target: the twin's floats */
#endif

/* Exact inference's aggregation straight from the CSR: for target rows lo..hi, the sum (or mean) of their in-
 * neighbours' input rows, each row read once per edge into an accumulator in the output row (float32), never a
 * message per edge in memory. Rows stored as bfloat16 or float16 are widened in registers on the way (bit for bit
 * as torch's .float()), so a narrow table moves half the bytes.
 *
 * GCN's weights come from the nodes' inverse square-root degrees (dinv, float64, by the table's row): an edge s->t
 * weighs (float)(dinv[s] * dinv[t]), as hpcgnn.sampling.transforms.GCNNorm computes it, and its self-loop comes
 * last in the row (self_loop), as GCNNorm puts it there. Each row is summed in its edges' order, starting from 0:
 * what torch's index_add_ does on the host (kernels/twins.py), so the twin gives the same floats (no contraction
 * into fused multiply-adds: this file is compiled for the portable baseline, which has none).
 *
 * Work is cut into chunks of target rows; what a chunk writes depends only on its rows, so the output is the same
 * on any number of threads, and for any split of the rows between ranks. */

static inline float f16_value(uint16_t h) { /* torch's own scalar conversion (gather.c's f16_widened) */
    const uint32_t w = (uint32_t)h << 16, sign = w & 0x80000000u, two_w = w + w;
    float normalized, denormalized, f;
    uint32_t a = (two_w >> 4) + (0xE0u << 23), b = (two_w >> 17) | (126u << 23), out;
    memcpy(&normalized, &a, sizeof a);
    memcpy(&denormalized, &b, sizeof b);
    normalized *= 0x1.0p-112f;
    denormalized -= 0.5f;
    memcpy(&out, two_w < (1u << 27) ? &denormalized : &normalized, sizeof out);
    out |= sign;
    memcpy(&f, &out, sizeof f);
    return f;
}

static inline float bf16_value(uint16_t h) {
    const uint32_t w = (uint32_t)h << 16;
    float f;
    memcpy(&f, &w, sizeof f);
    return f;
}

struct agg {
    const int64_t *rowptr;
    const void *col;
    int col32;
    const void *x; /* rows x cols: float32 (kind 0), bfloat16 (1) or float16 (2) */
    int kind;
    int64_t rows, cols, lo, hi, chunks, *chunk_bad;
    const double *dinv; /* GCN's weights, by row of x (NULL: every edge weighs 1) */
    const float *ew, *sw; /* per edge (from rowptr[lo]) and per self-loop (from row lo): heads weights each */
    int64_t heads;        /* ew's weights apply to heads equal slices of a row (GAT's heads) */
    int self_loop, mean;
    float *out; /* (hi - lo) x cols */
};

static inline int64_t col_at(const struct agg *k, int64_t e) {
    return k->col32 ? (int64_t)((const int32_t *)k->col)[e] : ((const int64_t *)k->col)[e];
}

/* acc[0:n] += w * x's values from offset o on (w == 1 adds them exactly as they are: 1 * v is v). */
static inline void add_slice(const struct agg *k, float *acc, size_t o, size_t n, float w) {
    if (k->kind == 0) {
        const float *x = (const float *)k->x + o;
        for (size_t j = 0; j < n; j++) acc[j] += w * x[j];
    } else if (k->kind == 1) {
        const uint16_t *x = (const uint16_t *)k->x + o;
        for (size_t j = 0; j < n; j++) acc[j] += w * bf16_value(x[j]);
    } else {
        const uint16_t *x = (const uint16_t *)k->x + o;
        for (size_t j = 0; j < n; j++) acc[j] += w * f16_value(x[j]);
    }
}

/* acc += w * row s of x. */
static inline void add_row(const struct agg *k, float *acc, int64_t s, float w) {
    add_slice(k, acc, (size_t)s * (size_t)k->cols, (size_t)k->cols, w);
}

/* acc += w[h] * slice h of row s of x, for each of the heads equal slices (GAT: a weight per head). */
static inline void add_heads(const struct agg *k, float *acc, int64_t s, const float *w) {
    const size_t per = (size_t)(k->cols / k->heads), at = (size_t)s * (size_t)k->cols;
    for (int64_t h = 0; h < k->heads; h++) add_slice(k, acc + (size_t)h * per, at + (size_t)h * per, per, w[h]);
}

/* Built three times, chosen when the library loads (an ifunc): for AVX-512, for AVX2 (eight floats an instruction,
 * bfloat16 widened eight at a time) and for the portable baseline; none fuses a multiply into an add (the pragma
 * above), so all give the twin's floats. By hand, the mean of 128-float rows over 25M edges into 500k rows, 2
 * threads: float32 rows 0.73 s on the baseline alone, 0.63-0.68 with AVX2, 0.60-0.64 with AVX-512 (21 GB/s of rows
 * read); bfloat16 rows 0.79, 0.50 and 0.48 s. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(HPCGNN_NO_F16C)
__attribute__((target_clones("avx512f", "avx2", "default")))
#endif
static void agg_chunk(void *ctx, int64_t c) {
    const struct agg *k = (const struct agg *)ctx;
    const int64_t n = k->hi - k->lo;
    int64_t r = k->lo + chunk_start(n, k->chunks, c), end = k->lo + chunk_start(n, k->chunks, c + 1);
    const size_t cols = (size_t)k->cols;
    const size_t row_bytes = cols * (k->kind ? 2 : 4);
    const char *base = (const char *)k->x;
    const int weighted = k->dinv != NULL;
    if (r >= end) return;
    int64_t e = k->rowptr[r], stop = k->rowptr[end];
    const int64_t e0 = k->rowptr[k->lo]; /* where ew starts */
    for (int64_t a = e; a < stop && a < e + AHEAD; a++) { /* the first rows on their way */
        int64_t s = col_at(k, a);
        if ((uint64_t)s < (uint64_t)k->rows) PREFETCH(base + (size_t)s * row_bytes);
    }
    for (; r < end; r++) {
        float *acc = k->out + (size_t)(r - k->lo) * cols;
        for (size_t j = 0; j < cols; j++) acc[j] = 0.0f;
        const int64_t row_end = k->rowptr[r + 1];
        const double dt = weighted ? k->dinv[r] : 1.0;
        for (; e < row_end; e++) {
            if (e + AHEAD < stop) {
                int64_t ahead = col_at(k, e + AHEAD);
                if ((uint64_t)ahead < (uint64_t)k->rows)
                    for (size_t b = 0; b < row_bytes; b += 64) PREFETCH(base + (size_t)ahead * row_bytes + b);
            }
            int64_t s = col_at(k, e);
            if ((uint64_t)s >= (uint64_t)k->rows) { /* outside x: the chunk reports it */
                k->chunk_bad[c] = -1 - e;
                return;
            }
            if (k->ew)
                add_heads(k, acc, s, k->ew + (size_t)(e - e0) * (size_t)k->heads);
            else
                add_row(k, acc, s, weighted ? (float)(k->dinv[s] * dt) : 1.0f);
        }
        if (k->self_loop) {
            if (k->sw)
                add_heads(k, acc, r, k->sw + (size_t)(r - k->lo) * (size_t)k->heads);
            else
                add_row(k, acc, r, weighted ? (float)(dt * dt) : 1.0f);
        }
        if (k->mean) {
            const int64_t deg = k->rowptr[r + 1] - k->rowptr[r] + (k->self_loop ? 1 : 0);
            if (deg > 0) {
                const float d = (float)deg;
                for (size_t j = 0; j < cols; j++) acc[j] /= d;
            }
        }
    }
}

/* out[r - lo] = the (weighted) sum of rows col[rowptr[r]:rowptr[r + 1]] of x (rows x cols; kind 0 float32, 1
 * bfloat16, 2 float16), then row r itself where self_loop, divided by that count where mean (a row with none stays
 * 0), for r in lo..hi; dinv: NULL, or GCN's inverse square-root degrees by row of x (an edge s->r weighs
 * (float)(dinv[s] * dinv[r])); ew: NULL, or heads weights per edge (from rowptr[lo]: GAT's attention, each for one
 * of heads equal slices of a row), sw the same per row's self-loop. Returns 0, or -1 - e for an edge whose source
 * is outside x (out is then partly written). chunk_bad: scratch of `chunks` entries. The caller checks lo <= hi <= rows of rowptr - 1, and that
 * self_loop's rows r are rows of x. */
int64_t hpcgnn_aggregate_rows(const int64_t *rowptr, const void *col, int col32, const void *x, int kind, int64_t rows,
                              int64_t cols, int64_t lo, int64_t hi, const double *dinv, const float *ew,
                              const float *sw, int64_t heads, int self_loop, int mean, void *out, int64_t chunks,
                              int64_t *chunk_bad, int threads) {
    struct agg k = {rowptr, col, col32, x, kind, rows, cols, lo, hi, chunks, chunk_bad, dinv, ew, sw, heads,
                    self_loop, mean, (float *)out};
    return checked_chunks(threads, chunks, agg_chunk, &k, chunk_bad, NULL);
}
