"""Test-suite wide settings: the markers STYLE.md names, so `-m "not compiler"` and friends work."""

import os

import pytest

# Plans in tests come from the cost model's recorded defaults, not from a micro-benchmark of whatever machine runs
# the suite, so that they are the same on every run (the calibration itself is exercised by the benchmarks).
os.environ.setdefault("EVONNX_COST_MODEL", "defaults")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "compiler: needs gcc/g++ (and onnxruntime's C API headers)")
    config.addinivalue_line("markers", "cuda: needs an NVIDIA GPU with a working driver")
    config.addinivalue_line("markers", "slow: takes more than a few seconds")
