/* The element-wise part of a decoding step, for linlm.ops.step_kernel: one call where torch takes one op per line
   below, at a few rows, where each op's dispatch costs more than its arithmetic.

   conv_step, a depthwise causal conv's step (linlm.layers.mamba.ShortConv.step) for rows b of x [Bt, C] (row
   stride xs) and the window st [Bt, K - 1, C] of the last K - 1 inputs (batch stride ss, contiguous [K - 1, C]
   within a row), weights w [C, K], bias [C] or NULL:
       out[b, c] = act(bias[c] + sum_{j < K-1} w[c, j] st[b, j, c] + w[c, K-1] x[b, c]),  act = silu or none,
       new_st[b, j] = st[b, j + 1] for j < K - 2, new_st[b, K - 2] = x[b].
   out is [Bt, C] and new_st [Bt, K - 1, C], both contiguous. Items: (b, a block of STEP_CH channels).

   mamba_step, the selective scan's step of a Mamba mixer with its dt projection and output gate, for rows b of u
   [Bt, Din] (contiguous), xp (the x_proj output: each row's R values of dt_low, then N of Bm and N of Cm, at row
   stride xs), z (row stride zs, or NULL: no gate), dt_w [Din, R], dt_b [Din] or NULL, A [Din, N] (A <= 0), D [Din] or
   NULL, and the state s [Bt, Din, N] in REAL:
       dt = softplus(dt_b[d] + sum_r dt_low[b, r] dt_w[d, r]),
       s'[b, d, n] = exp(dt A[d, n]) s[b, d, n] + dt u[b, d] Bm[b, n],
       y[b, d] = (sum_n s'[b, d, n] Cm[b, n] + D[d] u[b, d]) silu(z[b, d]).
   s' goes to s_out (the caller's fresh buffer: the given state is not changed), y to y [Bt, Din]. Items: (b, a block
   of STEP_CH channels).

   mamba_model_step, a whole Mamba language model's step after its embeddings, for Bt rows of the residual stream
   h [Bt, d] (updated in place): for each of L layers, h += mixer(rms(h) w_norm) (mixer_stages, as
   mamba_mixer_step); then logits [Bt, V] = (rms(h) w_final) w_head^T, on int8 w_head where its row scales sc_head
   are given. tab [L, STEP_FIELDS] holds each layer's tensors as addresses (0: NULL) and its conv window's batch
   stride, in the order of the STEP_F_* indices below; every layer has the same sizes. work [Bt (2 d + 4 Din + R +
   2N)] and xq [threads, Bt max(d, Din)] are scratch. One item: the whole step; NAME_par splits each stage over the
   team (the norms and the residual additions, a few thousand values, on its first thread).

   rms_rows, RMSNorm (linlm.ops.fused.rms_norm) of the rows r of x [M, F] (contiguous), weight w [F] or NULL:
       y[r, c] = x[r, c] / sqrt(sum_c' x[r, c']^2 / F + eps) w[c],
   into y [M, F]. Items: rows.

   mamba_mixer_step, a whole Mamba mixer's step (linlm.layers.mamba.MambaMixer.step) for Bt rows of x [Bt, d]:
   xz = x w_in^T (+ b_in) [Bt, 2 Din]; u, new_st = conv_step(xz[:, :Din], st); xp = u w_x^T (+ b_x) [Bt, R + 2N];
   y, s_out = mamba_step(u, xp, z = xz[:, Din:], ...); out = y w_out^T (+ b_out) [Bt, d]. The products are gemv_rows
   (_gemv_kernel.c) on IO weights, or gemv_q8 on int8 weights where the projection's row scales (sc_in, sc_x,
   sc_out) are given, each thread quantising the product's input into its row of xq [threads, Bt max(d, Din)].
   xz, u, xp and y lie one after the other in the caller's scratch buffer work
   [Bt (4 Din + R + 2N)]. One item: the whole step on the calling
   thread; NAME_par splits each of the five stages over the team (the products by blocks of GEMV_ROWS weight rows,
   the conv and the scan by (b, block of STEP_CH channels)) with a barrier between stages, so a step costs one call
   where it took eight, and the values are the same bits on any number of threads.

   Sums accumulate in REAL. */

#include "_kernel_common.h"

#define STEP_CH 64

