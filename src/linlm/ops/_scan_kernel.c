/* The S6 selective scan as a plain C kernel, forward and backward, for linlm.ops.scan_kernel.

   One compile gives three variants: the file includes itself again at the end, so every function exists as
   NAME_f32, NAME_f64 and NAME_bf16. REAL is the type of the arithmetic, IO the type of the activations a kernel
   reads and writes (the scan's u, y and their gradients; every buffer of the conv and the gate but the conv's
   weights; the gather-sum's rows, not its weights): float / float in _f32, double / double in _f64, and in _bf16
   float arithmetic on bfloat16 activations (IO is uint16_t, widened to float by LD and rounded back to nearest even
   by ST, as torch rounds), so that bfloat16 tensors are read and written in place instead of converted to float32
   and back around the kernel. Everything accumulates in REAL.
   No Python or torch headers: it takes raw pointers to contiguous row-major buffers and is called through ctypes,
   which releases the GIL, so the caller can split the work items over threads. Shapes (as selective_scan.py):

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

#include <stdint.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#ifndef REAL
#define REAL float
#define REAL_IS_DOUBLE 0
#define SUF(name) name##_f32
#define IO float
#define IO_IS_REAL 1  /* no widening: the kernels read and write IO buffers directly, without staging copies */
#define LD(v) (v)
#define ST(v) (v)
#define KERNEL_PASS 1

/* bfloat16 <-> float: the upper 16 bits of a float. Widening is exact; narrowing rounds to nearest even, a NaN
   becoming the quiet NaN 0x7FC0, as c10::BFloat16 does (so results equal torch's .to(torch.bfloat16) of the float
   result). Integer arithmetic only, so that gcc vectorises the loops that use them. */
static inline float bf16_to_f32(uint16_t h) {
    union { uint32_t i; float f; } v;
    v.i = (uint32_t)h << 16;
    return v.f;
}

static inline uint16_t f32_to_bf16(float f) {
    union { float f; uint32_t i; } v;
    v.f = f;
    const uint32_t rounded = (v.i + 0x7FFFu + ((v.i >> 16) & 1u)) >> 16;
    return (v.i & 0x7FFFFFFFu) > 0x7F800000u ? (uint16_t)0x7FC0 : (uint16_t)rounded;
}
#endif

#define TILE 64

/* exp(x) for x <= 0 (the decays; dt >= 0 and A <= 0 are checked by the caller), in plain arithmetic so that the
   compiler vectorises it: range reduction x = n ln2 + r, |r| <= ln2 / 2, a polynomial for exp(r), and 2^n from the
   exponent bits. The polynomial is 1 + r + c2 r^2 + ...: Taylor's in float64; in float32 a minimax fit of degree 6
   (relative error 3.1e-9 on |r| <= ln2 / 2, below float32's rounding; Remez exchange in 50-digit arithmetic, 1 + r
   fixed so that exp(0) is exactly 1), one multiply-add fewer than Taylor's degree 7 at the same accuracy: the
   decays take most of the scan's time. Below the smallest normal number (x < -87.3 in float32, -708 in float64) it returns 0 (the
   2^n factor is clamped to the bit pattern of 0.0); the clamp is on the integer n, because a comparison of floats
   in the loop stops gcc from vectorising it. Valid for x down to about -1.4e9 (where n overflows an int32). */
#if REAL_IS_DOUBLE
#define EXP_LOG2E 1.4426950408889634
#define EXP_LN2_HI 0.693145751953125
#define EXP_LN2_LO 1.4286068203094173e-06
#define EXP_NCOEF 14  /* 1/13! down to 1/0!: error below 1e-17 for |r| <= ln2 / 2 */
#define EXP_MIN_N (-1023)
#define EXP_BIAS 1023
#define EXP_SHIFT 52
#define EXP_BITS int64_t
#define FABS __builtin_fabs
#define COPYSIGN __builtin_copysign
static const double SUF(exp_coef)[EXP_NCOEF] = {
    1.0 / 6227020800.0, 1.0 / 479001600.0, 1.0 / 39916800.0, 1.0 / 3628800.0, 1.0 / 362880.0, 1.0 / 40320.0,
    1.0 / 5040.0, 1.0 / 720.0, 1.0 / 120.0, 1.0 / 24.0, 1.0 / 6.0, 0.5, 1.0, 1.0};
