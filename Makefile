# Two commands for a fresh machine (see README):  `make demo`  and  `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
MODEL ?= models/delta2bbox.onnx

.PHONY: setup demo test bench lint clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -c constraints.txt -e '.[dev]'
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

lint: setup
	$(BIN)/ruff check evonnx passes kernels cli.py tests benchmarks models/*.py
	$(BIN)/python tests/typecheck.py

clean:
	rm -rf $(VENV) out build *.egg-info
