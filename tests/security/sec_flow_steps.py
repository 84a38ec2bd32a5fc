"""The fuzzer's control-flow steps: If and Loop nodes whose bodies read tensors of the outer graph. Those captured
tensors are often the middle of a chain that evonnx fuses, so a plan that drops one (it appears in no node's
inputs of the main graph, only as a name inside a body) breaks the model; the If's condition may depend on a run-time
size, so that different run-time sizes take different branches. Their outputs join the pool, and later steps fuse
over them. Each step returns False when the pool holds nothing it applies to; `sec_graphs.Builder` mixes them in."""

from __future__ import annotations

import numpy as np
import onnx
from hypothesis import strategies as st
from onnx import TensorProto, helper
from sec_cases import DTYPES, Tensor

FLOW_STEPS = ("if", "loop")


def _exact_unary(dtype: str) -> tuple[str, ...]:
    """Ops a branch applies to a captured tensor, exact and run by onnxruntime's CPU EP in `dtype`."""
    if dtype == "bool":
        return ("Not", "Identity")
    if dtype in ("int8", "uint8"):
        return ("Identity", "Abs")
    return ("Neg", "Abs", "Identity", "Add")


def read_names(nodes: list[onnx.NodeProto]) -> set[str]:
    """The tensor names `nodes` read, inside their bodies too (a body's captures are inputs of the node)."""
    names: set[str] = set()
    for n in nodes:
        names.update(n.input)
        for a in n.attribute:
            for g in [a.g] if a.type == onnx.AttributeProto.GRAPH else a.graphs:
                names |= read_names(list(g.node))
    return names


class FlowSteps:
    def _body_node(self, op: str, inputs: list[str], outputs: list[str]) -> onnx.NodeProto:
        return helper.make_node(op, inputs, outputs, name=self.names("n", allow_nul=True))

    def _value_info(self, name: str, dtype: str, rank: int | None) -> onnx.ValueInfoProto:
        return helper.make_tensor_value_info(name, DTYPES[dtype], None if rank is None else [None] * rank)

    def _branch(self, x: Tensor) -> onnx.GraphProto:
        """A branch of one output: an exact unary op of the captured `x` (Add: x + x)."""
        op = self.draw(st.sampled_from(_exact_unary(x.dtype)))
        y = self.names("t")
        node = self._body_node(op, [x.name, x.name] if op == "Add" else [x.name], [y])
        return helper.make_graph([node], self.names("graph"), [], [self._value_info(y, x.dtype, x.rank)])

    def _condition(self, x: Tensor) -> str:
        """A bool scalar: a constant, or whether x's element count (a run-time size where x has a symbol) is above
        a small bound."""
        if self.draw(st.booleans()):
            return self.const(np.array(self.draw(st.booleans())))
        (size,) = self.node("Size", [x.name])
        (cond,) = self.node("Greater", [size, self.const(np.array(self.draw(st.integers(0, 8)), np.int64))])
        return cond

    def step_if(self) -> bool:
        x = self.pick(lambda t: True, "if then-capture")
        if x is None:
            return False
        # the else branch reads another tensor of the same type and shape where there is one: two captures
        twins = [t for t in self.pool if t.dtype == x.dtype and t.shape == x.shape and t.name != x.name]
        other = self.draw(st.sampled_from(twins)) if twins and self.draw(st.booleans()) else x
        cond = self._condition(x)
        (y,) = self.node("If", [cond], then_branch=self._branch(x), else_branch=self._branch(other))
        self.add(y, x.dtype, x.shape)
        return True

    def step_loop(self) -> bool:
        x = self.pick(lambda t: self.numeric(t) and self.small(t), "loop capture")
        if x is None:
            return False
        starts = [t for t in self.pool if t.dtype == x.dtype and t.shape == x.shape]
        v0 = self.draw(st.sampled_from(starts))
        trips = self.draw(st.integers(0, 3))
        scan = trips > 0 and self.draw(st.booleans())  # a scan output: x stacked once per iteration
        it, c_in, acc = self.names("t"), self.names("t"), self.names("t")
        c_out, acc_out = self.names("t"), self.names("t")
        op = self.draw(st.sampled_from(["Add", "Max", "Sub"]))
        nodes = [self._body_node("Identity", [c_in], [c_out]), self._body_node(op, [acc, x.name], [acc_out])]
        outputs = [self._value_info(c_out, "bool", 0), self._value_info(acc_out, x.dtype, x.rank)]
        if scan:
            s = self.names("t")
            nodes.append(self._body_node("Identity", [x.name], [s]))
            outputs.append(self._value_info(s, x.dtype, x.rank))
        body = helper.make_graph(nodes, self.names("graph"),
                                 [helper.make_tensor_value_info(it, TensorProto.INT64, []),
                                  helper.make_tensor_value_info(c_in, TensorProto.BOOL, []),
                                  self._value_info(acc, x.dtype, x.rank)], outputs)
        cond = self.const(np.array(True)) if self.draw(st.booleans()) else ""
        outs = self.node("Loop", [self.const(np.array(trips, np.int64)), cond, v0.name], n_out=1 + scan,
                         body=body)
        self.add(outs[0], x.dtype, x.shape)
        if scan:
            self.add(outs[1], x.dtype, (trips, *x.shape))
        return True
