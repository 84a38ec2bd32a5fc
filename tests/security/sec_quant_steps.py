"""The fuzzer's quantization steps, in the QDQ form onnxruntime.quantization writes: a QuantizeLinear ->
DequantizeLinear pair on a float tensor (its quantized values join the pool too, for views between the pair), and
a DequantizeLinear of constant int8/uint8 weights (per tensor or per axis) combined with a pool tensor.
onnxruntime never folds a DequantizeLinear of constants, so that its QDQ fusions find it; evonnx's own plan-time
folding did (session 29: a QDQ YOLOv8n failed the check). Each step returns False when the pool holds nothing it
applies to; `sec_graphs.Builder` mixes them in."""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st
from sec_cases import broadcast

QUANT_STEPS = ("qdq", "dq_weight")
_SCALES = (0.02, 0.1, 1.0, 0.003, 3.0, 1 / 256)


class QuantSteps:
    def _scale_and_zero(self, qtype: str, channels: int | None) -> tuple[str, str]:
        n = channels or 1
        scales = np.array(self.draw(st.lists(st.sampled_from(_SCALES), min_size=n, max_size=n)), np.float32)
        low, high = (0, 255) if qtype == "uint8" else (-128, 127)
        zeros = np.array(self.draw(st.lists(st.integers(low, high), min_size=n, max_size=n)), qtype)
        if channels is None:
            scales, zeros = scales.reshape(()), zeros.reshape(())
        return self.const(scales), self.const(zeros)

    def step_qdq(self) -> bool:
        x = self.pick(lambda t: t.dtype == "float32" and self.small(t), "qdq x")
        if x is None:
            return False
        qtype = self.draw(st.sampled_from(["uint8", "int8"]))
        scale, zero = self._scale_and_zero(qtype, None)
        (q,) = self.node("QuantizeLinear", [x.name, scale, zero])
        self.add(q, qtype, x.shape)
        (d,) = self.node("DequantizeLinear", [q, scale, zero])
        self.add(d, "float32", x.shape)
        return True

    def step_dq_weight(self) -> bool:
        x = self.pick(lambda t: t.dtype == "float32" and 1 <= t.rank <= 4, "dq_weight x")
        if x is None:
            return False
        k = self.draw(st.integers(1, x.rank))
        shape = [d if isinstance(d, int) and d <= 8 else 1 for d in x.shape[x.rank - k:]]
        out = broadcast(x.shape, tuple(shape))
        if out is None:
            return False
        qtype = self.draw(st.sampled_from(["int8", "uint8"]))
        low, high = (0, 255) if qtype == "uint8" else (-128, 127)
        n = int(np.prod(shape))
        w = np.array(self.draw(st.lists(st.integers(low, high), min_size=n, max_size=n)), qtype).reshape(shape)
        per_axis = self.opset >= 13 and self.draw(st.booleans())  # per-axis scales came with opset 13
        axis = self.draw(st.integers(-len(shape), len(shape) - 1)) if per_axis else None
        channels = shape[axis] if axis is not None else None
        scale, zero = self._scale_and_zero(qtype, channels)
        attrs = {"axis": axis} if axis is not None else {}
        (wd,) = self.node("DequantizeLinear", [self.const(w), scale, zero], **attrs)
        op = self.draw(st.sampled_from(["Mul", "Add", "Sub"]))
        ins = [x.name, wd] if self.draw(st.booleans()) else [wd, x.name]
        (y,) = self.node(op, ins)
        self.add(y, "float32", out)
        return True
