# Every target sets itself up: a virtual environment in .venv with the CPU build of torch.
# On a CUDA machine, run `make TORCH_SPEC="torch" ...` (or pre-install torch) to get a GPU build.
PYTHON ?= python3
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
PY := $(VENV)/bin/python
STAMP := $(VENV)/.linlm-installed

.PHONY: demo reproduce-smoke test test-avx2 bench install clean

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@$(PY) -c "import torch" 2>/dev/null || $(VENV)/bin/pip install -q "$(TORCH_SPEC)"
	$(VENV)/bin/pip install -q -e ".[dev]"
	@touch $(STAMP)

install: $(STAMP)

# The main job on its built-in default: `linlm reproduce` at toy size, every section, a report at the end.
# (`linlm demo`, the command, is a first training run; `make reproduce-smoke` names this target by what it runs.)
demo: $(STAMP)
	$(VENV)/bin/linlm reproduce --recipe smoke --out runs/reproduce-smoke

reproduce-smoke: demo

test: $(STAMP)
	$(PY) -m pytest -n 2 tests

# The numerics-sensitive tests again, with torch, MKL and oneDNN held to AVX2 (an AVX-512 CPU then rounds as an
# AVX2 one does): a test that passes only with one CPU's rounding fails here. The converters' tests compare against
# another library's float32 arithmetic, so they run here too.
AVX2_MODE := ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2 ONEDNN_MAX_CPU_ISA=AVX2
test-avx2: $(STAMP)
	$(AVX2_MODE) $(PY) -c "import torch; print('torch CPU capability:', torch.backends.cpu.get_cpu_capability())"
	$(AVX2_MODE) $(PY) -m pytest -n 2 tests/train tests/ops tests/layers tests/conversion

bench: $(STAMP)
	$(PY) benchmarks/run_all.py

clean:
	rm -rf $(VENV) build *.egg-info src/*.egg-info
