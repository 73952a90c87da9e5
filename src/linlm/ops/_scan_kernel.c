/* The S6 selective scan as a plain C kernel, forward and backward, for linlm.ops.scan_kernel. Shapes (as
   selective_scan.py):

       u, y, du (IO), dt, ddt  [Bt, T, Din]      A            [Din, N] (a_bstride 0) or [Bt, Din, N]
       Bm, Cm              [Bt, T, N]            dB, dC       [ntiles, Bt, T, N] (one partial sum per tile)
       init, final, dinit  [Bt, Din, N]          dA           [Bt, Din, N] (per row; the caller sums shared A)
       reset               [Bt, T] bytes or NULL ckpt         [Bt, nseg, Din, N], nseg = ceil(T / K)
       D, dD               [Din] or [Bt, Din]    lengths      [Bt] int64 or NULL

   A work item is one (batch row b, tile of TILE channels). Its state is held as s[n][d] (d fastest), so every loop
   over d is a straight vector loop and the sums over n (y, dx, the dt gradient) are vertical; only the sums over d
   (dB, dC) are horizontal, once per (t, n, tile). The forward keeps the state in a 8 KiB array and writes the state
   at every K-th step to ckpt. The backward walks the segments of K steps from last to first: it recomputes the
   segment's states and decays from the checkpoint into two K x N x TILE buffers (256 KiB each at K 64, N 16, TILE
   64 in float32: L2-resident), with each step's dt and dt u, then runs the adjoint g_t = dL/ds_t backwards through
   them. Both walk their tile through SUF(advance), inlined with constant sizes for the common shapes (TILE
   channels, N = 16). */

#include "_kernel_common.h"

#define TILE 64

/* One step's dt for a tile: dt as given, or softplus(dt) when the caller passes the pre-activation (dt_sp). */
static inline void SUF(load_dt)(REAL *restrict dtv, const REAL *restrict src, int64_t dl, int64_t dt_sp) {
    if (dt_sp) {
#pragma omp simd
        for (int64_t d = 0; d < dl; d++) dtv[d] = SUF(softplus)(src[d]);
    } else {
        for (int64_t d = 0; d < dl; d++) dtv[d] = src[d];
    }
}

/* Prefetch one tile row (dl values of `size` bytes) of a [Bt, T, Din] buffer: consecutive steps' rows are Din
   values apart, a new page every step at Din = 1024, where the hardware prefetchers do not follow; a few steps ahead
   hides the misses. */
#define PF_STEPS 2
static inline void SUF(prefetch_row)(const void *p, int64_t dl, int64_t size, int write) {
    const char *c = (const char *)p;
    for (int64_t off = 0; off < dl * size; off += 64) {
        if (write) __builtin_prefetch(c + off, 1);
        else __builtin_prefetch(c + off, 0);
    }
}

/* A of row b, tile d0..d0+dl, transposed to At[n][d]. */
static void SUF(load_A)(REAL *restrict At, const REAL *restrict A, int64_t a_bstride, int64_t b, int64_t d0,
                        int64_t dl, int64_t N) {
    const REAL *Ab = A + b * a_bstride;
    for (int64_t d = 0; d < dl; d++)
        for (int64_t n = 0; n < N; n++) At[n * TILE + d] = Ab[(d0 + d) * N + n];
}

/* state [Din, N] slice (row layout) <-> tile s[n][d] */
static void SUF(load_state)(REAL *restrict s, const REAL *restrict src, int64_t d0, int64_t dl, int64_t N) {
    for (int64_t d = 0; d < dl; d++)
        for (int64_t n = 0; n < N; n++) s[n * TILE + d] = src[(d0 + d) * N + n];
}

static void SUF(store_state)(REAL *restrict dst, const REAL *restrict s, int64_t d0, int64_t dl, int64_t N) {
    for (int64_t d = 0; d < dl; d++)
        for (int64_t n = 0; n < N; n++) dst[(d0 + d) * N + n] = s[n * TILE + d];
}

/* One step of one state row n over a tile: a = exp(dt A_n) (0 at a reset step), s = a p + x b_n, where p is the
   previous state row, or s itself when p is NULL (the forward updates in place). Optionally keeps a (an != NULL, the
   backward's recompute) and accumulates the readout y += c_n s (yv != NULL, the forward). Inlined, so the NULL
   tests are resolved at compile time. */
