"""Test-suite wide settings: the markers STYLE.md names, so `-m "not compiler"` and friends work."""

import pytest


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "compiler: needs gcc/g++ (and onnxruntime's C API headers)")
    config.addinivalue_line("markers", "cuda: needs an NVIDIA GPU with a working driver")
    config.addinivalue_line("markers", "slow: takes more than a few seconds")
