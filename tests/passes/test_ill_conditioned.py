"""A float Mod of an inexact value stays with onnxruntime: its remainder is exact, but the operand's last bit against
onnxruntime's can move it by up to the divisor (fmod(exp(x), x) at x = 25; fuzz seed 8, case000172)."""

from __future__ import annotations

import pytest
from onnx import TensorProto, helper

from evonnx.passes.pipeline import run_pipeline


def _model(first: str) -> object:
    nodes = [helper.make_node(first, ["x"], ["t"], name="a"),
             helper.make_node("Mod", ["t", "x"], ["m"], fmod=1, name="b"),
             helper.make_node("Sub", ["m", "x"], ["y"], name="c")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


@pytest.mark.parametrize(("first", "fused"), [("Exp", False), ("Neg", True)])
def test_a_float_mod_of_an_inexact_value_is_left_to_onnxruntime(first: str, fused: bool) -> None:
    result = run_pipeline(_model(first), planner="greedy")
    mods = [s for s in result.specs if "Mod" in s.source_ops]
    assert bool(mods) is fused
    if not fused:
        assert any(r.op == "Mod" and "float Mod of an inexact value" in r.reason for r in result.plan.rejected)