#ifndef STEP_MODEL_ONCE
#define STEP_MODEL_ONCE
#define STEP_F_NORM 0
#define STEP_F_WIN 1
#define STEP_F_SCIN 2
#define STEP_F_BIN 3
#define STEP_F_CONVW 4
#define STEP_F_CONVB 5
#define STEP_F_WX 6
#define STEP_F_SCX 7
#define STEP_F_BX 8
#define STEP_F_DTW 9
#define STEP_F_DTB 10
#define STEP_F_A 11
#define STEP_F_D 12
#define STEP_F_WOUT 13
#define STEP_F_SCOUT 14
#define STEP_F_BOUT 15
#define STEP_F_ST 16
#define STEP_F_SS 17
#define STEP_F_S 18
#define STEP_F_NEWST 19
#define STEP_F_SOUT 20
#define STEP_FIELDS 21
#define STEP_PTR(row, f) ((void *)(intptr_t)(row)[f])
#endif

void SUF(conv_step)(const IO *x, int64_t xs, const IO *st, int64_t ss, const IO *w, const IO *bias, IO *out, IO *new_st,
                    int64_t Bt, int64_t C, int64_t K, int64_t silu, int64_t item0, int64_t item1) {
    const int64_t nblk = (C + STEP_CH - 1) / STEP_CH;
    for (int64_t item = item0; item < item1; item++) {
        const int64_t b = item / nblk, c0 = (item % nblk) * STEP_CH;
        const int64_t c1 = c0 + STEP_CH < C ? c0 + STEP_CH : C;
        const IO *restrict xb = x + b * xs;
        const IO *restrict sb = st + b * ss;
        IO *restrict ob = out + b * C;
        IO *restrict nb = new_st + b * (K - 1) * C;
#pragma omp simd
        for (int64_t c = c0; c < c1; c++) {
            REAL a = bias ? LD(bias[c]) : (REAL)0;
            for (int64_t j = 0; j < K - 1; j++) a += LD(w[c * K + j]) * LD(sb[j * C + c]);
            a += LD(w[c * K + K - 1]) * LD(xb[c]);
            ob[c] = ST(silu ? a * SUF(sigmoid)(a) : a);
        }
        for (int64_t j = 0; j + 1 < K - 1; j++) memcpy(nb + j * C + c0, sb + (j + 1) * C + c0, (c1 - c0) * sizeof(IO));
        memcpy(nb + (K - 2) * C + c0, xb + c0, (c1 - c0) * sizeof(IO));
    }
}

void SUF(mamba_step)(const IO *u, const IO *xp, int64_t xs, const IO *z,
                     int64_t zs, const IO *dt_w, const IO *dt_b, const IO *A, const IO *D, const REAL *s,
                     REAL *s_out, IO *y, int64_t Bt, int64_t Din, int64_t N, int64_t R, int64_t item0,
                     int64_t item1) {
    const int64_t nblk = (Din + STEP_CH - 1) / STEP_CH;
    for (int64_t item = item0; item < item1; item++) {
        const int64_t b = item / nblk, d0 = (item % nblk) * STEP_CH;
        const int64_t d1 = d0 + STEP_CH < Din ? d0 + STEP_CH : Din;
        const IO *restrict lo = xp + b * xs, *restrict Bb = lo + R, *restrict Cb = Bb + N;
        for (int64_t d = d0; d < d1; d++) {
            const IO *restrict wd = dt_w + d * R;
            REAL pre = 0;
#pragma omp simd reduction(+ : pre)
            for (int64_t r = 0; r < R; r++) pre += LD(lo[r]) * LD(wd[r]);
            if (dt_b) pre += LD(dt_b[d]);
            const REAL dt = SUF(softplus)(pre), uv = LD(u[b * Din + d]), du = dt * uv;
            const IO *restrict Ad = A + d * N;
            const REAL *restrict sd = s + (b * Din + d) * N;
            REAL *restrict od = s_out + (b * Din + d) * N;
            REAL acc = 0;
#pragma omp simd reduction(+ : acc)
            for (int64_t n = 0; n < N; n++) {
                const REAL v = SUF(exp_neg)(dt * LD(Ad[n])) * sd[n] + du * LD(Bb[n]);
                od[n] = v;
                acc += v * LD(Cb[n]);
            }
            if (D) acc += LD(D[d]) * uv;
            if (z) {
                const REAL zv = LD(z[b * zs + d]);
                acc *= zv * SUF(sigmoid)(zv);
            }
            y[b * Din + d] = ST(acc);
        }
    }
}

