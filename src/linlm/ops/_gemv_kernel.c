/* The matrix-vector products of a decoding step, for linlm.ops.gemv_kernel: y[r, n] = sum_k x[r, k] w[n, k]
   (+ b[n]) for a few rows r of x [R, K] against a row-major weight w [N, K] (nn.Linear's layout), with b NULL for
   no bias. A step is bound by reading w once: up to GEMV_SEQ_ROWS rows of x, w is read in its memory order, one
   weight row against every row of x (gemv_rows_seq); more rows of x read each group of GEMV_GROUP weight rows for
   every row of x while it is in the L1 cache (gemv_rows_wide). Sums are in REAL, vectorised. Items: blocks of
   GEMV_ROWS weight rows (_kernel_common.h: the fused steps of _step_kernel.c split their products the same way);
   distinct items write distinct outputs, so they may run on any threads. */

#include "_kernel_common.h"

#define Q8_MAX_ROWS 64  /* rows of x per call of gemv_q8 at most (its scales and sums live on the stack) */

#ifndef GEMV_Q8_ONCE
#define GEMV_Q8_ONCE
/* A weight row is read once per step, from memory: the products ask for the bytes GEMV_PREFETCH ahead of the ones
   they sum (prefetchnta: for the L1 cache, not kept in the others), which the hardware prefetcher alone fetched too
   late. On an AMD EPYC Zen 5, 1 thread, float32 rows of 768 from memory read at 20-21 GB/s without and 27-32 with
   it, at 1 to 16 KB ahead (benchmarks/bench_gemv.py measures the kernels). Prefetches do not fault, past the end of
   a weight included. */
#define GEMV_PREFETCH 4096
static inline void prefetch_line(const void *p) { __builtin_prefetch((const char *)p + GEMV_PREFETCH, 0, 0); }
/* dots_q8(w, xq, R, K, out): out[r] = sum_k w[k] x_r[k] for one int8 weight row w [K] against R quantised input
   rows x_r in [-127, 127] (row r at xq + r K, stored as Q8_STORE writes it), exact in int32.

   With AVX-512 VNNI (vpdpbusd: 64 products of an unsigned and a signed byte, summed in fours into int32 lanes, one
   instruction), inputs are stored as x + 128 in [1, 255] and sum_k (x_k + 128) w_k - 128 sum_k w_k is taken: the
   row sum of w is computed once for all R rows (a vpdpbusd against ones), so a product of 64 bytes costs one
   instruction. Lanes and sums wrap modulo 2^32 (vector adds), and the true result fits in int32 for K up to
   133,000, so the difference is exact. Otherwise, with AVX2, 32 products at a time: |x| times w with x's sign
   (vpmaddubsw: pairs summed to int16, at most 2 127^2 < 2^15), pairs of those summed to int32 (vpmaddwd); one
   weight row against one input row reads the weights at the memory's rate, where gcc's own vectorisation of the
   plain loop (widening multiplies) is bound by arithmetic. */
#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
#include <immintrin.h>
#define Q8_STORE(v) ((int8_t)(uint8_t)((v) + 128))
#define GEMV_Q8_FORM 2

static inline int32_t hsum_epi32_512(__m512i v) {
    const __m256i a = _mm256_add_epi32(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64(v, 1));
    __m128i h = _mm_add_epi32(_mm256_castsi256_si128(a), _mm256_extracti128_si256(a, 1));
    h = _mm_add_epi32(h, _mm_shuffle_epi32(h, 0x4e));
    h = _mm_add_epi32(h, _mm_shuffle_epi32(h, 0xb1));
    return _mm_cvtsi128_si32(h);
}

