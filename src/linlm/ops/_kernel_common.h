/* What every compiled kernel of linlm.ops shares (the kernels are _scan_kernel.c, _conv_kernel.c, _gate_kernel.c,
   _gather_sum_kernel.c, _gemv_kernel.c and _step_kernel.c, built into one library by linlm.ops.kernel_library): the
   dtype variants, the bfloat16 conversions, the vectorisable exp, sigmoid and softplus, and the OpenMP splitting of work
   items. Each kernel file includes this header at its top and _kernel_passes.h at its end.

   One compile gives three variants: each kernel file includes itself again at its end (through _kernel_passes.h),
   so every function exists as NAME_f32, NAME_f64 and NAME_bf16. REAL is the type of the arithmetic, IO the type of
   the activations a kernel reads and writes (the scan's u, y and their gradients; every buffer of the conv and the
   gate but the conv's weights; the gather-sum's rows, not its weights): float / float in _f32, double / double in
   _f64, and in _bf16 float arithmetic on bfloat16 activations (IO is uint16_t, widened to float by LD and rounded
   back to nearest even by ST, as torch rounds), so that bfloat16 tensors are read and written in place instead of
   converted to float32 and back around the kernel. Everything accumulates in REAL.
   No Python or torch headers: the kernels take raw pointers to row-major buffers and are called through ctypes,
   which releases the GIL, so the caller can split the work items over threads. */

#ifndef REAL  /* the first pass: float32 */
#define REAL float
#define REAL_IS_DOUBLE 0
#define SUF(name) name##_f32
#define IO float
#define IO_IS_REAL 1  /* no widening: the kernels read and write IO buffers directly, without staging copies */
#define LD(v) (v)
#define ST(v) (v)
#define KERNEL_PASS 1
#endif

#ifndef KERNEL_COMMON_ONCE
#define KERNEL_COMMON_ONCE
#include <stdint.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

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

/* Entry points that split the work items over an OpenMP team (built with -fopenmp only): the library then runs in
   torch's own OpenMP thread pool (the process has one libgomp, torch's), so the pool's worker, which spins for a while
   after each of torch's parallel ops, takes the kernel's share of the items instead of competing for a
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
#endif

#define GEMV_ROWS 64  /* weight rows per work item of gemv_rows (_gemv_kernel.c) */
#endif /* KERNEL_COMMON_ONCE */

/* exp(x) for x <= 0 (the decays; dt >= 0 and A <= 0 are checked by the caller), in plain arithmetic so that the
   compiler vectorises it: range reduction x = n ln2 + r, |r| <= ln2 / 2, a polynomial for exp(r), and 2^n from the
   exponent bits. The polynomial is 1 + r + c2 r^2 + ...: Taylor's in float64; in float32 a minimax fit of degree 6
   (relative error 3.1e-9 on |r| <= ln2 / 2, below float32's rounding; Remez exchange in 50-digit arithmetic, 1 + r
   fixed so that exp(0) is exactly 1), one multiply-add fewer than Taylor's degree 7 at the same accuracy: the decays
   take most of the scan's time. Below the smallest normal number (x < -87.3 in float32, -708 in float64) it returns 0
   (the 2^n factor is clamped to the bit pattern of 0.0); the clamp is on the integer n, because a comparison of floats
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
