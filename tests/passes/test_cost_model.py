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


def test_op_counts_price_what_code_generation_computes() -> None:
    """A reduction inside another's body that does not depend on the outer variable is hoisted before the outer
    loop (schedule.temporaries): it is counted once per element, not once per outer step; what does depend on
    the outer variable is counted per step; a reduction independent of the innermost loop variable is amortised
    over the row."""
    from evonnx import expr as E
    from evonnx.index import var
    from evonnx.passes.cost_model import _op_counts

    i, j = var("i", 8), var("j", 16)  # the output's row and innermost loop variables
    r, k = var("r", 16), var("k", 16)  # reduction variables
    x = E.Load(0, 16 * i + r, "float32")  # a row read along r
    s = E.Reduce("sum", r, E.unary("exp", x), "float32")  # per row: 16 exps, 16 steps
    y = E.Load(0, 16 * i + k, "float32")
    body = E.binary("mul", E.binary("div", E.unary("exp", y), s), E.Load(1, k, "float32"))
    t = E.Reduce("sum", k, body, "float32")  # per row too: 16 exps, 16 divisions and products, 16 steps
    simple, special, steps = _op_counts(E.binary("add", t, E.Load(2, j, "float32")), {}, j.atom())
    # s and t each once per row of 16 elements: (16 + 16) / 16 exps and 32 / 16 steps per element
    assert special == pytest.approx(2.0)
    assert steps == pytest.approx(2.0)
    assert simple == pytest.approx(16 * 2 / 16 + 1)  # div and mul per step of t, per row; the add per element