#else
#define EXP_LOG2E 1.44269504f
#define EXP_LN2_HI 0.693359375f
#define EXP_LN2_LO (-2.12194440e-4f)
#define EXP_NCOEF 7  /* degree 6, highest first */
#define EXP_MIN_N (-127)
#define EXP_BIAS 127
#define EXP_SHIFT 23
#define EXP_BITS int32_t
#define FABS __builtin_fabsf  /* the float builtins: the double ones would convert every vector to double and back */
#define COPYSIGN __builtin_copysignf
static const float SUF(exp_coef)[EXP_NCOEF] = {
    1.3814613224e-3f, 8.3687098264e-3f, 4.1668387363e-2f, 1.6666520690e-1f, 4.9999993452e-1f, 1.0f, 1.0f};
#endif

static inline REAL SUF(exp_neg)(REAL x) {
    int32_t ni = (int32_t)(x * EXP_LOG2E - (REAL)0.5);  /* round to nearest, x <= 0 */
    const REAL n = (REAL)ni;
    const REAL r = x - n * EXP_LN2_HI - n * EXP_LN2_LO;
    REAL p = SUF(exp_coef)[0];
    for (int i = 1; i < EXP_NCOEF; i++) p = p * r + SUF(exp_coef)[i];
    ni = ni < EXP_MIN_N ? EXP_MIN_N : ni;  /* 2^n = 0.0 below the normal range */
    union { REAL f; EXP_BITS i; } v;
    v.i = ((EXP_BITS)ni + EXP_BIAS) << EXP_SHIFT;
    return p * v.f;
}

/* sigmoid(z) = 1 / (1 + e) for z >= 0 and e / (1 + e) for z < 0, e = exp(-|z|) in (0, 1] (no overflow for any z),
   with the numerator chosen without a comparison (h = +-1/2 by z's sign), so that the loops stay vectorised. Each
   branch is accurate relative to its value; 1 - 1 / (1 + e) for z < 0 would lose it to cancellation below about
   z = -8 (float32: 1e-3 relative at z = -10, 20 % at -15). */
static inline REAL SUF(sigmoid)(REAL z) {
    const REAL e = SUF(exp_neg)(-FABS(z));
    const REAL h = COPYSIGN((REAL)0.5, z);
    return (((REAL)0.5 + h) + ((REAL)0.5 - h) * e) / ((REAL)1 + e);
}

/* d silu(z) / dz, given sg = sigmoid(z) */
static inline REAL SUF(dsilu)(REAL z, REAL sg) {
    return sg * ((REAL)1 + z * ((REAL)1 - sg));
}

/* softplus(x) = max(x, 0) + log1p(exp(-|x|)), with log1p(e) = 2 atanh(s) = 2 (s + s^3/3 + s^5/5 + ...) for
   s = e / (2 + e) in [0, 1/3]: SP_NCOEF terms of the series in s^2 <= 1/9 (error below 2e-8 in float32, 2e-17 in
   float64, relative, also for tiny e). max(x, 0) = (x + |x|) / 2 is exact. */
#if REAL_IS_DOUBLE
#define SP_NCOEF 17
#else
#define SP_NCOEF 8
#endif
static inline REAL SUF(softplus)(REAL x) {
    const REAL ax = FABS(x);
    const REAL e = SUF(exp_neg)(-ax);
    const REAL s = e / ((REAL)2 + e), s2 = s * s;
    REAL p = (REAL)1 / (REAL)(2 * SP_NCOEF - 1);
    for (int i = SP_NCOEF - 2; i >= 0; i--) p = p * s2 + (REAL)1 / (REAL)(2 * i + 1);
    return (REAL)0.5 * (x + ax) + (REAL)2 * s * p;
}

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

