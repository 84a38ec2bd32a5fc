"""The fuzzer's view, write, reduction and generator steps (Slice, Gather, Transpose, Reshape, Unsqueeze/Squeeze,
Concat, Expand, ScatterND, ReduceSum/Max, Range, Shape): `sec_graphs.Builder` draws a graph with them. Each step
returns False when the pool holds nothing it applies to."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import strategies as st
from sec_cases import (
    FLOAT_VALUES,
    I32_MAX,
    I32_MIN,
    I64_MAX,
    I64_MIN,
    SLICE_ENDS,
    SLICE_STARTS,
    SLICE_STEPS,
    Dim,
    Tensor,
    _numel,
    _static,
    broadcast,
)


class ViewSteps:
    def step_slice(self) -> bool:
        x = self.pick(lambda t: t.rank >= 1, "slice x")
        if x is None:
            return False
        axes = self.draw(st.lists(st.integers(0, x.rank - 1), min_size=1, max_size=x.rank, unique=True))
        starts, ends, steps = [], [], []
        shape = list(x.shape)
        for a in axes:
            s = self.draw(st.sampled_from(SLICE_STARTS))
            e = self.draw(st.sampled_from(SLICE_ENDS))
            k = self.draw(st.sampled_from(SLICE_STEPS))
            starts.append(s)
            ends.append(e)
            steps.append(k)
            d = x.shape[a]
            if isinstance(d, int):
                shape[a] = len(range(d)[slice(s, e, k)])
            elif (k == 1 and s in (0, I64_MIN, -I64_MAX) and e == I64_MAX) or (
                    k == -1 and s in (-1, I64_MAX) and e in (I64_MIN, -I64_MAX)):
                shape[a] = d
            else:
                shape[a] = self.fresh_dim()
        neg = self.draw(st.booleans())
        axes_v = [a - x.rank if neg else a for a in axes]
        ins = [x.name, self.i64(starts), self.i64(ends)]
        if axes != list(range(len(axes))) or any(k != 1 for k in steps) or self.draw(st.booleans()):
            ins.append(self.i64(axes_v))
            if any(k != 1 for k in steps) or self.draw(st.booleans()):
                ins.append(self.i64(steps))
        (y,) = self.node("Slice", ins)
        self.add(y, x.dtype, shape)
        return True

    def step_gather(self) -> bool:
        x = self.pick(lambda t: t.rank >= 1, "gather x")
        if x is None:
            return False
        axis = self.draw(st.integers(0, x.rank - 1))
        d = x.shape[axis]
        if isinstance(d, int) and d > 0 and self.draw(st.integers(0, 5)) > 0:
            idx_values = st.integers(-d, d - 1)
        else:
            idx_values = st.one_of(st.sampled_from([0, 1, -1, 2, -2, 3, 7, 0, 1, -1]),
                                   st.sampled_from([I64_MAX, I64_MIN]))
            if self.draw(st.integers(0, 7)):
                idx_values = st.sampled_from([0, 1, -1, 2, -2, 3, 7])
        form = self.draw(st.sampled_from(["scalar", "1d", "2d"]))
        ishape: tuple[int, ...] = {"scalar": (), "1d": (self.draw(st.integers(1, 4)),),
                                   "2d": (2, 2)}[form]
        vals = self.draw(st.lists(idx_values, min_size=math.prod(ishape), max_size=math.prod(ishape)))
        dtype = self.draw(st.sampled_from(["int64", "int32"]))
        if dtype == "int32":
            vals = [min(max(v, I32_MIN), I32_MAX) for v in vals]
        idx = self.const(np.array(vals, dtype=dtype).reshape(ishape))
        neg = self.draw(st.booleans())
        (y,) = self.node("Gather", [x.name, idx], axis=axis - x.rank if neg else axis)
        self.add(y, x.dtype, x.shape[:axis] + ishape + x.shape[axis + 1:])
        return True

    def step_transpose(self) -> bool:
        x = self.pick(lambda t: t.rank >= 2, "transpose x")
        if x is None:
            return False
        perm = self.draw(st.permutations(list(range(x.rank))))
        if self.draw(st.booleans()):
            (y,) = self.node("Transpose", [x.name], perm=perm)
        else:
            perm = list(reversed(range(x.rank)))
            (y,) = self.node("Transpose", [x.name])
        self.add(y, x.dtype, tuple(x.shape[p] for p in perm))
        return True

    def step_reshape(self) -> bool:
        x = self.pick(lambda t: True, "reshape x")
        assert x is not None
        forms = ["flatten", "keep0", "unit"]
        if x.rank >= 2:
            forms.append("merge")
        if x.rank >= 1 and isinstance(x.shape[-1], int) and x.shape[-1] % 2 == 0 and x.shape[-1] > 0:
            forms.append("split")
        if _static(x.shape):
            forms.append("static")
        form = self.draw(st.sampled_from(forms))
        allowzero = 0
        n = _numel(x.shape)
        if n == 0 or 0 in x.shape:  # -1 next to a product of 0 is invalid at session creation: copy dims
            (y0,) = self.node("Reshape", [x.name, self.i64([0] * x.rank)])
            self.add(y0, x.dtype, x.shape)
            return True
        if form == "flatten":
            target, shape = [-1], [n if n is not None else self.fresh_dim()]
        elif form == "keep0":
            target = [0] * x.rank + [-1]
            shape = list(x.shape) + [1 if n is None or n else self.fresh_dim()]
            if n == 0:  # -1 next to a 0 copied from an empty dim: onnxruntime decides
                shape = list(x.shape) + [self.fresh_dim()]
        elif form == "unit":
            target = [1, -1] if self.draw(st.booleans()) else [-1, 1]
            shape = [1, n if n is not None else self.fresh_dim()] if target[0] == 1 else [
                n if n is not None else self.fresh_dim(), 1]
        elif form == "merge":
            target = [0] * (x.rank - 2) + [-1]
            last = x.shape[-2:]
            shape = list(x.shape[:-2]) + [_numel(last) if _static(last) else self.fresh_dim()]
        elif form == "split":
            d = x.shape[-1]
            assert isinstance(d, int)
            target = [0] * (x.rank - 1) + [2, -1]
            shape = list(x.shape[:-1]) + [2, d // 2]
        else:
            assert n is not None
            k = self.draw(st.sampled_from([f for f in range(1, max(n, 1) + 1) if n % f == 0] or [1]))
            target = [k, -1] if n else [k, 0]
            if n == 0 and self.draw(st.booleans()):
                allowzero = 1
            shape = [k, n // k] if n else [k, 0 if allowzero else self.fresh_dim()]
        if self.opset < 14:
            allowzero = 0
            if form == "static" and n == 0:
                shape = [k, self.fresh_dim()]
        attrs = {"allowzero": allowzero} if self.opset >= 14 and (
            allowzero or self.draw(st.booleans())) else {}
        if not allowzero and attrs and 0 in target and self.draw(st.booleans()):
            attrs = {"allowzero": 1}
            shape = [0 if t == 0 else self.fresh_dim() for t in target]
        (y,) = self.node("Reshape", [x.name, self.i64(target)], **attrs)
        self.add(y, x.dtype, shape)
        return True

    def step_unsqueeze_squeeze(self) -> bool:
        x = self.pick(self.small, "squeeze x")
        assert x is not None
        ones = [i for i, d in enumerate(x.shape) if d == 1]
        symbolic = [i for i, d in enumerate(x.shape) if isinstance(d, str)]
        if (ones or symbolic) and self.draw(st.booleans()):
            pool = ones if ones and self.draw(st.integers(0, 4)) else ones + symbolic
            axes = self.draw(st.lists(st.sampled_from(pool), min_size=1, max_size=len(pool), unique=True))
            shape = tuple(d for i, d in enumerate(x.shape) if i not in axes)
            neg = self.draw(st.booleans())
            (y,) = self.node("Squeeze", [x.name, self.i64([a - x.rank if neg else a for a in axes])])
            self.add(y, x.dtype, shape)
            return True
        k = self.draw(st.integers(1, 2))
        r = x.rank + k
        axes = self.draw(st.lists(st.integers(0, r - 1), min_size=k, max_size=k, unique=True))
        shape_l: list[Dim] = list(x.shape)
        for a in sorted(axes):
            shape_l.insert(a, 1)
        neg = self.draw(st.booleans())
        (y,) = self.node("Unsqueeze", [x.name, self.i64([a - r if neg else a for a in axes])])
        self.add(y, x.dtype, shape_l)
        return True

    def step_concat(self) -> bool:
        x = self.pick(lambda t: t.rank >= 1 and self.small(t), "concat x")
        if x is None:
            return False
        axis = self.draw(st.integers(0, x.rank - 1))

        def fits(t: Tensor) -> bool:
            return t.dtype == x.dtype and t.rank == x.rank and all(
                a == b for i, (a, b) in enumerate(zip(t.shape, x.shape)) if i != axis)

        parts = [x]
        for _ in range(self.draw(st.integers(1, 2))):
            other = self.pick(fits, "concat other")
            rest_static = all(isinstance(d, int) for i, d in enumerate(x.shape) if i != axis)
            if rest_static and self.draw(st.booleans()):
                k = self.draw(st.sampled_from([0, 1, 2]))
                cshape = [k if i == axis else d for i, d in enumerate(x.shape)]
                if math.prod(cshape) <= 64:
                    name = self.const(self.values(x.dtype, cshape))
                    parts.append(Tensor(name, x.dtype, tuple(cshape)))
                    continue
            if other is not None:
                parts.append(other)
        if len(parts) == 1:
            parts.append(x)
        dims = [p.shape[axis] for p in parts]
        out_d: Dim = sum(dims) if all(isinstance(d, int) for d in dims) else self.fresh_dim()  # type: ignore[misc]
        order = self.draw(st.permutations(parts))
        neg = self.draw(st.booleans())
        (y,) = self.node("Concat", [p.name for p in order], axis=axis - x.rank if neg else axis)
        self.add(y, x.dtype, x.shape[:axis] + (out_d,) + x.shape[axis + 1:])
        return True

    def step_expand(self) -> bool:
        x = self.pick(self.small, "expand x")
        assert x is not None
        if self.draw(st.booleans()):
            y = self.pick(lambda t: broadcast(x.shape, t.shape) == t.shape and t.rank >= 1, "expand like")
            if y is not None:
                (s,) = self.node("Shape", [y.name])
                (out,) = self.node("Expand", [x.name, s])
                self.add(out, x.dtype, y.shape)
                return True
        target, shape = [], []
        for d in x.shape:
            if d == 1:
                k = self.draw(st.sampled_from([1, 2, 3, 0]))
                target.append(k)
                shape.append(k)
            else:
                target.append(1)
                shape.append(d)
        lead = self.draw(st.lists(st.sampled_from([1, 2]), max_size=1 if x.rank < 4 else 0))
        (y2,) = self.node("Expand", [x.name, self.i64(lead + target)])
        self.add(y2, x.dtype, lead + shape)
        return True

    def step_flat_grid(self) -> bool:
        """A per-cell tensor [A, B] transposed, repeated for k anchors per cell and flattened, as mmdet builds its
        anchors' valid flags: element j reads the cell fdiv(j, k) of the transposed order, a division by the
        run-time A; then added to another tensor flattened, either of which may be 1 at run time (onnxruntime
        fails the Run where neither is and the sizes differ): the broadcast keeps the divisions in the loop, where
        kernels/carry.py carries them."""
        x = self.pick(lambda t: t.rank == 2 and any(isinstance(d, str) for d in t.shape), "grid x")
        if x is None:
            return False
        (t,) = self.node("Transpose", [x.name], perm=[1, 0])
        (u,) = self.node("Unsqueeze", [t, self.i64([2])])
        (e,) = self.node("Expand", [u, self.i64([1, 1, self.draw(st.sampled_from([3, 2, 4, 1]))])])
        (y,) = self.node("Reshape", [e, self.i64([-1])])
        flat = self.add(y, x.dtype, [self.fresh_dim()])
        other = self.pick(lambda t: t.rank >= 1 and t.dtype == x.dtype and t is not flat and t is not x,
                          "grid partner")
        if other is not None and self.numeric(x):
            (o,) = self.node("Reshape", [other.name, self.i64([-1])])
            (z,) = self.node("Add", [y, o] if self.draw(st.booleans()) else [o, y])
            self.add(z, x.dtype, [self.fresh_dim()])
        return True

    def step_scatternd(self) -> bool:
        x = self.pick(lambda t: t.rank >= 1 and self.numeric(t) and self.small(t), "scatter x")
        if x is None:
            return False
        depth = 2 if x.rank >= 2 and self.draw(st.integers(0, 3)) == 0 else 1
        rows = self.draw(st.sampled_from([[1, 2, 3], [0], [0, 1], [-1], [2, 0, 1], [0, 2, 4], [3, 2, 1], [5], [1, 2],
                                          [-2, -1], [1, 2, 3], [0, 1], [I64_MAX], [I64_MIN]]))
        d0 = x.shape[0]
        if isinstance(d0, int) and self.draw(st.integers(0, 4)):
            rows = [r for r in rows if -d0 <= r < d0] or ([0] if d0 else [])
            if not rows:
                return False
        if depth == 2:
            cols = self.draw(st.sampled_from([[0] * len(rows), list(range(len(rows))), [1] * len(rows)]))
            indices = [[r, c] for r, c in zip(rows, cols)]
        else:
            indices = [[r] for r in rows]
        k = len(rows)
        tail = x.shape[depth:]
        if _static(tail) and math.prod(tail) * k <= 256 and self.draw(st.booleans()):
            updates = self.const(self.values(x.dtype, [k, *tail]))  # type: ignore[list-item]
        else:
            # rows 0..k of x (depth 1) or of x[:, 0] (depth 2), negated: the updates depend on the data
            src = x.name
            if depth == 2:
                (src,) = self.node("Gather", [x.name, self.i64([0])], axis=1)
                (src,) = self.node("Squeeze", [src, self.i64([1])])
            (sl,) = self.node("Slice", [src, self.i64([0]), self.i64([k]), self.i64([0])])
            (updates,) = self.node("Neg", [sl])
        reductions = ["none", "none", "none"] + (["add", "mul"] if self.opset >= 16 else []) + (
            ["max", "min"] if self.opset >= 18 else [])
        reduction = self.draw(st.sampled_from(reductions))
        attrs = {"reduction": reduction} if self.opset >= 16 and (
            reduction != "none" or self.draw(st.booleans())) else {}
        (y,) = self.node("ScatterND", [x.name, self.const(np.array(indices, dtype=np.int64)), updates], **attrs)
        self.add(y, x.dtype, x.shape)
        return True

    def step_reduce(self) -> bool:
        x = self.pick(lambda t: t.rank >= 1 and self.numeric(t) and self.small(t), "reduce x")
        if x is None:
            return False
        op = self.draw(st.sampled_from(["ReduceSum", "ReduceMax", "ReduceMin", "ReduceMean"]))
        axes = self.draw(st.lists(st.integers(0, x.rank - 1), min_size=0, max_size=x.rank, unique=True))
        keep = self.draw(st.sampled_from([0, 1]))
        red = set(axes) if axes else set(range(x.rank))
        shape = [1 if i in red else d for i, d in enumerate(x.shape)] if keep else [
            d for i, d in enumerate(x.shape) if i not in red]
        neg = self.draw(st.booleans())
        axes_v = [a - x.rank if neg else a for a in axes]
        if op == "ReduceSum" or self.opset >= 18:
            ins = [x.name] + ([self.i64(axes_v)] if axes else [])
            (y,) = self.node(op, ins, keepdims=keep)
        elif axes:
            (y,) = self.node(op, [x.name], axes=axes_v, keepdims=keep)
        else:
            (y,) = self.node(op, [x.name], keepdims=keep)
        self.add(y, x.dtype, shape)
        return True

    def step_argreduce(self) -> bool:
        # ArgMax/ArgMin (kernels/share.py: a search for the ReduceMax/ReduceMin it shares): either index rule, an
        # axis written negatively or not (onnxruntime's empty-input quirk), keepdims 0 or 1
        x = self.pick(lambda t: t.rank >= 1 and self.numeric(t) and self.small(t), "argreduce x")
        if x is None:
            return False
        op = self.draw(st.sampled_from(["ArgMax", "ArgMin"]))
        axis = self.draw(st.integers(0, x.rank - 1))
        keep = self.draw(st.sampled_from([0, 1]))
        shape = [1 if i == axis else d for i, d in enumerate(x.shape)] if keep else [
            d for i, d in enumerate(x.shape) if i != axis]
        written = axis - x.rank if self.draw(st.booleans()) else axis
        (y,) = self.node(op, [x.name], axis=written, keepdims=keep,
                         select_last_index=self.draw(st.sampled_from([0, 1])))
        self.add(y, "int64", shape)
        return True

    def step_boxes(self) -> bool:
        # boxes (kernels/boxes.py): the 4 columns of a tensor's last axis, each by another op (an exp, a log, a
        # division by a column), concatenated back on the last axis in a drawn order, as delta2bbox does. Where
        # that axis is not a static 4 or more, the columns may be empty (an axis of 2, or a symbol at 0)
        x = self.pick(lambda t: t.rank >= 1 and t.dtype in ("float32", "int32") and self.small(t), "boxes x")
        if x is None:
            return False
        last = x.shape[-1]
        whole = isinstance(last, int) and last >= 4
        cols: list[tuple[str, Dim]] = []
        for c in range(4):
            (col,) = self.node("Slice", [x.name, self.i64([c]), self.i64([c + 1]), self.i64([-1])])
            cols.append((col, 1 if whole else self.fresh_dim()))
        unary = ["Exp", "Log", "Sqrt", "Neg"] if x.dtype == "float32" else ["Neg", "Abs"]
        outs: list[tuple[str, Dim]] = []
        for col, d in cols:
            op = self.draw(st.sampled_from(unary + ["Div", "Sub", "Add", "Mul", "Div"]))
            if op in unary:
                (y,) = self.node(op, [col])
            else:  # an integer division by a column may meet 0 (onnxruntime fails the run: issue 16)
                (y,) = self.node(op, [col, self.draw(st.sampled_from(cols))[0]])
            outs.append((y, d if whole else self.fresh_dim()))
        order = self.draw(st.permutations(outs))
        (y,) = self.node("Concat", [o for o, _ in order], axis=self.draw(st.sampled_from([-1, x.rank - 1])))
        self.add(y, x.dtype, x.shape[:-1] + ((4 if whole else self.fresh_dim()),))
        return True

    def step_slice_chain(self) -> bool:
        # Slices of Slices along one axis, concatenated (fuzz case 109): each Slice of a symbolic size nests the
        # size before it in min/max, so long chains meet analyze.MAX_SIZE_WEIGHT (the node is left to onnxruntime)
        # and short ones print their sizes through cprint.Hoist
        x = self.pick(lambda t: t.rank >= 1 and self.small(t), "slice chain x")
        if x is None:
            return False
        axis = self.draw(st.integers(0, x.rank - 1))
        cur, parts = x.name, []
        for _ in range(self.draw(st.integers(2, 14))):
            s, e = self.draw(st.sampled_from([(1, -1), (0, -1), (1, I64_MAX), (-3, I64_MAX), (2, -2)]))
            (cur,) = self.node("Slice", [cur, self.i64([s]), self.i64([e]), self.i64([axis - x.rank])])
            if self.draw(st.booleans()):
                parts.append(cur)
        parts = parts or [cur]
        shape = list(x.shape)
        shape[axis] = self.fresh_dim()
        (y,) = self.node("Concat", parts, axis=axis) if len(parts) > 1 else self.node("Identity", parts)
        self.add(y, x.dtype, shape)
        return True

    def step_matmul(self) -> bool:
        # MatMul by a constant matrix [K, N]: the small ones (K 2..32, N 1..4) fuse as an fma chain, the others
        # (K = 1, N = 5, K = 33) stay with onnxruntime; special values on both sides
        x = self.pick(lambda t: t.dtype == "float32" and t.rank >= 1 and isinstance(t.shape[-1], int)
                      and 1 <= t.shape[-1] <= 33 and self.small(t), "matmul x")
        if x is None:
            return False
        k = int(x.shape[-1])
        n = self.draw(st.sampled_from([1, 1, 2, 4, 5]))
        w = np.array(self.draw(st.lists(st.sampled_from(FLOAT_VALUES[:6] + (2.5, -0.25) + FLOAT_VALUES[6:]),
                                        min_size=k * n, max_size=k * n)), np.float32).reshape(k, n)
        (y,) = self.node("MatMul", [x.name, self.const(w)])
        self.add(y, "float32", (*x.shape[:-1], n) if x.rank >= 2 else (n,))
        return True

    def step_softmax(self) -> bool:
        # Softmax over any axis of at most 33 (32 fuse), alone or read by a MatMul along its last axis or by a 1x1
        # Conv along axis 1, by constant weights: the exps' weighted sum divided once by their sum where the weights
        # are bounded (a DFL head, lower_reduce._dot), a Conv's empty spatial axis failing as onnxruntime's does
        x = self.pick(lambda t: t.dtype == "float32" and self.small(t)
                      and any(isinstance(d, int) and 1 <= d <= 33 for d in t.shape), "softmax x")
        if x is None:
            return False
        axis = self.draw(st.sampled_from([a for a, d in enumerate(x.shape) if isinstance(d, int) and 1 <= d <= 33]))
        (s,) = self.node("Softmax", [x.name], axis=axis - x.rank if self.draw(st.booleans()) else axis)
        k, then = int(x.shape[axis]), self.draw(st.sampled_from(["alone", "matmul", "conv"]))
        n = self.draw(st.sampled_from([1, 1, 2, 4, 5]))
        w = np.array(self.draw(st.lists(st.sampled_from(FLOAT_VALUES[:6] + (2.5, -0.25) + FLOAT_VALUES[6:]),
                                        min_size=k * n, max_size=k * n)), np.float32)
        if then == "matmul" and axis == x.rank - 1 and x.rank >= 2:
            (y,) = self.node("MatMul", [s, self.const(w.reshape(k, n))])
            self.add(y, "float32", (*x.shape[:-1], n))
        elif then == "conv" and axis == 1 and x.rank >= 3:
            ins = [s, self.const(w.reshape(n, k, *[1] * (x.rank - 2)))]
            if self.draw(st.booleans()):
                ins.append(self.const(np.array(self.draw(st.lists(st.sampled_from(FLOAT_VALUES), min_size=n,
                                                                  max_size=n)), np.float32)))
            (y,) = self.node("Conv", ins)
            self.add(y, "float32", (x.shape[0], n, *x.shape[2:]))
        else:
            self.add(s, "float32", x.shape)
        return True

    def step_range(self) -> bool:
        x = self.pick(lambda t: t.rank >= 1, "range like")
        if x is not None and self.draw(st.booleans()):
            axis = self.draw(st.integers(0, x.rank - 1))
            (s,) = self.node("Shape", [x.name])
            (n,) = self.node("Gather", [s, self.const(np.array(axis, dtype=np.int64))], axis=0)
            start, delta = self.draw(st.sampled_from([(0, 1), (0, 2), (1, 1), (-3, 1), (0, I64_MAX)]))
            (r,) = self.node("Range", [self.const(np.array(start, np.int64)), n, self.const(np.array(delta, np.int64))])
            self.add(r, "int64", (x.shape[axis] if (start, delta) == (0, 1) else self.fresh_dim(),))
            return True
        dtype = self.draw(st.sampled_from(["int64", "int32", "float32"]))
        length = self.draw(st.integers(0, 6))
        if dtype == "float32":
            start = self.draw(st.sampled_from([0.0, -2.5, 1e7, 0.1]))
            delta = self.draw(st.sampled_from([1.0, 0.5, -1.0, 3.0]))
            limit = start + delta * length
        else:
            hi, lo = (I64_MAX, I64_MIN) if dtype == "int64" else (I32_MAX, I32_MIN)
            start = self.draw(st.sampled_from([0, 1, -5, hi - 6, lo, lo + 3, hi - 1]))
            delta = self.draw(st.sampled_from([1, 2, -1, -3, 7]))
            limit = start + delta * length
            if not lo <= limit <= hi:
                limit = hi if delta > 0 else lo
            length = max(0, -(-(limit - start) // delta))
        npt = np.dtype(dtype)
        (r,) = self.node("Range", [self.const(np.array(start, npt)), self.const(np.array(limit, npt)),
                                   self.const(np.array(delta, npt))])
        self.add(r, dtype, (length,))
        return True

    def step_shape(self) -> bool:
        x = self.pick(lambda t: t.rank >= 1, "shape x")
        if x is None:
            return False
        if self.opset >= 15 and self.draw(st.booleans()):
            start = self.draw(st.integers(-x.rank, x.rank))
            (s,) = self.node("Shape", [x.name], start=start)
            lo = start + x.rank if start < 0 else start
            n = max(0, x.rank - min(max(lo, 0), x.rank))
        else:
            (s,) = self.node("Shape", [x.name])
            n = x.rank
        self.add(s, "int64", (n,))
        return True

    def step_runtime_gather(self) -> bool:
        # Gather, GatherElements or GatherND of indices known only at run time (passes/lower_gathers.py): a tensor
        # of the graph cast to int64, mostly taken modulo a bound (in range where the bound fits the axis, counted
        # from the end when shifted down), else as it is (onnxruntime fails the Run on one out of range)
        x = self.pick(lambda t: t.rank >= 1 and self.small(t), "runtime gather x")
        if x is None:
            return False
        op = self.draw(st.sampled_from(["Gather", "GatherElements", "GatherND"]))
        axis = self.draw(st.integers(0, x.rank - 1))
        if op == "GatherElements":
            t = x  # indices of the data's own shape
        elif op == "GatherND":
            t = self.pick(lambda t: 1 <= t.rank <= 3 and isinstance(t.shape[-1], int) and 1 <= t.shape[-1] <= x.rank,
                          "runtime gathernd indices")
        else:
            t = self.pick(lambda t: t.rank <= 2 and t.dtype != "bool", "runtime gather indices")
        if t is None or t.dtype == "bool":
            return False
        (ind,) = self.node("Cast", [t.name], to=7) if t.dtype != "int64" else (t.name,)
        d = x.shape[axis] if op != "GatherND" else x.shape[0]
        if self.draw(st.integers(0, 4)):
            m = d if isinstance(d, int) and d > 0 else self.draw(st.sampled_from([1, 2, 3]))
            (ind,) = self.node("Mod", [ind, self.const(np.array(m, np.int64))])
            if self.draw(st.booleans()):
                (ind,) = self.node("Sub", [ind, self.const(np.array(m, np.int64))])
        written = axis - x.rank if self.draw(st.booleans()) else axis
        if op == "Gather":
            (y,) = self.node("Gather", [x.name, ind], axis=written)
            self.add(y, x.dtype, x.shape[:axis] + t.shape + x.shape[axis + 1:])
        elif op == "GatherElements":
            (y,) = self.node("GatherElements", [x.name, ind], axis=written)
            self.add(y, x.dtype, x.shape)
        else:
            k = t.shape[-1]
            (y,) = self.node("GatherND", [x.name, ind])
            self.add(y, x.dtype, t.shape[:-1] + x.shape[k:])
        return True