void SUF(rms_rows)(const IO *x, const IO *w, IO *y, int64_t F, double eps, int64_t item0, int64_t item1) {
    for (int64_t r = item0; r < item1; r++) {
        const IO *restrict xr = x + r * F;
        IO *restrict yr = y + r * F;
        REAL ss = 0;
#pragma omp simd reduction(+ : ss)
        for (int64_t c = 0; c < F; c++) ss += LD(xr[c]) * LD(xr[c]);
#if REAL_IS_DOUBLE
        const REAL rstd = 1.0 / __builtin_sqrt(ss / (REAL)F + eps);
#else
        const REAL rstd = 1.0f / __builtin_sqrtf(ss / (REAL)F + (REAL)eps);
#endif
        if (w) {
#pragma omp simd
            for (int64_t c = 0; c < F; c++) yr[c] = ST(LD(xr[c]) * rstd * LD(w[c]));
        } else {
#pragma omp simd
            for (int64_t c = 0; c < F; c++) yr[c] = ST(LD(xr[c]) * rstd);
        }
    }
}

void SUF(gemv_rows)(const IO *x, const IO *w, const IO *b, IO *y, int64_t R, int64_t N, int64_t K, int64_t item0,
                    int64_t item1);
void SUF(gemv_q8)(const IO *x, const int8_t *q, const float *s, const IO *b, IO *y, int8_t *xq, int64_t R,
                  int64_t N, int64_t K, int64_t item0, int64_t item1);

/* y = x w^T (+ b) over the items [i0, i1): int8 w with row scales sc, or IO w where sc is NULL */
static void SUF(product)(const IO *x, const void *w, const float *sc, const IO *b, IO *y, int8_t *xq, int64_t R,
                         int64_t N, int64_t K, int64_t i0, int64_t i1) {
    if (sc)
        SUF(gemv_q8)(x, (const int8_t *)w, sc, b, y, xq, R, N, K, i0, i1);
    else
        SUF(gemv_rows)(x, (const IO *)w, b, y, R, N, K, i0, i1);
}

/* Stage after stage for thread t of nt (a barrier between stages: nothing outside an OpenMP team). */
static void SUF(mixer_stages)(const IO *x, const void *w_in, const float *sc_in, const IO *b_in, const IO *st,
                              int64_t ss, const IO *conv_w, const IO *conv_b, const void *w_x, const float *sc_x,
                              const IO *b_x, const IO *dt_w, const IO *dt_b, const IO *A, const IO *D,
                              const void *w_out, const float *sc_out, const IO *b_out, const REAL *s, IO *work,
                              int8_t *xq, IO *new_st, REAL *s_out, IO *out, int64_t Bt, int64_t d, int64_t Din,
                              int64_t N, int64_t R, int64_t K, int64_t t, int64_t nt) {
    const int64_t P = R + 2 * N, chan = Bt * ((Din + STEP_CH - 1) / STEP_CH);
    IO *xz = work, *u = xz + Bt * 2 * Din, *xp = u + Bt * Din, *y = xp + Bt * P;
    int64_t n = (2 * Din + GEMV_ROWS - 1) / GEMV_ROWS;
    SUF(product)(x, w_in, sc_in, b_in, xz, xq, Bt, 2 * Din, d, n * t / nt, n * (t + 1) / nt);
#pragma omp barrier
    SUF(conv_step)(xz, 2 * Din, st, ss, conv_w, conv_b, u, new_st, Bt, Din, K, 1, chan * t / nt, chan * (t + 1) / nt);
#pragma omp barrier
    n = (P + GEMV_ROWS - 1) / GEMV_ROWS;
    SUF(product)(u, w_x, sc_x, b_x, xp, xq, Bt, P, Din, n * t / nt, n * (t + 1) / nt);
#pragma omp barrier
    SUF(mamba_step)(u, xp, P, xz + Din, 2 * Din, dt_w, dt_b, A, D, s, s_out, y, Bt, Din, N, R, chan * t / nt,
                    chan * (t + 1) / nt);
#pragma omp barrier
    n = (d + GEMV_ROWS - 1) / GEMV_ROWS;
    SUF(product)(y, w_out, sc_out, b_out, out, xq, Bt, d, Din, n * t / nt, n * (t + 1) / nt);
}

