# Two commands for a fresh machine (see README):  `make demo`  and  `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
MODEL ?= models/delta2bbox.onnx

.PHONY: setup demo test bench ci-bench lint clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -c constraints.txt -e '.[dev]'
	$(BIN)/python -m pip install -q -c constraints.txt -e '.[cuda]' || echo "no NVRTC wheel here: its tests skip"
	$(BIN)/evonnx build-runtime >/dev/null
	touch $@

# The main job: optimize a shipped detection model and check it against onnxruntime.
demo: setup
	mkdir -p out
	$(BIN)/evonnx optimize $(MODEL) -o out/$(notdir $(MODEL:.onnx=.opt.onnx))

# Lint and strict typing first (issue 13): a failure stops CI before the 15-minute suite.
test: setup
	$(BIN)/ruff check evonnx passes kernels cli.py tests benchmarks models/*.py
	$(BIN)/python tests/typecheck.py
	$(BIN)/python -m pytest -q

bench: setup
	$(BIN)/python benchmarks/cpu.py

# The README's CI recipe on four models/ models (one with 0-d inputs): bench, then compare with the committed
# baseline. The slowdown threshold is wide (CI machines vary); a failed check or a lost fusion fails it.
CI_BENCH_MODELS ?= models/anchor_grid.onnx models/valid_flags.onnx models/yolo_decode.onnx \
	models/easyview_gen_base_anchors.onnx
ci-bench: setup
	mkdir -p out/ci
	$(BIN)/evonnx bench $(CI_BENCH_MODELS) --threads 1 --seconds 0.2 --no-guard \
		--json out/ci/bench.json --markdown out/ci/bench.md --junit out/ci/bench.xml
	$(BIN)/evonnx compare .ci/bench-baseline.json out/ci/bench.json --max-slowdown 60% --markdown out/ci/compare.md

lint: setup
	$(BIN)/ruff check evonnx passes kernels cli.py tests benchmarks models/*.py
	$(BIN)/python tests/typecheck.py

clean:
	rm -rf $(VENV) out build *.egg-info
