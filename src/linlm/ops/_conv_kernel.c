/* Mamba's short convolution with the SiLU after it, for linlm.ops.conv_kernel: a causal depthwise conv1d over time,
   K taps, on x [Bt, T, C] with the K - 1 inputs before x in state [Bt, K - 1, C] (NULL: zeros), weights wt [K, C]
   (tap j reads the input lag K - 1 - j steps back), bias [C]. since [Bt, T] (NULL: no documents) counts the steps
   since the latest document start; a tap whose lag exceeds it reads an earlier document and is dropped.
   out = silu(pre). Items: (row b, block of CONV_TB time steps), all channels, so that every access is a contiguous
   row. x's rows may be further apart than C (xs elements: one half of a [Bt, T, 2C] projection, read in place);
   every other buffer is contiguous. */

#include "_kernel_common.h"

#define CONV_TB 128


/* the input row that tap `lag` of output t reads, or NULL (before the state, or dropped at a document start) */
static inline const IO *SUF(conv_src)(const IO *x, const IO *state, const int64_t *since, int64_t b, int64_t t,
                                      int64_t lag, int64_t T, int64_t C, int64_t K, int64_t xs) {
    const int64_t tau = t - lag;
    if (since && since[b * T + t] < lag) return NULL;
    if (tau >= 0) return x + (b * T + tau) * xs;
    return state ? state + (b * (K - 1) + (K - 1 + tau)) * C : NULL;
}

/* the K rows that the taps of output t read (src[j] for tap j), a row of zeros for a dropped or missing one */
static inline void SUF(conv_srcs)(const IO **src, const IO *zero, const IO *x, const IO *state,
                                  const int64_t *since, int64_t b, int64_t t, int64_t T, int64_t C, int64_t K,
                                  int64_t xs) {
    for (int64_t j = 0; j < K; j++) {
        const IO *p = SUF(conv_src)(x, state, since, b, t, K - 1 - j, T, C, K, xs);
        src[j] = p ? p : zero;
    }
}

/* The per-row loops, each one pass over the channels with the K taps in registers; inlined with K = 4 (Mamba's
   d_conv) as a constant, so that the tap loop unrolls inside the vector loop. */
static inline __attribute__((always_inline)) void
SUF(conv_fwd_row)(IO *restrict o, const IO **src, const REAL *restrict wt, const REAL *restrict bias, int64_t C,
                  int64_t K) {
#pragma omp simd
    for (int64_t c = 0; c < C; c++) {
        REAL a = bias[c];
        for (int64_t j = 0; j < K; j++) a += wt[j * C + c] * LD(src[j][c]);
        o[c] = ST(a * SUF(sigmoid)(a));
    }
}

/* dp = dy silu'(pre) for one output row; with own (a step of the item itself, not of its halo) also the bias and
   weight gradients' partial sums */
static inline __attribute__((always_inline)) void
SUF(conv_bwd_row)(REAL *restrict dp, REAL *restrict gb, REAL *restrict dwi, const IO *restrict g, const IO **src,
                  const REAL *restrict wt, const REAL *restrict bias, int64_t C, int64_t K, int own) {
#pragma omp simd
    for (int64_t c = 0; c < C; c++) {
        REAL a = bias[c];
        for (int64_t j = 0; j < K; j++) a += wt[j * C + c] * LD(src[j][c]);
        const REAL d = LD(g[c]) * SUF(dsilu)(a, SUF(sigmoid)(a));
        dp[c] = d;
        if (own) {
            gb[c] += d;
            for (int64_t j = 0; j < K; j++) dwi[j * C + c] += d * LD(src[j][c]);
        }
    }
}

/* dst = sum over taps of w[j] dp[j]: the gradient of one input row, from the K dpre rows that read it */
static inline __attribute__((always_inline)) void
SUF(conv_dx_row)(IO *restrict dst, const REAL **dp, const REAL *restrict wt, int64_t C, int64_t K) {
#pragma omp simd
    for (int64_t c = 0; c < C; c++) {
        REAL a = 0;
        for (int64_t j = 0; j < K; j++) a += wt[j * C + c] * dp[j][c];
        dst[c] = ST(a);
    }
}

static inline __attribute__((always_inline)) void
SUF(conv_fwd_items)(const IO *x, const IO *state, const REAL *wt, const REAL *bias, const int64_t *since,
                    IO *out, int64_t Bt, int64_t T, int64_t C, int64_t K, int64_t xs, int64_t item0,
                    int64_t item1) {
    const int64_t nblk = (T + CONV_TB - 1) / CONV_TB;
    IO zero[C];
    const IO *src[K];
    for (int64_t c = 0; c < C; c++) zero[c] = 0;
    for (int64_t item = item0; item < item1; item++) {
        const int64_t b = item / nblk, t0 = (item % nblk) * CONV_TB, t1 = t0 + CONV_TB < T ? t0 + CONV_TB : T;
        for (int64_t t = t0; t < t1; t++) {
            SUF(conv_srcs)(src, zero, x, state, since, b, t, T, C, K, xs);
            SUF(conv_fwd_row)(out + (b * T + t) * C, src, wt, bias, C, K);
        }
    }
}

void SUF(conv_fwd)(const IO *x, const IO *state, const REAL *wt, const REAL *bias, const int64_t *since, IO *out,
                   int64_t Bt, int64_t T, int64_t C, int64_t K, int64_t xs, int64_t item0, int64_t item1) {
    if (K == 4) SUF(conv_fwd_items)(x, state, wt, bias, since, out, Bt, T, C, (int64_t)4, xs, item0, item1);
    else SUF(conv_fwd_items)(x, state, wt, bias, since, out, Bt, T, C, K, xs, item0, item1);
}

