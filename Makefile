# aotc: `make build` builds the default bundle, `make test` runs the CPU tests.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
JOBS ?= 2
# the GPU machine runs the system python (torch, cuda-bindings), no venv
GPU_PYTHON ?= python3

.PHONY: build test test-gpu bench venv clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[compile,test]'
	touch $@

venv: $(VENV)/.installed

## build: compile specs/default.toml into the cache and write artifacts/default.aotc
build: $(VENV)/.installed
	$(VENV)/bin/aotc build -j $(JOBS) --bundle artifacts/default.aotc

## test: every test that needs no GPU (CI runs this)
test: $(VENV)/.installed
	$(PY) -m pytest -m "not gpu" -q

## test-gpu: the GPU suite, one process per file (run on the GPU machine, after `make build` here)
test-gpu:
	bash tests/gpu/run_suite.sh $(GPU_PYTHON)

## bench: runtime benchmarks on the GPU machine; JSON into benchmarks/results/
bench:
	$(GPU_PYTHON) benchmarks/bench_runtime.py --bundle artifacts/default.aotc --out benchmarks/results

clean:
	rm -rf $(VENV) gpu-logs .pytest_cache
