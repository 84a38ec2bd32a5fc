"""Tiny models with one `ai.evonnx::Fused` node, for the tests of fused_kernels.c."""

from __future__ import annotations

from collections.abc import Sequence

import onnx
from onnx import TensorProto, helper

# A tensor as (name, ONNX element type, shape); a str dim is symbolic, None leaves the shape out entirely.
Tensor = tuple[str, int, list[int | str] | None]


def fused_model(
    kernel: str | None,
    inputs: list[Tensor],
    outputs: list[Tensor],
    *,
    tail: Sequence[onnx.NodeProto] = (),
    graph_outputs: list[Tensor] | None = None,
) -> onnx.ModelProto:
    """One Fused node reading every graph input, plus optional builtin `tail` nodes after it.

    The Fused outputs always get a `value_info` type (ORT cannot infer a variadic custom op's types); they are
    graph outputs unless `graph_outputs` names others.
    """
    # the hand-written kernels of fused_kernels.c carry the fingerprint "test-<name>"
    attributes = {} if kernel is None else {"kernel": kernel, "fingerprint": f"test-{kernel}"}
    fused = helper.make_node(
        "Fused",
        [t[0] for t in inputs],
        [t[0] for t in outputs],
        name="fused_0",
        domain="ai.evonnx",
        **attributes,
    )
    graph = helper.make_graph(
        [fused, *tail],
        "evonnx_test",
        [_value(t) for t in inputs],
        [_value(t) for t in (outputs if graph_outputs is None else graph_outputs)],
        value_info=[_value(t) for t in outputs],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("ai.evonnx", 1)]
    )
    model.ir_version = 10  # onnx 1.23 writes 14, which onnxruntime 1.31 refuses
    return model


def _value(t: Tensor) -> onnx.ValueInfoProto:
    name, elem_type, shape = t
    return helper.make_tensor_value_info(name, elem_type, shape)


ADD_INDEX_INPUTS: list[Tensor] = [("x", TensorProto.FLOAT, ["N", 4]), ("idx", TensorProto.INT64, ["N"])]
ADD_INDEX_OUTPUTS: list[Tensor] = [("y", TensorProto.FLOAT, ["N", 4]), ("positive", TensorProto.BOOL, ["N"])]