static inline void dots_q8(const int8_t *restrict w, const int8_t *restrict xq, int64_t R, int64_t K,
                           int32_t *restrict out) {
    const int64_t full = K & ~(int64_t)63;
    const __mmask64 tail = K > full ? ~(__mmask64)0 >> (64 - (K - full)) : 0;
    const __m512i ones = _mm512_set1_epi8(1);
    __m512i sw = _mm512_setzero_si512();
    for (int64_t k = 0; k < full; k += 64) {
        prefetch_line(w + k);
        sw = _mm512_dpbusd_epi32(sw, ones, _mm512_loadu_si512(w + k));
    }
    if (tail) sw = _mm512_dpbusd_epi32(sw, ones, _mm512_maskz_loadu_epi8(tail, w + full));
    const __m512i corr = _mm512_slli_epi32(sw, 7);
    for (int64_t r = 0; r < R; r++) {  /* w's row stays in the L1 cache across the R input rows */
        const int8_t *restrict xr = xq + r * K;
        __m512i a0 = _mm512_setzero_si512(), a1 = _mm512_setzero_si512();  /* two chains: half the latency */
        int64_t k = 0;
        for (; k + 128 <= full; k += 128) {
            a0 = _mm512_dpbusd_epi32(a0, _mm512_loadu_si512(xr + k), _mm512_loadu_si512(w + k));
            a1 = _mm512_dpbusd_epi32(a1, _mm512_loadu_si512(xr + k + 64), _mm512_loadu_si512(w + k + 64));
        }
        if (k < full) a0 = _mm512_dpbusd_epi32(a0, _mm512_loadu_si512(xr + k), _mm512_loadu_si512(w + k));
        if (tail)  /* past K both loads give zeros: no product and no part of the row sum */
            a1 = _mm512_dpbusd_epi32(a1, _mm512_maskz_loadu_epi8(tail, xr + full),
                                     _mm512_maskz_loadu_epi8(tail, w + full));
        out[r] = hsum_epi32_512(_mm512_sub_epi32(_mm512_add_epi32(a0, a1), corr));
    }
}
#else
#define Q8_STORE(v) ((int8_t)(v))
#ifdef __AVX2__
#include <immintrin.h>
#define GEMV_Q8_FORM 1
static inline int32_t dot_q8(const int8_t *restrict w, const int8_t *restrict x, int64_t K) {
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i acc = _mm256_setzero_si256();
    int64_t k = 0;
    for (; k + 32 <= K; k += 32) {
        const __m256i xv = _mm256_loadu_si256((const __m256i *)(x + k));
        const __m256i wv = _mm256_loadu_si256((const __m256i *)(w + k));
        const __m256i p = _mm256_maddubs_epi16(_mm256_sign_epi8(xv, xv), _mm256_sign_epi8(wv, xv));
        acc = _mm256_add_epi32(acc, _mm256_madd_epi16(p, ones));
    }
    __m128i h = _mm_add_epi32(_mm256_castsi256_si128(acc), _mm256_extracti128_si256(acc, 1));
    h = _mm_add_epi32(h, _mm_shuffle_epi32(h, 0x4e));
    h = _mm_add_epi32(h, _mm_shuffle_epi32(h, 0xb1));
    int32_t a = _mm_cvtsi128_si32(h);
    for (; k < K; k++) a += (int16_t)w[k] * (int16_t)x[k];
    return a;
}
#else
#define GEMV_Q8_FORM 0
static inline int32_t dot_q8(const int8_t *restrict w, const int8_t *restrict x, int64_t K) {
    int32_t a = 0;
#pragma omp simd reduction(+ : a)
    for (int64_t k = 0; k < K; k++) a += (int16_t)w[k] * (int16_t)x[k];
    return a;
}
#endif
static inline void dots_q8(const int8_t *restrict w, const int8_t *restrict xq, int64_t R, int64_t K,
                           int32_t *restrict out) {
    for (int64_t k = 0; k < K; k += 64) prefetch_line(w + k);
    for (int64_t r = 0; r < R; r++) out[r] = dot_q8(w, xq + r * K, K);
}
#endif

/* which of the forms above this build computes with: 2 AVX-512 VNNI, 1 AVX2, 0 portable C (linlm check says) */
int gemv_q8_form(void) { return GEMV_Q8_FORM; }
#endif /* GEMV_Q8_ONCE */

#ifndef GEMV_LANES
#define GEMV_LANES 64     /* partial sums of a dot product in gemv_rows_seq: four 512-bit chains of float32 */
#define GEMV_SEQ_ROWS 4   /* inputs of up to this many rows take gemv_rows_seq */
#define GEMV_GROUP 8      /* weight rows side by side in gemv_rows_wide */
#endif

