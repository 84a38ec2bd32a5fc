"""Fixtures for the kernel tests: the onnxruntime headers and a library built from fused_kernels.c."""

from __future__ import annotations

from pathlib import Path

import pytest

from evonnx.kernels import build

HERE = Path(__file__).resolve().parent
KERNELS_SOURCE = HERE / "fused_kernels.c"


@pytest.fixture(scope="session")
def ort_headers() -> Path:
    return build.ort_headers_dir()


@pytest.fixture(scope="session")
def kernel_library(ort_headers: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("lib") / "test_model.evonnx.so"
    return build.build_model_library(KERNELS_SOURCE.read_text(), out, model_name="test_model.onnx")
