/* The end of every kernel file of linlm.ops: its code again, in double precision (pass 2), then float arithmetic
   on bfloat16 activations (pass 3); see _kernel_common.h. The including file names itself in KERNEL_SELF. */
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
#include KERNEL_SELF
#endif
