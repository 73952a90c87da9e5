/* The matrix-vector products of a decoding step, for linlm.ops.gemv_kernel: y[r, n] = sum_k x[r, k] w[n, k]
   (+ b[n]) for a few rows r of x [R, K] against a row-major weight w [N, K] (nn.Linear's layout), with b NULL for
   no bias. A step is bound by reading w once: each group of GEMV_GROUP weight rows is read for every row of x while
   it is in the L1 cache, and accumulated in REAL over the K values by a vectorised reduction. Items: blocks of
   GEMV_ROWS weight rows (_kernel_common.h: the fused steps of _step_kernel.c split their products the same way);
   distinct items write distinct outputs, so they may run on any threads. */

#include "_kernel_common.h"

#define GEMV_GROUP 8

void SUF(gemv_rows)(const IO *x, const IO *w, const IO *b, IO *y, int64_t R, int64_t N, int64_t K, int64_t item0,
                    int64_t item1) {
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

/* NAME_par: the items split over an OpenMP team (PAR_ITEMS in _kernel_common.h) */
#ifdef _OPENMP
void SUF(gemv_rows_par)(const IO *x, const IO *w, const IO *b, IO *y, int64_t R, int64_t N, int64_t K,
                        int64_t nitems, int64_t nthreads) {
    PAR_ITEMS(SUF(gemv_rows)(x, w, b, y, R, N, K, i0_, i1_))
}
#endif

#define KERNEL_SELF "_gemv_kernel.c"
#include "_kernel_passes.h"