/* Backward, one pass per item: dpre = dy silu'(pre) for the item's steps and the K - 1 after them (a halo, recomputed
   by the next item too), kept in a ring of K rows (ring, K x C per thread); each input position tau is finished as
   soon as the last tap that reads it (output tau + K - 1) is known: dx[tau] (or, in a row's first block, the state
   positions before it: dstate, which may be NULL) = sum over taps of w[j] dpre[tau + lag]. dw [items, K, C] and
   dbias [items, C] get one partial sum per item over its own steps (the caller sums them). */
static inline __attribute__((always_inline)) void
SUF(conv_bwd_items)(const IO *dy, const IO *x, const IO *state, const REAL *wt, const REAL *bias,
                    const int64_t *since, REAL *ring, IO *dx, IO *dstate, REAL *dw, REAL *dbias, int64_t Bt,
                    int64_t T, int64_t C, int64_t K, int64_t xs, int64_t item0, int64_t item1) {
    const int64_t nblk = (T + CONV_TB - 1) / CONV_TB;
    IO zero[C];
    REAL zero_dp[C];
    const IO *src[K];
    const REAL *dps[K];
    for (int64_t c = 0; c < C; c++) zero[c] = 0;
    for (int64_t c = 0; c < C; c++) zero_dp[c] = 0;
    for (int64_t item = item0; item < item1; item++) {
        const int64_t b = item / nblk, t0 = (item % nblk) * CONV_TB, t1 = t0 + CONV_TB < T ? t0 + CONV_TB : T;
        REAL *restrict dwi = dw + item * K * C, *restrict gb = dbias + item * C;
        for (int64_t c = 0; c < K * C; c++) dwi[c] = 0;
        for (int64_t c = 0; c < C; c++) gb[c] = 0;
        for (int64_t t = t0; t < t1 + K - 1; t++) {
            if (t < T) {  /* dpre[t] into the ring (never read past the row's end) */
                SUF(conv_srcs)(src, zero, x, state, since, b, t, T, C, K, xs);
                REAL *dp = ring + ((t - t0) % K) * C;
                if (t < t1) SUF(conv_bwd_row)(dp, gb, dwi, dy + (b * T + t) * C, src, wt, bias, C, K, 1);
                else SUF(conv_bwd_row)(dp, gb, dwi, dy + (b * T + t) * C, src, wt, bias, C, K, 0);
            }
            /* input position tau = t - (K - 1) is read by outputs tau .. t, all known now (in a row's first block,
               tau < 0 is a state position) */
            const int64_t tau = t - (K - 1);
            if (tau < (t0 == 0 ? -(K - 1) : t0) || tau >= t1) continue;
            IO *dst;
            if (tau >= 0) dst = dx + (b * T + tau) * C;
            else if (dstate) dst = dstate + (b * (K - 1) + (K - 1 + tau)) * C;
            else continue;
            for (int64_t j = 0; j < K; j++) {
                const int64_t lag = K - 1 - j, tt = tau + lag;
                const int drop = tt < 0 || tt >= T || (since && since[b * T + tt] < lag);
                dps[j] = drop ? zero_dp : ring + ((tt - t0) % K) * C;
            }
            SUF(conv_dx_row)(dst, dps, wt, C, K);
        }
    }
}

void SUF(conv_bwd)(const IO *dy, const IO *x, const IO *state, const REAL *wt, const REAL *bias,
                   const int64_t *since, REAL *ring, IO *dx, IO *dstate, REAL *dw, REAL *dbias, int64_t Bt,
                   int64_t T, int64_t C, int64_t K, int64_t xs, int64_t item0, int64_t item1) {
    if (K == 4) SUF(conv_bwd_items)(dy, x, state, wt, bias, since, ring, dx, dstate, dw, dbias, Bt, T, C,
                                    (int64_t)4, xs, item0, item1);
    else SUF(conv_bwd_items)(dy, x, state, wt, bias, since, ring, dx, dstate, dw, dbias, Bt, T, C, K, xs, item0,
                             item1);
}

/* NAME_par: the items split over an OpenMP team (PAR_ITEMS in _kernel_common.h) */
#ifdef _OPENMP
void SUF(conv_fwd_par)(const IO *x, const IO *state, const REAL *wt, const REAL *bias, const int64_t *since,
                       IO *out, int64_t Bt, int64_t T, int64_t C, int64_t K, int64_t xs, int64_t nitems,
                       int64_t nthreads) {
    PAR_ITEMS(SUF(conv_fwd)(x, state, wt, bias, since, out, Bt, T, C, K, xs, i0_, i1_))
}

void SUF(conv_bwd_par)(const IO *dy, const IO *x, const IO *state, const REAL *wt, const REAL *bias,
                       const int64_t *since, REAL *ring, int64_t rstride, IO *dx, IO *dstate, REAL *dw,
                       REAL *dbias, int64_t Bt, int64_t T, int64_t C, int64_t K, int64_t xs, int64_t nitems,
                       int64_t nthreads) {
    PAR_ITEMS(SUF(conv_bwd)(dy, x, state, wt, bias, since, ring + w_ * rstride, dx, dstate, dw, dbias, Bt, T, C, K,
                            xs, i0_, i1_))
}
#endif

#define KERNEL_SELF "_conv_kernel.c"
#include "_kernel_passes.h"
