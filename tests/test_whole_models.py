"""benchmarks/whole_models.py's `ungroupable` (issue 9): which fusable nodes no fused group of two or more can hold,
the part of the Amdahl share the whole-model table reports apart."""

from __future__ import annotations

from onnx import TensorProto, helper

from benchmarks.whole_models import ungroupable


def _c2f_like() -> helper.GraphProto:
    """YOLOv8's C2f block: Split, a bottleneck of convolutions on its second half with a residual Add, and a
    Concat of both halves and the Add."""
    f = TensorProto.FLOAT
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], name="cv1"),
        helper.make_node("Split", ["c", "sizes"], ["y0", "y1"], name="split", axis=1),
        helper.make_node("Conv", ["y1", "w2"], ["b"], name="m0"),
        helper.make_node("Add", ["y1", "b"], ["r"], name="add"),
        helper.make_node("Concat", ["y0", "y1", "r"], ["cat"], name="concat", axis=1),
        helper.make_node("Sigmoid", ["cat"], ["s"], name="sig"),
        helper.make_node("Conv", ["s", "w3"], ["y"], name="cv2"),
    ]
    return helper.make_graph(nodes, "c2f", [helper.make_tensor_value_info("x", f, [1, 4, 8, 8])],
                             [helper.make_tensor_value_info("y", f, None)])


def test_a_node_whose_every_neighbour_comes_back_through_onnxruntime_is_ungroupable() -> None:
    g = _c2f_like()
    # the Split reaches the Add and the Concat also through the bottleneck's Conv: no group can hold it; the Add
    # and the Concat read each other directly and can be one kernel, and so can the Concat and the Sigmoid
    assert ungroupable(g, {"split", "add", "concat", "sig"}) == {"split"}
    # without the Add and the Sigmoid, the Concat's only fusable neighbour is the Split, and the Add's likewise
    assert ungroupable(g, {"split", "concat"}) == {"split", "concat"}
    assert ungroupable(g, {"split", "add"}) == {"split", "add"}


def test_a_plain_chain_has_no_ungroupable_node() -> None:
    g = _c2f_like()
    assert ungroupable(g, {"concat", "sig"}) == set()
    assert ungroupable(g, set()) == set()