#define ADVANCE_LOOP(PREV, DECAY)                                                                                   \
    _Pragma("omp simd") for (int64_t d = 0; d < dl; d++) {                                                          \
        const REAL av = (DECAY);                                                                                    \
        const REAL sv = av * (PREV)[d] + x[d] * bn;                                                                 \
        s[d] = sv;                                                                                                  \
        if (an) an[d] = av;                                                                                         \
        if (yv) yv[d] += cn * sv;                                                                                   \
    }
static inline __attribute__((always_inline)) void
SUF(advance)(REAL *restrict s, const REAL *restrict p, REAL *restrict an, REAL *restrict yv, const REAL *restrict An,
             const REAL *restrict dtv, const REAL *restrict x, REAL bn, REAL cn, int reset, int64_t dl) {
    /* four loops, so that each is a straight vector loop (a select of the decay inside one stops vectorising) */
    if (reset && p) {
        ADVANCE_LOOP(p, (REAL)0)
    } else if (reset) {
        ADVANCE_LOOP(s, (REAL)0)
    } else if (p) {
        ADVANCE_LOOP(p, SUF(exp_neg)(dtv[d] * An[d]))
    } else {
        ADVANCE_LOOP(s, SUF(exp_neg)(dtv[d] * An[d]))
    }
}
#undef ADVANCE_LOOP

/* Rows may end early: with lengths != NULL, row b runs steps 0 .. lengths[b] - 1 only; later steps are padding:
   there y = D u, the state is not touched and no gradient reaches u (beyond D's term), dt, B or C. D (NULL for
   none) is [Din] (d_bstride 0) or [Bt, Din]. */
/* One work item (batch row, tile of dl channels) of scan_fwd; inlined into the dispatch below with constant dl
   and N for the common shapes. */
static inline __attribute__((always_inline)) void
SUF(scan_fwd_item)(const IO *u, const REAL *dt, const REAL *A, int64_t a_bstride, const REAL *Bm, const REAL *Cm,
                   const REAL *D, int64_t d_bstride, const REAL *init, const uint8_t *reset, const int64_t *lengths,
                   IO *y, REAL *final, REAL *ckpt, int64_t dt_sp, int64_t Bt, int64_t T, int64_t Din, int64_t N,
                   int64_t K, int64_t item, int64_t dl) {
    const int64_t ntiles = (Din + TILE - 1) / TILE, nseg = (T + K - 1) / K;
    const int64_t b = item / ntiles, d0 = (item % ntiles) * TILE;
    const int64_t Tb = lengths ? lengths[b] : T;
    REAL st[N * TILE], At[N * TILE], x[TILE], dtv[TILE], yv[TILE], Dv[TILE];
    SUF(load_A)(At, A, a_bstride, b, d0, dl, N);
    for (int64_t d = 0; d < dl; d++) Dv[d] = D ? D[b * d_bstride + d0 + d] : 0;
    if (init) SUF(load_state)(st, init + b * Din * N, d0, dl, N);
    else memset(st, 0, sizeof(st));
    for (int64_t t = 0; t < Tb; t++) {
        if (ckpt && t % K == 0) SUF(store_state)(ckpt + (b * nseg + t / K) * Din * N, st, d0, dl, N);
        const int64_t row = (b * T + t) * Din + d0;
        if (t + PF_STEPS < Tb) {
            SUF(prefetch_row)(u + row + PF_STEPS * Din, dl, sizeof(IO), 0);
            SUF(prefetch_row)(dt + row + PF_STEPS * Din, dl, sizeof(REAL), 0);
            SUF(prefetch_row)(y + row + PF_STEPS * Din, dl, sizeof(IO), 1);
        }
        SUF(load_dt)(dtv, dt + row, dl, dt_sp);
        for (int64_t d = 0; d < dl; d++) {
            const REAL ud = LD(u[row + d]);
            x[d] = dtv[d] * ud;
            yv[d] = Dv[d] * ud;
        }
        /* decay, update and readout in one pass over the tile's state (the decays are not kept) */
        const REAL *Bt_ = Bm + (b * T + t) * N, *Ct = Cm + (b * T + t) * N;
        const int rs = reset && reset[b * T + t];
        for (int64_t n = 0; n < N; n++)
            SUF(advance)(st + n * TILE, NULL, NULL, yv, At + n * TILE, dtv, x, Bt_[n], Ct[n], rs, dl);
        for (int64_t d = 0; d < dl; d++) y[row + d] = ST(yv[d]);
    }
    for (int64_t t = Tb; t < T; t++) {
        const int64_t row = (b * T + t) * Din + d0;
        for (int64_t d = 0; d < dl; d++) y[row + d] = ST(Dv[d] * LD(u[row + d]));
    }
    if (final) SUF(store_state)(final + b * Din * N, st, d0, dl, N);
}

