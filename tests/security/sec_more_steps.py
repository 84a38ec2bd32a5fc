"""The fuzzer's steps for the ops evonnx lowers that `sec_graphs` and `sec_steps` did not draw: Split (split input,
equal and uneven `num_outputs`), Tile (repeats of 0), Flatten (negative axis), ScatterElements (every reduction,
duplicate and out-of-range indices), variadic Sum/Mean/Max/Min, And/Or/Xor, ReduceL1/L2/LogSum/LogSumExp/Prod/
SumSquare (axes as attribute or input, noop_with_empty_axes), LogSoftmax, ConstantOfShape and Size. Each step
returns False when the pool holds nothing it applies to; `sec_graphs.Builder` mixes them in."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import strategies as st
from onnx import numpy_helper
from sec_cases import FLOAT_VALUES, I64_MAX, I64_MIN, Dim, Tensor, _static

# the reductions `sec_steps.step_reduce` does not draw, and the element types onnxruntime's CPU EP runs each in
_MORE_REDUCTIONS = {"ReduceL1": ("float32", "int32", "int64"), "ReduceL2": ("float32",),
                    "ReduceLogSum": ("float32",), "ReduceLogSumExp": ("float32",),
                    "ReduceProd": ("float32", "int32", "int64"), "ReduceSumSquare": ("float32", "int32", "int64")}


class MoreSteps:
    def _dims_product(self, dims: tuple[Dim, ...]) -> Dim:
        return math.prod(dims) if _static(dims) else self.fresh_dim()  # type: ignore[arg-type]

    def step_split(self) -> bool:
        x = self.pick(lambda t: t.rank >= 1 and self.small(t), "split x")
        if x is None:
            return False
        axis = self.draw(st.integers(0, x.rank - 1))
        d = x.shape[axis]
        written = axis - x.rank if self.draw(st.booleans()) else axis
        form = self.draw(st.sampled_from(["sizes", "equal"]))
        if form == "sizes":  # a split input; on a symbol, sizes that fit some run-time size and not others
            if isinstance(d, int):
                cuts = sorted(self.draw(st.lists(st.integers(0, d), min_size=1, max_size=3)))
                sizes = [b - a for a, b in zip([0, *cuts], [*cuts, d])]
            else:
                sizes = self.draw(st.lists(st.sampled_from([0, 1, 2, 3]), min_size=1, max_size=3))
            (*outs,) = self.node("Split", [x.name, self.i64(sizes)], n_out=len(sizes), axis=written)
            dims: list[Dim] = list(sizes)
        else:
            n = self.draw(st.sampled_from([k for k in (1, 2, 3) if self.opset >= 18 or not isinstance(d, int)
                                           or d % k == 0]))
            attrs: dict[str, object] = {"axis": written}
            if self.opset >= 18:  # num_outputs: the last part is smaller when n does not divide the dim
                attrs["num_outputs"] = n
            (*outs,) = self.node("Split", [x.name], n_out=n, **attrs)
            if isinstance(d, int):  # onnxruntime 1.31 fails the Run where a part would be empty (n > d, or 3 of 4)
                part = -(-d // n) if self.opset >= 18 else d // n
                dims = [part] * (n - 1) + [d - part * (n - 1)]
                if min(dims) < 0:
                    dims = [self.fresh_dim() for _ in range(n)]
            else:
                dims = [self.fresh_dim() for _ in range(n)]
        for o, k in zip(outs, dims):
            self.add(o, x.dtype, x.shape[:axis] + (k,) + x.shape[axis + 1:])
        return True

    def step_tile(self) -> bool:
        x = self.pick(lambda t: t.rank >= 1 and self.small(t), "tile x")
        if x is None:
            return False
        reps = self.draw(st.lists(st.sampled_from([1, 1, 2, 3, 0]), min_size=x.rank, max_size=x.rank))
        static = _static(x.shape)
        if static and math.prod(x.shape) * math.prod(reps) > 2**16:  # type: ignore[arg-type]
            reps = [1] * x.rank
        (y,) = self.node("Tile", [x.name, self.i64(reps)])
        shape = tuple(d * r if isinstance(d, int) else d if r == 1 else 0 if r == 0 else self.fresh_dim()
                      for d, r in zip(x.shape, reps))
        self.add(y, x.dtype, shape)
        return True

    def step_flatten(self) -> bool:
        x = self.pick(lambda t: t.rank >= 1 and self.small(t), "flatten x")
        if x is None:
            return False
        axis = self.draw(st.integers(0, x.rank))
        written = axis - x.rank if self.draw(st.booleans()) else axis
        (y,) = self.node("Flatten", [x.name], axis=written)
        self.add(y, x.dtype, (self._dims_product(x.shape[:axis]), self._dims_product(x.shape[axis:])))
        return True

    def step_scatter_elements(self) -> bool:
        x = self.pick(lambda t: t.rank >= 1 and self.numeric(t) and self.small(t), "scatter_elements x")
        if x is None:
            return False
        axis = self.draw(st.integers(0, x.rank - 1))
        shape = [self.draw(st.integers(0, min(d, 3))) if isinstance(d, int) else 1 for d in x.shape]
        d = x.shape[axis]
        n = math.prod(shape)
        if isinstance(d, int):  # in range both ways, and now and then just out of it (onnxruntime fails the Run)
            choices = list(range(-d, d)) or [0]
            if self.draw(st.integers(0, 5)) == 0:
                choices += [d, -d - 1]
        else:
            choices = [0, -1, 1]
        idx = np.array(self.draw(st.lists(st.sampled_from(choices), min_size=n, max_size=n)), np.int64)
        attrs: dict[str, object] = {"axis": axis - x.rank if self.draw(st.booleans()) else axis}
        if self.opset >= 16:
            attrs["reduction"] = self.draw(st.sampled_from(["none", "add", "mul"] + (["max", "min"]
                                                                                      if self.opset >= 18 else [])))
        updates = self.const(self.values(x.dtype, shape))
        (y,) = self.node("ScatterElements", [x.name, self.const(idx.reshape(shape)), updates], **attrs)
        self.add(y, x.dtype, x.shape)
        return True

    def step_variadic(self) -> bool:
        x = self.pick(lambda t: self.numeric(t) and self.small(t), "variadic x")
        if x is None:
            return False
        ops = ["Max", "Min"] + (["Sum", "Mean", "Sum"] if x.dtype == "float32" else [])
        op = self.draw(st.sampled_from(ops))
        names, shape = [x.name], x.shape
        for _ in range(self.draw(st.integers(0, 2))):
            other, out = self.partner(Tensor(x.name, x.dtype, shape))
            names.append(other)
            shape = out
        (y,) = self.node(op, self.draw(st.permutations(names)))
        self.add(y, x.dtype, shape)
        return True

    def step_logic(self) -> bool:
        x = self.pick(lambda t: t.dtype == "bool" and self.small(t), "logic x")
        if x is None:
            base = self.pick(lambda t: self.numeric(t) and self.small(t), "logic base")
            if base is None:
                return False
            other, shape = self.partner(base)
            (c,) = self.node(self.draw(st.sampled_from(["LessOrEqual", "Less", "Equal"])), [base.name, other])
            x = self.add(c, "bool", shape)
        other, shape = self.partner(x)
        op = self.draw(st.sampled_from(["And", "Or", "Xor"]))
        (y,) = self.node(op, [x.name, other] if self.draw(st.booleans()) else [other, x.name])
        self.add(y, "bool", shape)
        return True

    def step_reduce_more(self) -> bool:
        op = self.draw(st.sampled_from(sorted(_MORE_REDUCTIONS)))
        x = self.pick(lambda t: t.rank >= 1 and t.dtype in _MORE_REDUCTIONS[op] and self.small(t), "reduce_more x")
        if x is None:
            return False
        axes = self.draw(st.lists(st.integers(0, x.rank - 1), min_size=0, max_size=x.rank, unique=True))
        keep = self.draw(st.sampled_from([0, 1]))
        neg = self.draw(st.booleans())
        axes_v = [a - x.rank if neg else a for a in axes]
        noop = self.opset >= 18 and not axes and self.draw(st.booleans())
        if self.opset >= 18:
            ins = [x.name] + ([self.i64(axes_v)] if axes else [])
            (y,) = self.node(op, ins, keepdims=keep, **({"noop_with_empty_axes": 1} if noop else {}))
        else:
            (y,) = self.node(op, [x.name], keepdims=keep, **({"axes": axes_v} if axes else {}))
        if noop:  # no axes and noop_with_empty_axes: the input itself
            self.add(y, x.dtype, x.shape)
            return True
        red = set(axes) if axes else set(range(x.rank))
        shape = [1 if i in red else d for i, d in enumerate(x.shape)] if keep else [
            d for i, d in enumerate(x.shape) if i not in red]
        self.add(y, x.dtype, shape)
        return True

    def step_log_softmax(self) -> bool:
        x = self.pick(lambda t: t.rank >= 1 and t.dtype == "float32" and self.small(t), "log_softmax x")
        if x is None:
            return False
        axis = self.draw(st.integers(0, x.rank - 1))
        (y,) = self.node("LogSoftmax", [x.name], axis=axis - x.rank if self.draw(st.booleans()) else axis)
        self.add(y, "float32", x.shape)
        return True

    def step_constant_of_shape(self) -> bool:
        x = self.pick(lambda t: self.small(t), "constant_of_shape x")
        assert x is not None
        dtype = self.draw(st.sampled_from(["float32", "int64", "int32"]))
        if dtype == "float32":
            v = np.array([self.draw(st.sampled_from(FLOAT_VALUES))], np.float32)
        else:
            v = np.array([self.draw(st.sampled_from([0, 1, -7, I64_MAX, I64_MIN] if dtype == "int64"
                                                    else [0, 1, -7, 2**31 - 1]))], dtype)
        (s,) = self.node("Shape", [x.name])
        attrs = {"value": numpy_helper.from_array(v, self.names("v"))} if self.draw(st.integers(0, 4)) else {}
        (y,) = self.node("ConstantOfShape", [s], **attrs)
        out = self.add(y, dtype if attrs else "float32", x.shape)
        if out.dtype == x.dtype and x.dtype != "bool" and self.draw(st.booleans()):
            (z,) = self.node(self.draw(st.sampled_from(["Add", "Mul", "Max"])), [x.name, y])
            self.add(z, x.dtype, x.shape)
        return True

    def step_size(self) -> bool:
        x = self.pick(lambda t: t.rank >= 1, "size x")
        if x is None:
            return False
        (n,) = self.node("Size", [x.name])
        t = self.add(n, "int64", ())
        y = self.pick(lambda u: u.dtype == "int64" and u is not t and self.small(u), "size partner")
        if y is not None:
            (z,) = self.node(self.draw(st.sampled_from(["Add", "Mul", "Sub"])), [y.name, n])
            self.add(z, "int64", y.shape)
        return True


MORE_STEPS = ("split", "split", "tile", "flatten", "scatter_elements", "variadic", "logic", "reduce_more",
              "log_softmax", "constant_of_shape", "size")
MORE_INEXACT = {"ReduceL1", "ReduceL2", "ReduceLogSum", "ReduceLogSumExp", "ReduceProd", "ReduceSumSquare",
                "LogSoftmax"}
