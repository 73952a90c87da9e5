#!/usr/bin/env bash
# One-shot check of linlm's GPU backend on a machine with a CUDA GPU (about 5-8 minutes):
#   1. the libraries: fla-core (flash-linear-attention's ops) and mamba-ssm, installed if missing and possible;
#   2. tests/ops/test_gpu_backends.py: the kernels against linlm's references (fp32, bf16, gradients, states), and
#      tests/conversion/test_fla_gpu.py: fla's HGRN2ForCausalLM against its conversion into linlm, and
#      tests/conversion/test_fla_classes.py: checkpoints of fla's own classes against the equations' references;
#   3. benchmarks/bench_gpu_kernels.py: kernels against linlm's torch path, fwd+bwd timings (JSON in results/);
#   4. the commands with --device cuda: linlm train (a few steps), linlm profile.
# Each step has its own time limit and a failure does not stop the later ones; the summary at the end says which
# passed. Logs go to $GPU_CHECK_OUT (default benchmarks/results/gpu_check).
#
#   bash benchmarks/gpu_check.sh
#
# Environment:
#   PYTHON            the interpreter (default python3); it needs a CUDA build of torch and linlm's dependencies
#   LINLM_WHEELS      a folder of wheels to install the libraries from, offline (pip --no-index --find-links)
#   GPU_CHECK_BUILD   1: also try to build mamba-ssm from source (pip --no-build-isolation; needs nvcc and
#                     usually takes far longer than this script's budget, so off by default)
#   GPU_CHECK_OUT     where the logs go
set -u
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
OUT=${GPU_CHECK_OUT:-benchmarks/results/gpu_check}
mkdir -p "$OUT"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
declare -a SUMMARY=()

step() {  # step NAME SECONDS CMD...: run with a time limit, log to $OUT/NAME.log, record the outcome
    local name=$1 limit=$2
    shift 2
    echo "== $name (limit ${limit}s)"
    timeout "$limit" "$@" > "$OUT/$name.log" 2>&1
    local rc=$?
    tail -n 25 "$OUT/$name.log"
    SUMMARY+=("$name: $([ $rc -eq 0 ] && echo ok || echo "FAILED (exit $rc, log $OUT/$name.log)")")
    return $rc
}

if ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    echo "gpu_check: $PY has no torch with a usable CUDA device; nothing to check" >&2
    exit 1
fi
"$PY" - <<'EOF'
import torch
print("torch", torch.__version__, "cuda", torch.version.cuda, "device", torch.cuda.get_device_name())
try:
    import triton
    print("triton", triton.__version__)
except ImportError:
    print("triton: not installed (fla needs it)")
EOF

# ---- 1. the libraries
have() { "$PY" -c "import $1" > /dev/null 2>&1; }
pip_install() {  # pip_install LIMIT ARGS...
    local limit=$1
    shift
    if [ -n "${LINLM_WHEELS:-}" ] && [ -d "$LINLM_WHEELS" ]; then
        timeout "$limit" "$PY" -m pip install -q --no-index --find-links "$LINLM_WHEELS" "$@"
    else
        timeout "$limit" "$PY" -m pip install -q "$@"
    fi
}
have fla.ops.gla || pip_install 120 "fla-core>=0.5.2" || echo "fla-core could not be installed: fla tests will skip"
have fla.models || pip_install 120 --no-deps "flash-linear-attention>=0.5.2" \
    || echo "flash-linear-attention (fla.models) could not be installed: the HGRN2 conversion check will skip"
if ! have mamba_ssm.ops.selective_scan_interface; then
    if [ -n "${LINLM_WHEELS:-}" ]; then
        pip_install 120 --no-deps "mamba-ssm>=2.2" || echo "mamba-ssm: no usable wheel in $LINLM_WHEELS"
    elif [ "${GPU_CHECK_BUILD:-0}" = 1 ]; then
        pip_install 600 --no-build-isolation --no-deps "mamba-ssm>=2.2" || echo "mamba-ssm: the build failed"
    else
        echo "mamba-ssm not installed (set LINLM_WHEELS or GPU_CHECK_BUILD=1): mamba_ssm tests will skip"
    fi
fi
"$PY" - <<'EOF'
from linlm.ops import backends
for lib in ("fla", "mamba_ssm"):
    print(f"{lib}: {'available' if backends.available(lib) else 'NOT available'}")
EOF

# ---- 2. tests against linlm's references
step tests 300 "$PY" -m pytest tests/ops/test_gpu_backends.py -q -rs -p no:cacheprovider

# fla's own HGRN2ForCausalLM against its conversion (linlm convert), logits to 1e-5
step convert_fla 180 "$PY" -m pytest tests/conversion/test_fla_gpu.py tests/conversion/test_fla_classes.py -q -rs \
    -p no:cacheprovider

# ---- 3. timings: kernels against linlm's torch path
step bench 150 "$PY" benchmarks/bench_gpu_kernels.py --repeat 5

# ---- 4. the commands on cuda
RUN=$(mktemp -d)
step train 120 "$PY" -m linlm train --config demo --arch hgrn2 --device cuda --steps 5 --out "$RUN/hgrn2" \
    --quiet
step profile 90 "$PY" -m linlm profile --archs tnl,hgrn2,mamba --preset tiny --contexts 256,1024 \
    --decode-tokens 8 --device cuda --no-hf --json "$OUT/profile.json"
rm -rf "$RUN"

echo "== summary"
printf '%s\n' "${SUMMARY[@]}"
