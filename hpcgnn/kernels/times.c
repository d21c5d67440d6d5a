/* Time-respecting sampling's bounds: for each frontier node, the part of its neighbour list (sorted by time within
 * each row) that it may draw from as of its own time. The hop then draws from those parts as from rows of a CSR
 * (hops.c, unchanged): the bounds are written interleaved, lo and hi of node i at 2i and 2i + 1. */
#include "kernels.h"

struct bounds {
    const int64_t *rowptr, *nodes;
    const void *times, *at, *window;
    int is_float, strict;
    int64_t rows, m, last, chunks;
    int64_t *out, *chunk_bad;
};

/* The first position in [lo, hi) whose time is after t (at or after t when `from`: the window's first edge, or a
 * strict bound's end), hi if none: a binary search of a sorted list, the same steps its torch twin takes. */
#define FIRST_AFTER(T)                                                                                       \
    static int64_t first_after_##T(const T *times, int64_t lo, int64_t hi, T t, int from) {                \
        while (lo < hi) {                                                                                    \
            int64_t mid = lo + (hi - lo) / 2;                                                                \
            if (from ? times[mid] >= t : times[mid] > t)                                                     \
                hi = mid;                                                                                    \
            else                                                                                             \
                lo = mid + 1;                                                                                \
        }                                                                                                    \
        return lo;                                                                                           \
    }
FIRST_AFTER(int64_t)
FIRST_AFTER(double)

static void bounds_chunk(void *ctx, int64_t c) {
    const struct bounds *k = (const struct bounds *)ctx;
    for (int64_t i = chunk_start(k->m, k->chunks, c), end = chunk_start(k->m, k->chunks, c + 1); i < end; i++) {
        if ((uint64_t)k->nodes[i] >= (uint64_t)k->rows) {
            k->chunk_bad[c] = -1 - i;
            return;
        }
        int64_t lo = k->rowptr[k->nodes[i]], hi = k->rowptr[k->nodes[i] + 1], stop, start = lo;
        if (k->is_float) {
            const double *times = (const double *)k->times, t = ((const double *)k->at)[i];
            stop = first_after_double(times, lo, hi, t, k->strict);
            if (k->window) start = first_after_double(times, lo, stop, t - *(const double *)k->window, 1);
        } else {
            const int64_t *times = (const int64_t *)k->times, t = ((const int64_t *)k->at)[i];
            stop = first_after_int64_t(times, lo, hi, t, k->strict);
            if (k->window) start = first_after_int64_t(times, lo, stop, t - *(const int64_t *)k->window, 1);
        }
        if (k->last > 0 && stop - start > k->last) start = stop - k->last;
        k->out[2 * i] = start;
        k->out[2 * i + 1] = stop;
    }
}

/* For node i of `nodes` (asked as of time at[i]): the range [lo, hi) of its list in (rowptr, times), each row's
 * times sorted, holding the edges at or before at[i] (before it, when strict), at or after at[i] - *window where
 * window is given (else from the row's start), and only the last `last` of them where last > 0 (the most recent).
 * Times are int64, or double where is_float; at and *window the same. out: 2m entries, lo at 2i, hi at 2i + 1.
 * Returns 0, or -1 - i for the first node i outside [0, rows) (nothing then is to be read of out). */
int64_t hpcgnn_time_bounds(const int64_t *rowptr, int64_t rows, const void *times, int is_float,
                           const int64_t *nodes, const void *at, int64_t m, int strict, const void *window,
                           int64_t last, int64_t chunks, int64_t *chunk_bad, int64_t *out, int threads) {
    struct bounds k = {rowptr, nodes, times, at, window, is_float, strict, rows, m, last, chunks, out, chunk_bad};
    return checked_chunks(threads, chunks, bounds_chunk, &k, chunk_bad, NULL);
}