/* Up to GEMV_SEQ_ROWS input rows: one weight row at a time, each against every input row (GEMV_LANES partial sums
   over blocks of K, then the last K % GEMV_LANES terms, then the partial sums), so that the weights are read in
   their memory order, which the hardware prefetcher follows; gemv_rows_wide's eight streams K apart, restarting
   every eight rows, read slower from memory at these row counts, while from 5 rows on its eight chains per input
   row win (benchmarks/bench_gemv.py prints the rate at each row count). */
static void SUF(gemv_rows_seq)(const IO *x, const IO *w, const IO *b, IO *y, int64_t R, int64_t N, int64_t K,
                               int64_t item0, int64_t item1) {
    const int64_t Kb = K / GEMV_LANES * GEMV_LANES;
    for (int64_t item = item0; item < item1; item++) {
        const int64_t n1 = (item + 1) * GEMV_ROWS < N ? (item + 1) * GEMV_ROWS : N;
        for (int64_t n = item * GEMV_ROWS; n < n1; n++) {
            const IO *restrict wn = w + n * K;
            for (int64_t r = 0; r < R; r++) {
                const IO *restrict xr = x + r * K;
                REAL acc[GEMV_LANES] = {0};
                for (int64_t k = 0; k < Kb; k += GEMV_LANES) {
                    if (r == 0)  /* the cache lines of this block, GEMV_PREFETCH bytes on */
                        for (int64_t l = 0; l < GEMV_LANES * (int64_t)sizeof(IO); l += 64)
                            prefetch_line((const char *)(wn + k) + l);
#pragma omp simd
                    for (int j = 0; j < GEMV_LANES; j++) acc[j] += LD(wn[k + j]) * LD(xr[k + j]);
                }
                REAL a = 0;
                for (int64_t k = Kb; k < K; k++) a += LD(wn[k]) * LD(xr[k]);
#pragma omp simd reduction(+ : a)
                for (int j = 0; j < GEMV_LANES; j++) a += acc[j];
                y[r * N + n] = ST(b ? a + LD(b[n]) : a);
            }
        }
    }
}

/* More input rows: GEMV_GROUP weight rows side by side, each group read for every row of x while it is in the
   L1 cache, eight chains of sums per input row. */

static void SUF(gemv_rows_wide)(const IO *x, const IO *w, const IO *b, IO *y, int64_t R, int64_t N, int64_t K,
                                int64_t item0, int64_t item1) {
    for (int64_t item = item0; item < item1; item++) {
        const int64_t n1 = (item + 1) * GEMV_ROWS < N ? (item + 1) * GEMV_ROWS : N;
        int64_t n = item * GEMV_ROWS;
        for (; n + GEMV_GROUP <= n1; n += GEMV_GROUP) {
            const IO *restrict w0 = w + n * K, *restrict w1 = w0 + K, *restrict w2 = w1 + K, *restrict w3 = w2 + K;
            const IO *restrict w4 = w3 + K, *restrict w5 = w4 + K, *restrict w6 = w5 + K, *restrict w7 = w6 + K;
            for (int64_t r = 0; r < R; r++) {
                const IO *restrict xr = x + r * K;
                REAL a0 = 0, a1 = 0, a2 = 0, a3 = 0, a4 = 0, a5 = 0, a6 = 0, a7 = 0;
#pragma omp simd reduction(+ : a0, a1, a2, a3, a4, a5, a6, a7)
                for (int64_t k = 0; k < K; k++) {
                    const REAL v = LD(xr[k]);
                    a0 += LD(w0[k]) * v;
                    a1 += LD(w1[k]) * v;
                    a2 += LD(w2[k]) * v;
                    a3 += LD(w3[k]) * v;
                    a4 += LD(w4[k]) * v;
                    a5 += LD(w5[k]) * v;
                    a6 += LD(w6[k]) * v;
                    a7 += LD(w7[k]) * v;
                }
                IO *restrict yr = y + r * N + n;
                const REAL acc[GEMV_GROUP] = {a0, a1, a2, a3, a4, a5, a6, a7};
                for (int j = 0; j < GEMV_GROUP; j++) yr[j] = ST(b ? acc[j] + LD(b[n + j]) : acc[j]);
            }
        }
        for (; n < n1; n++) {
            const IO *restrict wn = w + n * K;
            for (int64_t r = 0; r < R; r++) {
                const IO *restrict xr = x + r * K;
                REAL a = 0;
#pragma omp simd reduction(+ : a)
                for (int64_t k = 0; k < K; k++) a += LD(wn[k]) * LD(xr[k]);
                y[r * N + n] = ST(b ? a + LD(b[n]) : a);
            }
        }
    }
}