void SUF(scan_fwd)(const IO *u, const REAL *dt, const REAL *A, int64_t a_bstride, const REAL *Bm, const REAL *Cm,
                   const REAL *D, int64_t d_bstride, const REAL *init, const uint8_t *reset, const int64_t *lengths,
                   IO *y, REAL *final, REAL *ckpt, int64_t dt_sp, int64_t Bt, int64_t T, int64_t Din, int64_t N,
                   int64_t K, int64_t item0, int64_t item1) {
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
                   const REAL *D, int64_t d_bstride, const uint8_t *reset, const int64_t *lengths, const REAL *ckpt,
                   const IO *dy, const REAL *dfinal, IO *du, REAL *ddt, REAL *dA, REAL *dB, REAL *dC, REAL *dD,
                   REAL *dinit, REAL *work, int64_t dt_sp, int64_t Bt, int64_t T, int64_t Din, int64_t N, int64_t K,
                   int64_t item0, int64_t item1) {
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

/* Mamba's short convolution with the SiLU after it: a causal depthwise conv1d over time, K taps, on x [Bt, T, C]
   with the K - 1 inputs before x in state [Bt, K - 1, C] (NULL: zeros), weights wt [K, C] (tap j reads the input
   lag K - 1 - j steps back), bias [C]. since [Bt, T] (NULL: no documents) counts the steps since the latest document
   start; a tap whose lag exceeds it reads an earlier document and is dropped. out = silu(pre). Items: (row b, block
   of CONV_TB time steps), all channels, so that every access is a contiguous row. x's rows may be further apart than
   C (xs elements: one half of a [Bt, T, 2C] projection, read in place); every other buffer is contiguous. */
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

/* The gated SiLU out = silu(g) * u, forward and backward, over M rows of F values: SwiGLU's activation (g and u the
   two halves of one [M, 2F] projection) and Mamba's output gate (g = z, u = the scan's y). g, u, dg and du are read
   or written with their own row strides (gs, us, dgs, dus elements; the values of a row are contiguous); out and dout
   are contiguous [M, F]. Items: blocks of GATE_ROWS rows. The backward recomputes sigmoid(g) (nothing saved but the
   inputs): du = dout silu(g), dg = dout u sigmoid(g) (1 + g (1 - sigmoid(g))). */
#define GATE_ROWS 16

void SUF(silu_mul_fwd)(const IO *g, int64_t gs, const IO *u, int64_t us, IO *out, int64_t M, int64_t F,
                       int64_t item0, int64_t item1) {
    for (int64_t item = item0; item < item1; item++) {
        const int64_t r1 = (item + 1) * GATE_ROWS < M ? (item + 1) * GATE_ROWS : M;
        for (int64_t r = item * GATE_ROWS; r < r1; r++) {
            const IO *restrict gr = g + r * gs, *restrict ur = u + r * us;
            IO *restrict o = out + r * F;
#pragma omp simd
            for (int64_t c = 0; c < F; c++) {
                const REAL gv = LD(gr[c]);
                o[c] = ST(gv * SUF(sigmoid)(gv) * LD(ur[c]));
            }
        }
    }
}

void SUF(silu_mul_bwd)(const IO *dout, const IO *g, int64_t gs, const IO *u, int64_t us, IO *dg, int64_t dgs,
                       IO *du, int64_t dus, int64_t M, int64_t F, int64_t item0, int64_t item1) {
    for (int64_t item = item0; item < item1; item++) {
        const int64_t r1 = (item + 1) * GATE_ROWS < M ? (item + 1) * GATE_ROWS : M;
        for (int64_t r = item * GATE_ROWS; r < r1; r++) {
            const IO *restrict o = dout + r * F, *restrict gr = g + r * gs, *restrict ur = u + r * us;
            IO *restrict dgr = dg + r * dgs, *restrict dur = du + r * dus;
#pragma omp simd
            for (int64_t c = 0; c < F; c++) {
                const REAL gv = LD(gr[c]), ov = LD(o[c]);
                const REAL sg = SUF(sigmoid)(gv);
                dur[c] = ST(ov * gv * sg);
                dgr[c] = ST(ov * LD(ur[c]) * SUF(dsilu)(gv, sg));
            }
        }
    }
}

/* The gather-sum of rows behind the mixtures of experts' read-back: out[n] = sum_j w[n, j] src[idx[n, j]] over the
   m entries of row n of idx [M, m] (w [M, m]), src and out rows of D contiguous values, where no src row is read
   twice (each expert slot is one token's; a permutation of the slots in the MLP's combine). Items: blocks of
   GATHER_ROWS output rows. The backward: dsrc[idx[n, j]] = w[n, j] dout[n], a plain store as no row is read twice
   (rows that no entry reads are not touched: the caller zeroes them), and dw[n, j] = dout[n] . src[idx[n, j]], both
   from one read of dout[n] and of the row. Distinct items write distinct rows, so they may run on any threads. */
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

/* Entry points that split the work items over an OpenMP team (built with -fopenmp only): the library then runs in
   torch's own OpenMP thread pool (the process has one libgomp, torch's), so the pool's worker, which spins for a few
   milliseconds after each of torch's parallel ops, takes the kernel's share of the items instead of competing for a
   core with a thread of the caller's. Each function is NAME's arguments without (item0, item1), then nitems and
   nthreads; a per-thread scratch buffer is passed as the first thread's, with the spacing between threads' buffers.
   Contiguous ranges of items per thread, as the callers' own splitting. */
#ifdef _OPENMP
#define PAR_ITEMS(CALL)                                                                                             \
    _Pragma("omp parallel num_threads(nthreads)") {                                                                 \
        const int64_t w_ = omp_get_thread_num(), nw_ = omp_get_num_threads();                                       \
        const int64_t i0_ = nitems * w_ / nw_, i1_ = nitems * (w_ + 1) / nw_;                                       \
        if (i0_ < i1_) CALL;                                                                                        \
    }

void SUF(scan_fwd_par)(const IO *u, const REAL *dt, const REAL *A, int64_t a_bstride, const REAL *Bm,
                       const REAL *Cm, const REAL *D, int64_t d_bstride, const REAL *init, const uint8_t *reset,
                       const int64_t *lengths, IO *y, REAL *final, REAL *ckpt, int64_t dt_sp, int64_t Bt, int64_t T,
                       int64_t Din, int64_t N, int64_t K, int64_t nitems, int64_t nthreads) {
    PAR_ITEMS(SUF(scan_fwd)(u, dt, A, a_bstride, Bm, Cm, D, d_bstride, init, reset, lengths, y, final, ckpt, dt_sp,
                            Bt, T, Din, N, K, i0_, i1_))
}

void SUF(scan_bwd_par)(const IO *u, const REAL *dt, const REAL *A, int64_t a_bstride, const REAL *Bm,
                       const REAL *Cm, const REAL *D, int64_t d_bstride, const uint8_t *reset, const int64_t *lengths,
                       const REAL *ckpt, const IO *dy, const REAL *dfinal, IO *du, REAL *ddt, REAL *dA, REAL *dB,
                       REAL *dC, REAL *dD, REAL *dinit, REAL *work, int64_t wstride, int64_t dt_sp, int64_t Bt,
                       int64_t T, int64_t Din, int64_t N, int64_t K, int64_t nitems, int64_t nthreads) {
    PAR_ITEMS(SUF(scan_bwd)(u, dt, A, a_bstride, Bm, Cm, D, d_bstride, reset, lengths, ckpt, dy, dfinal, du, ddt, dA,
                            dB, dC, dD, dinit, work + w_ * wstride, dt_sp, Bt, T, Din, N, K, i0_, i1_))
}

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

void SUF(silu_mul_fwd_par)(const IO *g, int64_t gs, const IO *u, int64_t us, IO *out, int64_t M, int64_t F,
                           int64_t nitems, int64_t nthreads) {
    PAR_ITEMS(SUF(silu_mul_fwd)(g, gs, u, us, out, M, F, i0_, i1_))
}

void SUF(silu_mul_bwd_par)(const IO *dout, const IO *g, int64_t gs, const IO *u, int64_t us, IO *dg,
                           int64_t dgs, IO *du, int64_t dus, int64_t M, int64_t F, int64_t nitems,
                           int64_t nthreads) {
    PAR_ITEMS(SUF(silu_mul_bwd)(dout, g, gs, u, us, dg, dgs, du, dus, M, F, i0_, i1_))
}

void SUF(gather_sum_fwd_par)(const IO *src, const int64_t *idx, const REAL *w, IO *out, int64_t M, int64_t m,
                             int64_t D, int64_t nitems, int64_t nthreads) {
    PAR_ITEMS(SUF(gather_sum_fwd)(src, idx, w, out, M, m, D, i0_, i1_))
}

void SUF(gather_sum_bwd_par)(const IO *dout, const IO *src, const int64_t *idx, const REAL *w, IO *dsrc,
                             REAL *dw, int64_t M, int64_t m, int64_t D, int64_t nitems, int64_t nthreads) {
    PAR_ITEMS(SUF(gather_sum_bwd)(dout, src, idx, w, dsrc, dw, M, m, D, i0_, i1_))
}
#undef PAR_ITEMS
#endif

/* The same code again: in double precision (pass 2), then float arithmetic on bfloat16 activations (pass 3). */
#if KERNEL_PASS < 3
#undef REAL
#undef REAL_IS_DOUBLE
#undef SUF
#undef IO
#undef IO_IS_REAL
#undef LD
#undef ST
#undef EXP_LOG2E
#undef EXP_LN2_HI
#undef EXP_LN2_LO
#undef EXP_NCOEF
#undef EXP_MIN_N
#undef EXP_BIAS
#undef EXP_SHIFT
#undef EXP_BITS
#undef SP_NCOEF
#undef FABS
#undef PF_STEPS
#undef COPYSIGN
#if KERNEL_PASS == 1
#undef KERNEL_PASS
#define KERNEL_PASS 2
#define REAL double
#define REAL_IS_DOUBLE 1
#define SUF(name) name##_f64
#define IO double
#define IO_IS_REAL 1
#define LD(v) (v)
#define ST(v) (v)
#else
#undef KERNEL_PASS
#define KERNEL_PASS 3
#define REAL float
#define REAL_IS_DOUBLE 0
#define SUF(name) name##_bf16
#define IO uint16_t
#define IO_IS_REAL 0
#define LD(v) bf16_to_f32(v)
#define ST(v) f32_to_bf16(v)
#endif
#include "_scan_kernel.c"
#endif