/* The two entry points take the scan's inputs and sizes first, in the same order, then their own buffers. */
void SUF(scan_fwd)(const IO *u, const REAL *dt, const REAL *A, int64_t a_bstride, const REAL *Bm, const REAL *Cm,
                   const REAL *D, int64_t d_bstride, const uint8_t *reset, const int64_t *lengths, int64_t dt_sp,
                   int64_t Bt, int64_t T, int64_t Din, int64_t N, int64_t K, const REAL *init, IO *y, REAL *final,
                   REAL *ckpt, int64_t item0, int64_t item1) {
    const int64_t ntiles_ = (Din + TILE - 1) / TILE;
    for (int64_t item = item0; item < item1; item++) {
        const int64_t d0 = (item % ntiles_) * TILE, dl = Din - d0 < TILE ? Din - d0 : TILE;
        /* constant trip counts for the common shapes, so that every tile loop is a fixed run of vectors */
        if (dl == TILE && N == 16) SUF(scan_fwd_item)(u, dt, A, a_bstride, Bm, Cm, D, d_bstride, init, reset,
            lengths, y, final, ckpt, dt_sp, Bt, T, Din, (int64_t)16, K, item, TILE);
        else if (dl == TILE) SUF(scan_fwd_item)(u, dt, A, a_bstride, Bm, Cm, D, d_bstride, init, reset, lengths, y,
            final, ckpt, dt_sp, Bt, T, Din, N, K, item, TILE);
        else SUF(scan_fwd_item)(u, dt, A, a_bstride, Bm, Cm, D, d_bstride, init, reset, lengths, y, final, ckpt,
            dt_sp, Bt, T, Din, N, K, item, dl);
    }
}

/* work: per calling thread, (2 N + 2) K TILE elements (a segment's states and decays, and its dt and x = dt u).
   dD: [Bt, Din] per row. */
/* One work item (batch row, tile of dl channels) of scan_bwd; inlined into the dispatch below with constant dl
   and N for the common shapes. */