void SUF(gemv_rows)(const IO *x, const IO *w, const IO *b, IO *y, int64_t R, int64_t N, int64_t K, int64_t item0,
                    int64_t item1) {
    if (R <= GEMV_SEQ_ROWS)
        SUF(gemv_rows_seq)(x, w, b, y, R, N, K, item0, item1);
    else
        SUF(gemv_rows_wide)(x, w, b, y, R, N, K, item0, item1);
}

/* The same products with int8 weights, for linlm.models.quant: y[r, n] = s[n] xs[r] sum_k q[n, k] xq[r, k] (+ b[n])
   for q [N, K] int8 with a scale per weight row s [N] (W ~ q s), and the input's rows quantised on the fly,
   symmetric with a scale each: xs[r] = max_k |x[r, k]| / 127, xq[r, k] = round(x[r, k] / xs[r]) (a row of zeros
   gets xs = 0: its outputs are b). The sums are exact in int32 (|q xq| <= 127^2, so K up to 133,000). Each call
   quantises x into its own scratch xq [R, K] (at most Q8_MAX_ROWS rows: cheaper than a second call), then
   computes its items: blocks of GEMV_ROWS weight rows, each weight row against every input row while it is in the
   L1 cache (dots_q8), so that the weights are read from memory once for all R rows. */
void SUF(gemv_q8)(const IO *x, const int8_t *q, const float *s, const IO *b, IO *y, int8_t *xq, int64_t R,
                  int64_t N, int64_t K, int64_t item0, int64_t item1) {
    if (item0 >= item1) return;
    REAL xs[Q8_MAX_ROWS];
    for (int64_t r = 0; r < R; r++) {
        const IO *restrict xr = x + r * K;
        int8_t *restrict qr = xq + r * K;
        REAL m = 0;
        for (int64_t k = 0; k < K; k++) {
            const REAL a = FABS(LD(xr[k]));
            m = a > m ? a : m;
        }
        xs[r] = m / (REAL)127;
        const REAL inv = m > 0 ? (REAL)127 / m : (REAL)0;
#pragma omp simd
        for (int64_t k = 0; k < K; k++) {
            const REAL v = LD(xr[k]) * inv;  /* in [-127, 127]: rounded half away from zero */
            qr[k] = Q8_STORE((int32_t)(v + COPYSIGN((REAL)0.5, v)));
        }
    }
    for (int64_t item = item0; item < item1; item++) {
        const int64_t n1 = (item + 1) * GEMV_ROWS < N ? (item + 1) * GEMV_ROWS : N;
        for (int64_t n = item * GEMV_ROWS; n < n1; n++) {
            int32_t sums[Q8_MAX_ROWS];
            dots_q8(q + n * K, xq, R, K, sums);
            for (int64_t r = 0; r < R; r++) {
                const REAL v = (REAL)sums[r] * ((REAL)s[n] * xs[r]);
                y[r * N + n] = ST(b ? v + LD(b[n]) : v);
            }
        }
    }
}

/* NAME_par: the items split over an OpenMP team (PAR_ITEMS in _kernel_common.h) */
#ifdef _OPENMP
void SUF(gemv_rows_par)(const IO *x, const IO *w, const IO *b, IO *y, int64_t R, int64_t N, int64_t K,
                        int64_t nitems, int64_t nthreads) {
    PAR_ITEMS(SUF(gemv_rows)(x, w, b, y, R, N, K, i0_, i1_))
}

void SUF(gemv_q8_par)(const IO *x, const int8_t *q, const float *s, const IO *b, IO *y, int8_t *xq, int64_t xq_stride,
                      int64_t R, int64_t N, int64_t K, int64_t nitems, int64_t nthreads) {
    PAR_ITEMS(SUF(gemv_q8)(x, q, s, b, y, xq + w_ * xq_stride, R, N, K, i0_, i1_))
}
#endif

#define KERNEL_SELF "_gemv_kernel.c"
#include "_kernel_passes.h"
