/* The gated SiLU out = silu(g) * u, forward and backward, for linlm.ops.gate_kernel, over M rows of F values: SwiGLU's
   activation (g and u the two halves of one [M, 2F] projection) and Mamba's output gate (g = z, u = the scan's y). g,
   u, dg and du are read or written with their own row strides (gs, us, dgs, dus elements; the values of a row are
   contiguous); out and dout are contiguous [M, F]. Items: blocks of GATE_ROWS rows. The backward recomputes sigmoid(g)
   (nothing saved but the inputs): du = dout silu(g), dg = dout u sigmoid(g) (1 + g (1 - sigmoid(g))). */

#include "_kernel_common.h"

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

/* NAME_par: the items split over an OpenMP team (PAR_ITEMS in _kernel_common.h) */
#ifdef _OPENMP
void SUF(silu_mul_fwd_par)(const IO *g, int64_t gs, const IO *u, int64_t us, IO *out, int64_t M, int64_t F,
                           int64_t nitems, int64_t nthreads) {
    PAR_ITEMS(SUF(silu_mul_fwd)(g, gs, u, us, out, M, F, i0_, i1_))
}

void SUF(silu_mul_bwd_par)(const IO *dout, const IO *g, int64_t gs, const IO *u, int64_t us, IO *dg,
                           int64_t dgs, IO *du, int64_t dus, int64_t M, int64_t F, int64_t nitems,
                           int64_t nthreads) {
    PAR_ITEMS(SUF(silu_mul_bwd)(dout, g, gs, u, us, dg, dgs, du, dus, M, F, i0_, i1_))
}
#endif

#define KERNEL_SELF "_gate_kernel.c"
#include "_kernel_passes.h"
