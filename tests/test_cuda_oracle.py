"""Oracle on the GPU: every models/ model under onnxruntime's CUDA execution provider, original vs optimized with
the library built for `--target cuda`. Skipped without a usable GPU (driver, device, onnxruntime-gpu).

Also checks that every Fused node really ran on the CUDA provider (from onnxruntime's profile), so a silent
fallback to the CPU kernel cannot pass.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest

from evonnx.api import _exact_outputs, library_path, optimize
from evonnx.kernels import build
from evonnx.kernels.codegen_c import generate
from evonnx.kernels.codegen_cuda import generate_cuda, generate_cuda_host
from evonnx.verify import CheckResult, _compare, make_inputs

pytestmark = [pytest.mark.cuda, pytest.mark.compiler]

REPO = Path(__file__).resolve().parents[1]
MODELS = REPO / "models"
MANIFEST = {e["name"]: e for e in json.loads((MODELS / "manifest.json").read_text())["models"]}
CUDA = "CUDAExecutionProvider"
_NO_GPU = build.cuda_unavailable()  # why the GPU tests cannot run here, or None


def _session(path: Path, library: Path | None, profile: bool = False):  # noqa: ANN202
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 3
    if library is not None:
        so.register_custom_ops_library(str(library))
    if profile:
        so.enable_profiling = True
        so.profile_file_prefix = str(path.with_suffix(""))
    return ort.InferenceSession(str(path), so, providers=[CUDA, "CPUExecutionProvider"])


@pytest.mark.parametrize("name", list(MANIFEST))
def test_cuda_optimized_model_matches_original_on_cuda_ep(name: str, tmp_path: Path) -> None:
    reason = _NO_GPU
    if reason is not None:
        pytest.skip(reason)
    entry = MANIFEST[name]
    src = MODELS / entry["file"]
    dst = tmp_path / f"{name}.opt.onnx"
    specs = optimize(src, dst, check=False).kernels
    lib = library_path(dst)
    build.build_model_library(generate(specs, dst.name) + generate_cuda_host(specs), lib, model_name=dst.name,
                              cuda_source=generate_cuda(specs, dst.name))

    original = onnx.load(str(src))
    exact = _exact_outputs(onnx.load(str(dst)), specs)
    ref = _session(src, None)
    opt = _session(dst, lib, profile=True)
    result = CheckResult()
    for case in entry["checked_cases"]:
        for seed in (0, 1):
            feeds = make_inputs(original, {}, seed, case)
            for out, r, g in zip(original.graph.output, ref.run(None, feeds), opt.run(None, feeds), strict=True):
                _compare(out.name, np.asarray(r), np.asarray(g), out.name in exact, result)
    assert result.compared > 0

    events = json.loads(Path(opt.end_profiling()).read_text())
    fused = {n.name for n in onnx.load(str(dst)).graph.node if n.op_type == "Fused"}
    placed = {e["name"].removesuffix("_kernel_time"): e["args"].get("provider") for e in events
              if e.get("cat") == "Node" and e["name"].removesuffix("_kernel_time") in fused}
    assert placed and set(placed.values()) == {CUDA}, placed