static inline __attribute__((always_inline)) void
SUF(scan_bwd_item)(const IO *u, const REAL *dt, const REAL *A, int64_t a_bstride, const REAL *Bm, const REAL *Cm,
                   const REAL *D, int64_t d_bstride, const uint8_t *reset, const int64_t *lengths, const REAL *ckpt,
                   const IO *dy, const REAL *dfinal, IO *du, REAL *ddt, REAL *dA, REAL *dB, REAL *dC, REAL *dD,
                   REAL *dinit, REAL *work, int64_t dt_sp, int64_t Bt, int64_t T, int64_t Din, int64_t N, int64_t K,
                   int64_t item, int64_t dl) {
    const int64_t ntiles = (Din + TILE - 1) / TILE, nseg = (T + K - 1) / K;
    REAL *S = work, *Adec = work + K * N * TILE, *DTs = work + 2 * K * N * TILE, *Xs = DTs + K * TILE;
    const int64_t b = item / ntiles, tile = item % ntiles, d0 = tile * TILE;
    const int64_t Tb = lengths ? lengths[b] : T;
    REAL At[N * TILE], g[N * TILE], gA[N * TILE], s0[N * TILE], dx[TILE], dlt[TILE];
    REAL Dv[TILE], gD[TILE];
#if !IO_IS_REAL
    REAL dyv[TILE], uv[TILE];  /* this step's dy and u, widened once for the N state rows */
#endif
    REAL *dBp = dB + (tile * Bt + b) * T * N, *dCp = dC + (tile * Bt + b) * T * N;
    SUF(load_A)(At, A, a_bstride, b, d0, dl, N);
    for (int64_t d = 0; d < dl; d++) {
        Dv[d] = D ? D[b * d_bstride + d0 + d] : 0;
        gD[d] = 0;
    }
    if (dfinal) SUF(load_state)(g, dfinal + b * Din * N, d0, dl, N);
    else memset(g, 0, sizeof(g));
    memset(gA, 0, sizeof(gA));
    for (int64_t t = Tb; t < T; t++) {  /* padding: only the skip term */
        const int64_t row = (b * T + t) * Din + d0;
        for (int64_t d = 0; d < dl; d++) {
            const REAL dyd = LD(dy[row + d]);
            du[row + d] = ST(dyd * Dv[d]);
            ddt[row + d] = 0;
            gD[d] += dyd * LD(u[row + d]);
        }
        for (int64_t n = 0; n < N; n++) dBp[t * N + n] = dCp[t * N + n] = 0;
    }
    for (int64_t seg = (Tb + K - 1) / K - 1; seg >= 0; seg--) {
        const int64_t t0 = seg * K, t1 = t0 + K < Tb ? t0 + K : Tb;
        /* recompute the segment's decays and states from its checkpoint */
        SUF(load_state)(s0, ckpt + (b * nseg + seg) * Din * N, d0, dl, N);
        for (int64_t t = t0; t < t1; t++) {
            const int64_t row = (b * T + t) * Din + d0;
            REAL *restrict dts = DTs + (t - t0) * TILE, *restrict xs = Xs + (t - t0) * TILE;
            if (t + PF_STEPS < t1) {
                SUF(prefetch_row)(u + row + PF_STEPS * Din, dl, sizeof(IO), 0);
                SUF(prefetch_row)(dt + row + PF_STEPS * Din, dl, sizeof(REAL), 0);
            }
            SUF(load_dt)(dts, dt + row, dl, dt_sp);  /* kept for the adjoint, with x = dt u */
            for (int64_t d = 0; d < dl; d++) xs[d] = dts[d] * LD(u[row + d]);
            REAL *st = S + (t - t0) * N * TILE, *at = Adec + (t - t0) * N * TILE;
            const REAL *prev = t == t0 ? s0 : st - N * TILE;
            const REAL *Bt_ = Bm + (b * T + t) * N;
            const int rs = reset && reset[b * T + t];
            /* decay and update in one pass, both kept for the adjoint */
            for (int64_t n = 0; n < N; n++)
                SUF(advance)(st + n * TILE, prev + n * TILE, at + n * TILE, NULL, At + n * TILE, dts, xs, Bt_[n], 0,
                             rs, dl);
        }
        /* the adjoint, backwards: g holds dL/ds_t once dy_t's term is added */
        for (int64_t t = t1 - 1; t >= t0; t--) {
            const int64_t row = (b * T + t) * Din + d0;
            const REAL *st = S + (t - t0) * N * TILE, *at = Adec + (t - t0) * N * TILE;
            const REAL *sp = t == t0 ? s0 : st - N * TILE;
            const REAL *Bt_ = Bm + (b * T + t) * N, *Ct = Cm + (b * T + t) * N;
#if IO_IS_REAL
            const REAL *dyt = dy + row, *uv = u + row;
#else
            const REAL *dyt = dyv;
#endif
            REAL *dBt = dBp + t * N, *dCt = dCp + t * N;
            if (t - PF_STEPS >= t0) {  /* the rows this pass reads and writes, a few steps back */
                const int64_t ahead = row - PF_STEPS * Din;
                SUF(prefetch_row)(dy + ahead, dl, sizeof(IO), 0);
                SUF(prefetch_row)(u + ahead, dl, sizeof(IO), 0);
                SUF(prefetch_row)(dt + ahead, dl, sizeof(REAL), 0);
                SUF(prefetch_row)(du + ahead, dl, sizeof(IO), 1);
                SUF(prefetch_row)(ddt + ahead, dl, sizeof(REAL), 1);
            }
            const REAL *restrict dtv = DTs + (t - t0) * TILE, *restrict x = Xs + (t - t0) * TILE;
            for (int64_t d = 0; d < dl; d++) {
                dx[d] = 0;
                dlt[d] = 0;
            }
#if !IO_IS_REAL
            for (int64_t d = 0; d < dl; d++) {
                dyv[d] = LD(dy[row + d]);
                uv[d] = LD(u[row + d]);
            }
#endif
            for (int64_t n = 0; n < N; n++) {
                REAL *restrict gn = g + n * TILE, *restrict gAn = gA + n * TILE;
                const REAL *restrict sn = st + n * TILE, *restrict spn = sp + n * TILE;
                const REAL *restrict an = at + n * TILE, *restrict An = At + n * TILE;
                const REAL cn = Ct[n], bn = Bt_[n];
                REAL accB = 0, accC = 0;
#pragma omp simd reduction(+ : accB, accC)
                for (int64_t d = 0; d < dl; d++) {
                    const REAL gd = gn[d] + cn * dyt[d];
                    accC += dyt[d] * sn[d];
                    accB += gd * x[d];
                    dx[d] += gd * bn;
                    const REAL ga = gd * an[d];
                    const REAL dlog = ga * spn[d];
                    dlt[d] += dlog * An[d];
                    gAn[d] += dlog * dtv[d];
                    gn[d] = ga;
                }
                dBt[n] = accB;
                dCt[n] = accC;
            }
            for (int64_t d = 0; d < dl; d++) {
                du[row + d] = ST(dx[d] * dtv[d] + dyt[d] * Dv[d]);
                ddt[row + d] = dx[d] * uv[d] + dlt[d];  /* d/d(dt); times softplus' below */
                gD[d] += dyt[d] * uv[d];
            }
            if (dt_sp) {
#pragma omp simd
                for (int64_t d = 0; d < dl; d++) ddt[row + d] *= SUF(sigmoid)(dt[row + d]);
            }
        }
    }
    SUF(store_state)(dinit + b * Din * N, g, d0, dl, N);
    SUF(store_state)(dA + b * Din * N, gA, d0, dl, N);
    for (int64_t d = 0; d < dl; d++) dD[b * Din + d0 + d] = gD[d];
}