void SUF(mamba_mixer_step)(const IO *x, const void *w_in, const float *sc_in, const IO *b_in, const IO *st,
                           int64_t ss, const IO *conv_w, const IO *conv_b, const void *w_x, const float *sc_x,
                           const IO *b_x, const IO *dt_w, const IO *dt_b, const IO *A, const IO *D,
                           const void *w_out, const float *sc_out, const IO *b_out, const REAL *s, IO *work,
                           int8_t *xq, IO *new_st, REAL *s_out, IO *out, int64_t Bt, int64_t d, int64_t Din,
                           int64_t N, int64_t R, int64_t K, int64_t item0, int64_t item1) {
    if (item0 < item1)
        SUF(mixer_stages)(x, w_in, sc_in, b_in, st, ss, conv_w, conv_b, w_x, sc_x, b_x, dt_w, dt_b, A, D, w_out,
                          sc_out, b_out, s, work, xq, new_st, s_out, out, Bt, d, Din, N, R, K, 0, 1);
}

void SUF(rms_rows)(const IO *x, const IO *w, IO *y, int64_t F, double eps, int64_t item0, int64_t item1);

/* The layers and the head for thread t of nt (a barrier between stages: nothing outside an OpenMP team). */
static void SUF(model_stages)(IO *h, const int64_t *tab, int64_t L, const IO *final_w, const void *w_head,
                              const float *sc_head, IO *work, int8_t *xq, IO *logits, int64_t Bt, int64_t d,
                              int64_t Din, int64_t N, int64_t R, int64_t K, int64_t V, double eps, int64_t t,
                              int64_t nt) {
    IO *hn = work, *mix = hn + Bt * d, *mw = mix + Bt * d;
    for (int64_t l = 0; l < L; l++) {
        const int64_t *row = tab + l * STEP_FIELDS;
        if (t == 0) {
            if (l > 0)
                for (int64_t i = 0; i < Bt * d; i++) h[i] = ST(LD(h[i]) + LD(mix[i]));
            SUF(rms_rows)(h, (const IO *)STEP_PTR(row, STEP_F_NORM), hn, d, eps, 0, Bt);
        }
#pragma omp barrier
        SUF(mixer_stages)(hn, STEP_PTR(row, STEP_F_WIN), (const float *)STEP_PTR(row, STEP_F_SCIN),
                          (const IO *)STEP_PTR(row, STEP_F_BIN), (const IO *)STEP_PTR(row, STEP_F_ST),
                          row[STEP_F_SS], (const IO *)STEP_PTR(row, STEP_F_CONVW),
                          (const IO *)STEP_PTR(row, STEP_F_CONVB), STEP_PTR(row, STEP_F_WX),
                          (const float *)STEP_PTR(row, STEP_F_SCX), (const IO *)STEP_PTR(row, STEP_F_BX),
                          (const IO *)STEP_PTR(row, STEP_F_DTW), (const IO *)STEP_PTR(row, STEP_F_DTB),
                          (const IO *)STEP_PTR(row, STEP_F_A), (const IO *)STEP_PTR(row, STEP_F_D),
                          STEP_PTR(row, STEP_F_WOUT), (const float *)STEP_PTR(row, STEP_F_SCOUT),
                          (const IO *)STEP_PTR(row, STEP_F_BOUT), (const REAL *)STEP_PTR(row, STEP_F_S), mw, xq,
                          (IO *)STEP_PTR(row, STEP_F_NEWST), (REAL *)STEP_PTR(row, STEP_F_SOUT), mix, Bt, d, Din,
                          N, R, K, t, nt);
#pragma omp barrier
    }
    if (t == 0) {
        if (L > 0)
            for (int64_t i = 0; i < Bt * d; i++) h[i] = ST(LD(h[i]) + LD(mix[i]));
        SUF(rms_rows)(h, final_w, hn, d, eps, 0, Bt);
    }
#pragma omp barrier
    const int64_t n = (V + GEMV_ROWS - 1) / GEMV_ROWS;
    SUF(product)(hn, w_head, sc_head, NULL, logits, xq, Bt, V, d, n * t / nt, n * (t + 1) / nt);
}

