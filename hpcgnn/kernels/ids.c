/* Id lists the maps share: the parts chunks found, joined; a list sorted (radix). */
#include "kernels.h"

/* After chunks that each wrote their ids at the start of their own part of found (chunk c's part begins at
 * chunk_start(n, chunks, c), chunk_found[c] ids long, or holds -1 - i for a bad id i): the first bad id's
 * code, or the parts moved together after found[:count] and the new count. */
int64_t join_parts(int64_t *found, int64_t count, int64_t *parts, int64_t n, int64_t chunks,
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

static int compare_ids(const void *x, const void *y) {
    int64_t a = *(const int64_t *)x, b = *(const int64_t *)y;
    return (a > b) - (a < b);
}

void radix_sort(int64_t *a, int64_t n, int64_t max_id) {
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
