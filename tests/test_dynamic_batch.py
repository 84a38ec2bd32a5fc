"""A dynamic batch survives optimization: the optimized delta2bbox (B symbolic) runs at any B, matches the original,
and never declares a sample batch size (onnxruntime would constant-fold `Shape` of a frozen dim)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from model_inputs import ENTRIES, MODELS_DIR, make_inputs
from onnx import helper

import evonnx
from evonnx.model import DOMAIN

pytestmark = pytest.mark.compiler

ENTRY = ENTRIES["delta2bbox"]
SOURCE = MODELS_DIR / ENTRY["file"]


@pytest.fixture(scope="module")
def optimized(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, evonnx.OptimizeResult]:
    out = tmp_path_factory.mktemp("dyn") / "delta2bbox.opt.onnx"
    return out, evonnx.optimize(SOURCE, out)  # no sizes: the check itself must try several B


def _feeds(batch: int) -> dict[str, np.ndarray]:
    return make_inputs(ENTRY, {i["name"]: [batch, *i["shape"][1:]] for i in ENTRY["inputs"]}, seed=batch)


def _dims(vi: onnx.ValueInfoProto) -> list[int | str | None]:
    return [d.dim_value if d.HasField("dim_value") else (d.dim_param if d.HasField("dim_param") else None)
            for d in vi.type.tensor_type.shape.dim]


def test_dynamic_batch_check_ran_several_sizes(optimized: tuple[Path, evonnx.OptimizeResult]) -> None:
    _, result = optimized
    assert result.check is not None
    assert len({tuple(sorted(r.items())) for r in result.check.runs}) >= 2
    assert all("B" in r for r in result.check.runs)


@pytest.mark.parametrize("batch", [1, 2, 7])
def test_dynamic_batch_optimized_matches_original(batch: int, optimized: tuple[Path, evonnx.OptimizeResult]) -> None:
    out, result = optimized
    feeds = _feeds(batch)
    (ref,) = ort.InferenceSession(str(SOURCE), providers=["CPUExecutionProvider"]).run(None, feeds)
    (got,) = evonnx.load_session(out).run(None, feeds)
    assert got.shape == ref.shape == (batch, 20000, 4)
    scale = float(np.abs(ref).max())
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-5 * scale)


def test_dynamic_batch_fused_outputs_keep_a_symbolic_batch(optimized: tuple[Path, evonnx.OptimizeResult]) -> None:
    out, _ = optimized
    model = onnx.load(str(out))
    fused = [n for n in model.graph.node if n.domain == DOMAIN]
    assert fused
    typed = {vi.name: vi for vi in list(model.graph.value_info) + list(model.graph.output)}
    for n in fused:
        for t in n.output:
            assert t in typed, f"fused output {t} has no declared type"
            dims = _dims(typed[t])
            assert dims[0] in ("B", None), f"{t}: batch dim declared as {dims[0]!r}"
    assert _dims(next(o for o in model.graph.output if o.name == ENTRY["outputs"][0]["name"]))[0] == "B"


def test_dynamic_batch_shape_of_fused_output_downstream(optimized: tuple[Path, evonnx.OptimizeResult],
                                                         tmp_path: Path) -> None:
    """A builtin `Shape` reading a fused output sees the run-time batch, not a size folded at load time."""
    out, _ = optimized
    model = onnx.load(str(out))
    y = model.graph.output[0].name
    model.graph.node.append(helper.make_node("Shape", [y], ["y_shape"], name="downstream_shape"))
    model.graph.output.append(helper.make_tensor_value_info("y_shape", onnx.TensorProto.INT64, [3]))
    path = tmp_path / "with_shape.onnx"
    onnx.save(model, str(path))
    evonnx.library_path(path).symlink_to(evonnx.library_path(out))  # the kernels are the same
    for batch in (1, 7):
        _, shape = evonnx.load_session(path).run(None, _feeds(batch))
        assert shape.tolist() == [batch, 20000, 4]
