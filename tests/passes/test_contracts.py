"""The passes' postconditions (passes/contracts.py, on under EVONNX_DEBUG=1 as in this suite): a plan, kernels or
a rewritten graph that break one are an InternalError naming the pass, not a model that may or may not fail later."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import onnx_graphsurgeon as gs
import pytest

from evonnx.errors import InternalError
from evonnx.model import load_model
from evonnx.passes import contracts
from evonnx.passes.pipeline import PipelineResult, run_pipeline
from evonnx.records import FusionGroup

MODEL = Path(__file__).resolve().parents[2] / "models" / "delta2bbox.onnx"


@pytest.fixture(scope="module")
def result() -> PipelineResult:
    return run_pipeline(load_model(MODEL), planner="greedy")  # the suite runs it with every contract checked


def test_a_real_pipeline_keeps_every_contract(result: PipelineResult) -> None:
    contracts.after_analyze(result.graph, result.analysis)
    contracts.after_plan(result.graph, result.analysis, result.plan)
    contracts.after_lower(result.graph, result.plan, result.specs)
    contracts.after_rewrite(result.optimized, result.specs)
    assert result.specs


def test_a_node_in_two_groups_breaks_the_plan(result: PipelineResult) -> None:
    first = result.plan.groups[0]
    twice = dataclasses.replace(result.plan, groups=(*result.plan.groups, FusionGroup("evo_x", first.nodes[:1],
                                                                                     first.ops[:1])))
    with pytest.raises(InternalError, match=r"after plan: node .* is in two groups"):
        contracts.after_plan(result.graph, result.analysis, twice)


def test_a_kernel_writing_what_its_nodes_do_not_compute_breaks_lowering(result: PipelineResult) -> None:
    spec = result.specs[0]
    stray = dataclasses.replace(spec.outputs[0], name=spec.inputs[0].name)
    bad = dataclasses.replace(spec, outputs=(stray, *spec.outputs[1:]))
    with pytest.raises(InternalError, match="after lower_groups: kernel .* which its nodes do not compute"):
        contracts.after_lower(result.graph, result.plan, [bad, *result.specs[1:]])


def test_a_fused_node_of_no_kernel_breaks_the_rewrite(result: PipelineResult) -> None:
    with pytest.raises(InternalError, match="after rewrite: Fused nodes .* are not one each of kernels"):
        contracts.after_rewrite(result.optimized, result.specs[1:])


def test_a_node_reading_an_uncomputed_tensor_breaks_the_rewrite(result: PipelineResult) -> None:
    g = result.optimized.copy()
    g.nodes.insert(0, gs.Node("Neg", "early", inputs=[g.nodes[-1].outputs[0]], outputs=[gs.Variable("neg_out")]))
    with pytest.raises(InternalError, match="after rewrite: node 'early' .* before anything computes it"):
        contracts.after_rewrite(g, result.specs)


def test_an_integer_division_by_a_known_zero_is_not_folded() -> None:
    """onnxruntime fails the Run of an integer Div by 0 wherever an element is computed, so the division stays for
    the kernel's run-time check (evo_nz): folded to 0, a Div of known zeros over a symbolic shape returned zeros
    where onnxruntime failed (fuzz case 185). A nonzero divisor folds, truncating as C does."""
    from evonnx.expr import Const, Op, binary

    for dtype in ("int32", "int64", "uint8"):
        assert isinstance(binary("div", Const(0, dtype), Const(0, dtype)), Op)
        assert isinstance(binary("div", Const(7, dtype), Const(0, dtype)), Op)
    assert binary("div", Const(-7, "int32"), Const(2, "int32")) == Const(-3, "int32")
