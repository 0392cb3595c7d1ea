# aotc: `make build` builds the default bundle, `make test` runs the CPU tests.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
JOBS ?= 2
# the GPU machine runs the system python (torch, cuda-bindings), no venv
GPU_PYTHON ?= python3

.PHONY: build test test-gpu sanitize bench bench-build venv clean

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

RESULTS ?= benchmarks/results

## sanitize: compute-sanitizer memcheck over every family at edge shapes, racecheck/synccheck on one variant each (GPU machine)
sanitize:
	bash tests/gpu/run_sanitizer.sh

## bench: the GPU benchmarks (run on the GPU machine with artifacts/default.aotc): JSON, plots and a table in $(RESULTS)
bench:
	$(GPU_PYTHON) benchmarks/bench_runtime.py --bundle artifacts/default.aotc --out $(RESULTS)
	$(GPU_PYTHON) benchmarks/bench_prefill.py --bundle artifacts/default.aotc --out $(RESULTS)
	$(GPU_PYTHON) benchmarks/bench_decode.py --bundle artifacts/default.aotc --out $(RESULTS)
	$(GPU_PYTHON) benchmarks/bench_kv_write.py --bundle artifacts/default.aotc --out $(RESULTS)
	$(GPU_PYTHON) benchmarks/decode_breakdown.py --bundle artifacts/default.aotc --out $(RESULTS)
	$(GPU_PYTHON) benchmarks/bench_decode_varlen.py --bundle artifacts/default.aotc --fa3 --out $(RESULTS)
	$(GPU_PYTHON) benchmarks/bench_fp8_kv.py --bundle artifacts/default.aotc --out $(RESULTS)
	$(GPU_PYTHON) benchmarks/bench_paged_varlen.py --bundle artifacts/default.aotc --fa3 --out $(RESULTS)
	$(GPU_PYTHON) benchmarks/bench_host.py --bundle artifacts/default.aotc --fa3 --out $(RESULTS)
	$(GPU_PYTHON) benchmarks/cold_start.py --bundle artifacts/default.aotc --runs 5 --out $(RESULTS)
	$(GPU_PYTHON) benchmarks/report.py --results $(RESULTS)

## bench-build: build-side and memory figures on this (CPU) machine
bench-build: $(VENV)/.installed
	$(PY) benchmarks/bench_build.py --out $(RESULTS)

clean:
	rm -rf $(VENV) gpu-logs .pytest_cache
