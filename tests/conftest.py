"""Test-suite wide settings: the markers STYLE.md names, so `-m "not compiler"` and friends work."""

import os

import pytest

# Plans in tests come from the cost model's recorded defaults, not from a micro-benchmark of whatever machine runs
# the suite, so that they are the same on every run (the calibration itself is exercised by the benchmarks).
os.environ.setdefault("EVONNX_COST_MODEL", "defaults")
# The never-slower guard times every optimized model against the original (about 2 s): off for the suite, whose
# hundreds of optimizations are about correctness, and on in tests/test_guard.py, which tests the guard itself.
os.environ.setdefault("EVONNX_GUARD", "0")
# A lowering that raises anything but Reject is a bug in it: users get the node left to onnxruntime, the suite gets
# an InternalError (passes/lower_ops.lower_node).
os.environ.setdefault("EVONNX_DEBUG", "1")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "compiler: needs gcc/g++ (and onnxruntime's C API headers)")
    config.addinivalue_line("markers", "cuda: needs an NVIDIA GPU with a working driver")
    config.addinivalue_line("markers", "slow: takes more than a few seconds")