void SUF(scan_bwd)(const IO *u, const REAL *dt, const REAL *A, int64_t a_bstride, const REAL *Bm, const REAL *Cm,
                   const REAL *D, int64_t d_bstride, const uint8_t *reset, const int64_t *lengths, int64_t dt_sp,
                   int64_t Bt, int64_t T, int64_t Din, int64_t N, int64_t K, const REAL *ckpt, const IO *dy,
                   const REAL *dfinal, IO *du, REAL *ddt, REAL *dA, REAL *dB, REAL *dC, REAL *dD, REAL *dinit,
                   REAL *work, int64_t item0, int64_t item1) {
    const int64_t ntiles_ = (Din + TILE - 1) / TILE;
    for (int64_t item = item0; item < item1; item++) {
        const int64_t d0 = (item % ntiles_) * TILE, dl = Din - d0 < TILE ? Din - d0 : TILE;
        /* constant trip counts for the common shapes, so that every tile loop is a fixed run of vectors */
        if (dl == TILE && N == 16) SUF(scan_bwd_item)(u, dt, A, a_bstride, Bm, Cm, D, d_bstride, reset, lengths,
            ckpt, dy, dfinal, du, ddt, dA, dB, dC, dD, dinit, work, dt_sp, Bt, T, Din, (int64_t)16, K, item, TILE);
        else if (dl == TILE) SUF(scan_bwd_item)(u, dt, A, a_bstride, Bm, Cm, D, d_bstride, reset, lengths, ckpt, dy,
            dfinal, du, ddt, dA, dB, dC, dD, dinit, work, dt_sp, Bt, T, Din, N, K, item, TILE);
        else SUF(scan_bwd_item)(u, dt, A, a_bstride, Bm, Cm, D, d_bstride, reset, lengths, ckpt, dy, dfinal, du, ddt,
            dA, dB, dC, dD, dinit, work, dt_sp, Bt, T, Din, N, K, item, dl);
    }
}

/* NAME_par: the items split over an OpenMP team (PAR_ITEMS in _kernel_common.h) */
#ifdef _OPENMP
void SUF(scan_fwd_par)(const IO *u, const REAL *dt, const REAL *A, int64_t a_bstride, const REAL *Bm,
                       const REAL *Cm, const REAL *D, int64_t d_bstride, const uint8_t *reset, const int64_t *lengths,
                       int64_t dt_sp, int64_t Bt, int64_t T, int64_t Din, int64_t N, int64_t K, const REAL *init,
                       IO *y, REAL *final, REAL *ckpt, int64_t nitems, int64_t nthreads) {
    PAR_ITEMS(SUF(scan_fwd)(u, dt, A, a_bstride, Bm, Cm, D, d_bstride, reset, lengths, dt_sp, Bt, T, Din, N, K, init,
                            y, final, ckpt, i0_, i1_))
}

void SUF(scan_bwd_par)(const IO *u, const REAL *dt, const REAL *A, int64_t a_bstride, const REAL *Bm,
                       const REAL *Cm, const REAL *D, int64_t d_bstride, const uint8_t *reset, const int64_t *lengths,
                       int64_t dt_sp, int64_t Bt, int64_t T, int64_t Din, int64_t N, int64_t K, const REAL *ckpt,
                       const IO *dy, const REAL *dfinal, IO *du, REAL *ddt, REAL *dA, REAL *dB, REAL *dC, REAL *dD,
                       REAL *dinit, REAL *work, int64_t wstride, int64_t nitems, int64_t nthreads) {
    PAR_ITEMS(SUF(scan_bwd)(u, dt, A, a_bstride, Bm, Cm, D, d_bstride, reset, lengths, dt_sp, Bt, T, Din, N, K, ckpt,
                            dy, dfinal, du, ddt, dA, dB, dC, dD, dinit, work + w_ * wstride, i0_, i1_))
}
#endif

#define KERNEL_SELF "_scan_kernel.c"
#include "_kernel_passes.h"
