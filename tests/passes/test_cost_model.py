"""The cost model: its calibration measures this machine, and it prices plans in a sensible order."""

from __future__ import annotations

from pathlib import Path

import pytest

from evonnx.model import load_model
from evonnx.passes.cost_model import CostModel, calibrate
from evonnx.passes.pipeline import run_pipeline
from evonnx.passes.plan_fusion import _Graph
from evonnx.passes.plan_search import _Costing

MODELS = Path(__file__).resolve().parents[2] / "models"


@pytest.mark.compiler
def test_cost_model_calibration_measures_this_machine(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("EVONNX_COST_MODEL", raising=False)
    monkeypatch.setenv("EVONNX_CACHE_DIR", str(tmp_path))
    cm = calibrate(use_cache=False)
    assert cm.source == "calibrated"
    assert all(v > 0 for v in (cm.ort_node_us, cm.kernel_us, cm.ns_per_byte, cm.ns_per_op, cm.ns_per_special,
                               cm.ns_per_reduce_step))
    # a fused reduction is a dependent scalar chain; plain arithmetic in a loop vectorises
    assert cm.ns_per_reduce_step > cm.ns_per_op
    assert calibrate() == cm  # read back from the cache, not measured again


@pytest.mark.parametrize("name", ["delta2bbox", "yolo_decode", "clamp_inplace"])
def test_cost_model_prices_fusion_below_no_fusion(name: str) -> None:
    r = run_pipeline(load_model(MODELS / f"{name}.onnx"), cost_model=CostModel())
    gr = _Graph(r.graph, r.analysis)
    costing = _Costing(r.graph, r.analysis, gr, r.stats, r.cost_model)
    index = {n.name: i for i, n in enumerate(gr.nodes)}
    plan = [{index[x] for x in g.nodes} for g in r.plan.groups]
    fusible = [i for i in range(len(gr.nodes)) if gr.fusible[i]]
    assert costing.plan(plan, fusible) < costing.plan([], fusible)
