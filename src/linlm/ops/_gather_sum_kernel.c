/* The gather-sum of rows behind the mixtures of experts' read-back, for linlm.ops.gather_sum_kernel:
   out[n] = sum_j w[n, j] src[idx[n, j]] over the m entries of row n of idx [M, m] (w [M, m]), src and out rows of D
   contiguous values, where no src row is read twice (each expert slot is one token's; a permutation of the slots in
   the MLP's combine). Items: blocks of GATHER_ROWS output rows. The backward: dsrc[idx[n, j]] = w[n, j] dout[n], a
   plain store as no row is read twice (rows that no entry reads are not touched: the caller zeroes them), and
   dw[n, j] = dout[n] . src[idx[n, j]], both from one read of dout[n] and of the row. Distinct items write distinct
   rows, so they may run on any threads. */

#include "_kernel_common.h"

#define GATHER_ROWS 32

void SUF(gather_sum_fwd)(const IO *src, const int64_t *idx, const REAL *w, IO *out, int64_t M, int64_t m,
                         int64_t D, int64_t item0, int64_t item1) {
#if !IO_IS_REAL
    REAL acc_row[D];  /* the row's sum, in REAL; the output row itself where IO is REAL */
#endif
    for (int64_t item = item0; item < item1; item++) {
        const int64_t n1 = (item + 1) * GATHER_ROWS < M ? (item + 1) * GATHER_ROWS : M;
        for (int64_t n = item * GATHER_ROWS; n < n1; n++) {
            IO *restrict o = out + n * D;
#if IO_IS_REAL
            REAL *restrict acc = o;
#else
            REAL *restrict acc = acc_row;
#endif
            const IO *restrict s0 = src + idx[n * m] * D;
            const REAL w0 = w[n * m];
#pragma omp simd
            for (int64_t c = 0; c < D; c++) acc[c] = w0 * LD(s0[c]);
            for (int64_t j = 1; j < m; j++) {
                const IO *restrict sj = src + idx[n * m + j] * D;
                const REAL wj = w[n * m + j];
#pragma omp simd
                for (int64_t c = 0; c < D; c++) acc[c] += wj * LD(sj[c]);
            }
#if !IO_IS_REAL
#pragma omp simd
            for (int64_t c = 0; c < D; c++) o[c] = ST(acc[c]);
#endif
        }
    }
}

void SUF(gather_sum_bwd)(const IO *dout, const IO *src, const int64_t *idx, const REAL *w, IO *dsrc, REAL *dw,
                         int64_t M, int64_t m, int64_t D, int64_t item0, int64_t item1) {
#if !IO_IS_REAL
    REAL gv_row[D];  /* the output gradient's row, widened once for its m slots */
#endif
    for (int64_t item = item0; item < item1; item++) {
        const int64_t n1 = (item + 1) * GATHER_ROWS < M ? (item + 1) * GATHER_ROWS : M;
        for (int64_t n = item * GATHER_ROWS; n < n1; n++) {
            const IO *restrict g = dout + n * D;
#if IO_IS_REAL
            const REAL *restrict gv = g;
#else
            REAL *restrict gv = gv_row;
#pragma omp simd
            for (int64_t c = 0; c < D; c++) gv[c] = LD(g[c]);
#endif
            for (int64_t j = 0; j < m; j++) {
                const int64_t r = idx[n * m + j];
                const IO *restrict sr = src + r * D;
                IO *restrict ds = dsrc + r * D;
                const REAL wj = w[n * m + j];
                REAL acc = 0;
#pragma omp simd reduction(+ : acc)
                for (int64_t c = 0; c < D; c++) {
                    acc += gv[c] * LD(sr[c]);
                    ds[c] = ST(wj * gv[c]);
                }
                dw[n * m + j] = acc;
            }
        }
    }
}

/* NAME_par: the items split over an OpenMP team (PAR_ITEMS in _kernel_common.h) */
#ifdef _OPENMP
void SUF(gather_sum_fwd_par)(const IO *src, const int64_t *idx, const REAL *w, IO *out, int64_t M, int64_t m,
                             int64_t D, int64_t nitems, int64_t nthreads) {
    PAR_ITEMS(SUF(gather_sum_fwd)(src, idx, w, out, M, m, D, i0_, i1_))
}

void SUF(gather_sum_bwd_par)(const IO *dout, const IO *src, const int64_t *idx, const REAL *w, IO *dsrc,
                             REAL *dw, int64_t M, int64_t m, int64_t D, int64_t nitems, int64_t nthreads) {
    PAR_ITEMS(SUF(gather_sum_bwd)(dout, src, idx, w, dsrc, dw, M, m, D, i0_, i1_))
}
#endif

#define KERNEL_SELF "_gather_sum_kernel.c"
#include "_kernel_passes.h"
