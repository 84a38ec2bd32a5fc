"""The view record: a strided window (shape, strides, offset) onto a storage, never a copy.

Views are built only through `View.dense` and the op methods, each returning a new `View`, or None when strides
cannot express the result (a reshape of a non-contiguous view); callers then fall back to a general index map
(an index expression with floor-div/mod terms). Sizes may be symbolic (`Poly`). ONNX semantics (negative
indices, clamping) are resolved by the caller: these methods take normalised, in-range arguments.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from evonnx.index import Poly, PolyLike, product


def _dims(xs: Sequence[PolyLike]) -> tuple[Poly, ...]:
    return tuple(Poly.of(x) for x in xs)


@dataclass(frozen=True, slots=True)
class View:
    shape: tuple[Poly, ...]
    strides: tuple[Poly, ...]  # in elements; 0 = broadcast, < 0 = reversed
    offset: Poly = Poly()

    @staticmethod
    def dense(shape: Sequence[PolyLike]) -> View:
        """Row-major contiguous view of a storage with this shape."""
        dims = _dims(shape)
        strides: list[Poly] = []
        acc = Poly.of(1)
        for d in reversed(dims):
            strides.append(acc if d.const != 1 else Poly())
            acc = acc * d
        return View(dims, tuple(reversed(strides)), Poly())

    @property
    def rank(self) -> int:
        return len(self.shape)

    def numel(self) -> Poly:
        return product(self.shape)

    def is_contiguous(self) -> bool:
        return self.offset.const == 0 and self == View.dense(self.shape)

    def index(self, idx: Sequence[PolyLike]) -> Poly:
        """Storage position of the element at multi-index `idx`."""
        if len(idx) != self.rank:
            raise ValueError(f"index of rank {len(idx)} into a view of rank {self.rank}")
        out = self.offset
        for i, s in zip(idx, self.strides):
            out = out + Poly.of(i) * s
        return out

    # -- ops -----------------------------------------------------------------------------------------------
    def slice(self, axis: int, start: PolyLike, length: PolyLike, step: int) -> View:
        """Elements `start, start+step, ...` (`length` of them) along `axis`; `start` must be in range."""
        shape = list(self.shape)
        strides = list(self.strides)
        offset = self.offset + Poly.of(start) * strides[axis]
        shape[axis] = Poly.of(length)
        strides[axis] = strides[axis] * step
        return View(tuple(shape), tuple(strides), offset)

    def select(self, axis: int, i: PolyLike) -> View:
        """Fix `axis` at index `i` and drop it (a scalar Gather)."""
        offset = self.offset + Poly.of(i) * self.strides[axis]
        return View(self.shape[:axis] + self.shape[axis + 1:], self.strides[:axis] + self.strides[axis + 1:],
                    offset)

    def transpose(self, perm: Sequence[int]) -> View:
        if sorted(perm) != list(range(self.rank)):
            raise ValueError(f"perm {list(perm)} is not a permutation of rank {self.rank}")
        return View(tuple(self.shape[p] for p in perm), tuple(self.strides[p] for p in perm), self.offset)

    def expand(self, shape: Sequence[PolyLike]) -> View:
        """Broadcast to `shape` (numpy rules, right-aligned); size-1 axes get stride 0."""
        dims = _dims(shape)
        lead = len(dims) - self.rank
        if lead < 0:
            raise ValueError("expand cannot lower the rank")
        strides: list[Poly] = [Poly()] * lead
        for d_old, s, d_new in zip(self.shape, self.strides, dims[lead:]):
            if d_old == d_new:
                strides.append(s)
            elif d_old.const == 1:
                strides.append(Poly())
            else:
                raise ValueError(f"cannot broadcast size {d_old} to {d_new}")
        return View(dims, tuple(strides), self.offset)

    def reshape(self, shape: Sequence[PolyLike]) -> View | None:
        """The same elements in row-major order with a new shape, or None when strides cannot express it."""
        new = _dims(shape)
        if product(new) != product(self.shape):
            raise ValueError(f"reshape of {self.shape_str()} to {tuple(str(d) for d in new)} changes the size")
        old = [(d, s) for d, s in zip(self.shape, self.strides) if d.const != 1]
        if not old:
            return View(new, tuple(Poly() for _ in new), self.offset)
        new_strides: list[Poly] = [Poly()] * len(new)
        # Walk both shapes from the innermost axis, matching chunks of equal size whose old axes are
        # mutually contiguous (the algorithm of PyTorch's computeStride, with symbolic sizes).
        view_d = len(new) - 1
        chunk_base = old[-1][1]
        tensor_numel = Poly.of(1)
        view_numel = Poly.of(1)
        for t in range(len(old) - 1, -1, -1):
            tensor_numel = tensor_numel * old[t][0]
            if t == 0 or old[t - 1][1] != tensor_numel * chunk_base:
                while view_d >= 0 and (view_numel != tensor_numel or new[view_d].const == 1):
                    new_strides[view_d] = view_numel * chunk_base if new[view_d].const != 1 else Poly()
                    view_numel = view_numel * new[view_d]
                    view_d -= 1
                if view_numel != tensor_numel:
                    return None
                if t > 0:
                    chunk_base = old[t - 1][1]
                    tensor_numel = Poly.of(1)
                    view_numel = Poly.of(1)
        while view_d >= 0 and new[view_d].const == 1:
            view_d -= 1
        if view_d != -1:
            return None
        return View(new, tuple(new_strides), self.offset)

    # -- printing ------------------------------------------------------------------------------------------
    def shape_str(self) -> str:
        return "(" + ",".join(str(d) for d in self.shape) + ")"

    def __str__(self) -> str:
        strides = ",".join(str(s) for s in self.strides)
        return f"View({self.shape_str()}:({strides})+{self.offset})"