void SUF(mamba_model_step)(IO *h, const int64_t *tab, int64_t L, const IO *final_w, const void *w_head,
                           const float *sc_head, IO *work, int8_t *xq, IO *logits, int64_t Bt, int64_t d,
                           int64_t Din, int64_t N, int64_t R, int64_t K, int64_t V, double eps, int64_t item0,
                           int64_t item1) {
    if (item0 < item1)
        SUF(model_stages)(h, tab, L, final_w, w_head, sc_head, work, xq, logits, Bt, d, Din, N, R, K, V, eps, 0, 1);
}

/* NAME_par: the items split over an OpenMP team (PAR_ITEMS in _kernel_common.h) */
#ifdef _OPENMP
void SUF(conv_step_par)(const IO *x, int64_t xs, const IO *st, int64_t ss, const IO *w, const IO *bias, IO *out,
                        IO *new_st, int64_t Bt, int64_t C, int64_t K, int64_t silu, int64_t nitems,
                        int64_t nthreads) {
    PAR_ITEMS(SUF(conv_step)(x, xs, st, ss, w, bias, out, new_st, Bt, C, K, silu, i0_, i1_))
}

void SUF(mamba_step_par)(const IO *u, const IO *xp, int64_t xs, const IO *z,
                         int64_t zs, const IO *dt_w, const IO *dt_b, const IO *A, const IO *D, const REAL *s,
                         REAL *s_out, IO *y, int64_t Bt, int64_t Din, int64_t N, int64_t R, int64_t nitems,
                         int64_t nthreads) {
    PAR_ITEMS(SUF(mamba_step)(u, xp, xs, z, zs, dt_w, dt_b, A, D, s, s_out, y, Bt, Din, N, R, i0_, i1_))
}

void SUF(rms_rows_par)(const IO *x, const IO *w, IO *y, int64_t F, double eps, int64_t nitems, int64_t nthreads) {
    PAR_ITEMS(SUF(rms_rows)(x, w, y, F, eps, i0_, i1_))
}

void SUF(mamba_mixer_step_par)(const IO *x, const void *w_in, const float *sc_in, const IO *b_in, const IO *st,
                               int64_t ss, const IO *conv_w, const IO *conv_b, const void *w_x, const float *sc_x,
                               const IO *b_x, const IO *dt_w, const IO *dt_b, const IO *A, const IO *D,
                               const void *w_out, const float *sc_out, const IO *b_out, const REAL *s, IO *work,
                               int8_t *xq, int64_t xq_stride, IO *new_st, REAL *s_out, IO *out, int64_t Bt,
                               int64_t d, int64_t Din, int64_t N, int64_t R, int64_t K, int64_t nitems,
                               int64_t nthreads) {
    (void)nitems;  /* one item: the whole step, its stages split over the team */
#pragma omp parallel num_threads(nthreads)
    {
        const int64_t t = omp_get_thread_num();
        SUF(mixer_stages)(x, w_in, sc_in, b_in, st, ss, conv_w, conv_b, w_x, sc_x, b_x, dt_w, dt_b, A, D, w_out,
                          sc_out, b_out, s, work, xq + t * xq_stride, new_st, s_out, out, Bt, d, Din, N, R, K, t,
                          omp_get_num_threads());
    }
}

void SUF(mamba_model_step_par)(IO *h, const int64_t *tab, int64_t L, const IO *final_w, const void *w_head,
                               const float *sc_head, IO *work, int8_t *xq, int64_t xq_stride, IO *logits, int64_t Bt,
                               int64_t d, int64_t Din, int64_t N, int64_t R, int64_t K, int64_t V, double eps,
                               int64_t nitems, int64_t nthreads) {
    (void)nitems;  /* one item: the whole step, its stages split over the team */
#pragma omp parallel num_threads(nthreads)
    {
        const int64_t t = omp_get_thread_num();
        SUF(model_stages)(h, tab, L, final_w, w_head, sc_head, work, xq + t * xq_stride, logits, Bt, d, Din, N, R,
                          K, V, eps, t, omp_get_num_threads());
    }
}
#endif

#define KERNEL_SELF "_step_kernel.c"
#include "_kernel_passes.h"
