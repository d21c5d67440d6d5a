#include "kernels.h"

/* Feature rows: out[at[i]] = src[index[i]] (at NULL: out[i]), rows of row_bytes. A row's cache lines are asked
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

#if defined(__x86_64__) && !defined(HPCGNN_NO_F16C) /* (set by build.py where this fails) */
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
