"""Inputs for the check: synthesized from what each input's consumers accept, or given by the user.

`synthesize` makes one input set at given input shapes. Floats follow a value regime (`REGIMES`: small with
exact zeros, image-scale non-negative, wide of both signs). An integer input gets values its consumers accept,
found by following it through value-preserving nodes (Cast, Identity, Unsqueeze, Squeeze, Reshape, Flatten) to
the first consumer that constrains it:
- an index (Gather, GatherElements, GatherND, ScatterElements, ScatterND): inside the data's axis, unique where
  a scatter would otherwise write one element twice (an undefined order);
- Slice starts/ends (around the axis), axes (distinct, in range), steps (non-zero);
- a shape (Reshape, Expand: the data's own shape; ConstantOfShape: small), Tile repeats, Split sizes (summing to
  the axis), TopK's k, Range's start/limit/delta, Pad's pads, reduction axes;
- an integer divisor (Div, Mod): non-zero and never -1 (onnxruntime traps on the type's minimum over -1).
Other integers get small non-negative values. Dims of the data are ONNX shape inference's at the concrete
input shapes; where it cannot tell, the smallest input dim stands in.

`load_user_inputs` reads `--inputs`: an .npz file, or a folder of .npz files or of ONNX test-data sets
(`input_N.pb` TensorProtos, directly in the folder or in its `test_data_set_*` subfolders).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

from evonnx.errors import UsageError
from evonnx.model import infer_shapes, overridable

# Float value regimes (`_float_values`).
REGIMES = ("small", "image", "wide")


class AmbiguousInputs(Exception):  # noqa: N818 - a condition, not an error
    """No input set at these shapes has one defined result: a scatter must write some element twice (more index
    rows than the data has elements), and the ONNX spec leaves the order, so onnxruntime's result, open."""
# Nodes whose output holds the values of their input in these slots (moved, repeated, selected): a constraint
# found past them holds for that input too (`_use`).
_TRANSPARENT = {"Cast": (0,), "Identity": (0,), "Unsqueeze": (0,), "Squeeze": (0,), "Reshape": (0,),
                "Flatten": (0,), "Transpose": (0,), "Expand": (0,), "Tile": (0,), "Slice": (0,), "Gather": (0,),
                "Where": (1, 2)}


def _float_values(rng: np.random.Generator, shape: Sequence[int], regime: str) -> np.ndarray:
    if regime == "small":  # signs, exp() stays finite, a tenth exact zeros
        arr = rng.standard_normal(shape) * 2.0
        return np.where(rng.random(shape) < 0.1, 0.0, arr)
    if regime == "image":  # boxes and scores at image scale, non-negative, some exact zeros
        arr = rng.random(shape) * 640.0
        return np.where(rng.random(shape) < 0.05, 0.0, arr)
    return rng.standard_normal(shape) * 400.0  # wide, both signs


class _Shapes:
    """Dims of the model's tensors at concrete input shapes (ONNX shape inference), for consumer ranges."""

    def __init__(self, model: onnx.ModelProto, shapes: Mapping[str, Sequence[int]]):
        probe = onnx.ModelProto()
        probe.CopyFrom(model)
        del probe.graph.value_info[:]
        for i in probe.graph.input:
            if i.name in shapes and i.type.HasField("tensor_type"):
                dims = i.type.tensor_type.shape
                dims.ClearField("dim")
                for d in shapes[i.name]:
                    dims.dim.add().dim_value = int(d)
        try:
            probe = infer_shapes(probe)
        except Exception:  # noqa: BLE001 - no inferred dims: the fallback below stands in
            pass
        self.dims: dict[str, list[int | None]] = {}
        for vi in (*probe.graph.input, *probe.graph.value_info, *probe.graph.output):
            if vi.type.HasField("tensor_type") and vi.type.tensor_type.HasField("shape"):
                self.dims[vi.name] = [d.dim_value if d.HasField("dim_value") else None
                                      for d in vi.type.tensor_type.shape.dim]
        for t in model.graph.initializer:
            self.dims[t.name] = list(t.dims)
        sizes = [int(d) for s in shapes.values() for d in s if int(d) > 0]
        self.fallback = min(sizes) if sizes else 1

    def rank(self, name: str) -> int | None:
        d = self.dims.get(name)
        return len(d) if d is not None else None

    def dim(self, name: str, axis: int) -> int:
        d = self.dims.get(name)
        if d is None or not -len(d) <= axis < len(d) or d[axis] is None:
            return self.fallback
        return int(d[axis])  # type: ignore[arg-type]

    def shape(self, name: str) -> list[int] | None:
        d = self.dims.get(name)
        return None if d is None or any(x is None for x in d) else [int(x) for x in d]  # type: ignore[arg-type]


def _consumers(model: onnx.ModelProto) -> dict[str, list[tuple[onnx.NodeProto, int]]]:
    out: dict[str, list[tuple[onnx.NodeProto, int]]] = {}
    for n in model.graph.node:
        for k, t in enumerate(n.input):
            if t:
                out.setdefault(t, []).append((n, k))
    return out


def _use(name: str, consumers: Mapping[str, list[tuple[onnx.NodeProto, int]]]) -> tuple[onnx.NodeProto, int] | None:
    """The first consumer (breadth-first through value-preserving nodes) that constrains `name`'s values."""
    seen, frontier = {name}, [name]
    while frontier:
        nxt = []
        for t in frontier:
            for n, k in consumers.get(t, []):
                if k in _TRANSPARENT.get(n.op_type, ()) and n.domain in ("", "ai.onnx"):
                    for o in n.output:
                        if o and o not in seen:
                            seen.add(o)
                            nxt.append(o)
                elif _constrains(n, k):
                    return n, k
        frontier = nxt
    return None


_INDEX_SLOTS = {"Gather": 1, "GatherElements": 1, "GatherND": 1, "ScatterElements": 1, "ScatterND": 1}


def _constrains(n: onnx.NodeProto, k: int) -> bool:
    op = n.op_type
    if n.domain not in ("", "ai.onnx"):
        return False
    return (_INDEX_SLOTS.get(op) == k or (op == "Slice" and k >= 1) or (op in ("Reshape", "Expand", "Tile") and k == 1)
            or (op == "ConstantOfShape" and k == 0) or (op == "Split" and k == 1) or (op == "TopK" and k == 1)
            or op == "Range" or (op == "Pad" and k == 1) or (op.startswith("Reduce") and k == 1)
            or (op in ("Div", "Mod") and k == 1) or (op in ("Unsqueeze", "Squeeze") and k == 1))


def _attr(n: onnx.NodeProto, name: str, default: int) -> int:
    for a in n.attribute:
        if a.name == name:
            return int(onnx.helper.get_attribute_value(a))
    return default


def _int_values(n: onnx.NodeProto, k: int, shape: Sequence[int], dtype: np.dtype, shapes: _Shapes,
                rng: np.random.Generator) -> np.ndarray | None:
    """Values for an integer input of `shape` that node `n` reads in slot `k`, or None when no rule applies."""
    op, count = n.op_type, int(np.prod(shape)) if len(shape) else 1
    data = n.input[0]
    if op in ("Gather", "GatherElements", "ScatterElements"):
        d = shapes.dim(data, _attr(n, "axis", 0))
        if d <= 0:
            return np.zeros(shape, dtype)
        if op == "ScatterElements":  # distinct along the axis: each output element written once
            axis = _attr(n, "axis", 0) % max(len(shape), 1)
            if len(shape) and shape[axis] > d:
                raise AmbiguousInputs(f"ScatterElements '{n.name}' would write {shape[axis]} values into {d} "
                                      f"places along its axis")
            keys = rng.random([*shape[:axis], d, *shape[axis + 1:]])
            return np.argsort(keys, axis=axis).take(range(shape[axis]) if len(shape) else [0], axis=axis) \
                .astype(dtype).reshape(shape)
        return rng.integers(-d, d, size=shape).astype(dtype)  # negative indices too
    if op in ("GatherND", "ScatterND"):
        if not len(shape) or shape[-1] == 0:
            return np.zeros(shape, dtype)
        batch = _attr(n, "batch_dims", 0) if op == "GatherND" else 0
        rank = shapes.rank(data)
        if batch + shape[-1] > (rank if rank is not None else 32):  # rows longer than the data's rank, which
            return None  # onnxruntime refuses (fuzz case 4365 of seed 33000000: 256 at the check's large size)
        dims = [shapes.dim(data, batch + j) for j in range(shape[-1])]
        rows = count // shape[-1]
        total = int(np.prod(dims))
        if total <= 0:
            return np.zeros(shape, dtype)
        if op == "ScatterND":  # distinct rows: each element written once
            if rows > total:
                raise AmbiguousInputs(f"ScatterND '{n.name}' would write {rows} rows into {total} places")
            flat = rng.choice(total, size=rows, replace=False)
        else:
            flat = rng.integers(0, total, size=rows)
        return np.stack(np.unravel_index(flat, dims), axis=-1).reshape(shape).astype(dtype)
    if op == "Slice":
        rank = shapes.rank(data) or 1
        if k == 3:  # axes: distinct and in range
            return rng.permutation(rank)[:count].reshape(shape).astype(dtype) if count <= rank else None
        if k == 4:  # steps: non-zero
            return rng.choice(np.array([1, 1, 2, -1]), size=shape).astype(dtype)
        d = max(shapes.dim(data, a) for a in range(rank)) if rank else shapes.fallback
        return rng.integers(-d - 1, d + 2, size=shape).astype(dtype)
    if op in ("Reshape", "Expand"):
        own = shapes.shape(data)
        if own is None or len(shape) > 1:
            return None
        if op == "Expand":  # the data's dims right-aligned, small new leading ones
            lead = rng.integers(1, 4, size=max(count - len(own), 0)).tolist()
            target = lead + own[len(own) - min(count, len(own)):]
        elif count == 0:
            return None
        elif count >= len(own):  # the data's dims after leading 1s
            target = [1] * (count - len(own)) + own
        else:  # the leading dims merged
            cut = len(own) - count + 1
            target = [int(np.prod(own[:cut]))] + own[cut:]
        return np.array(target, dtype).reshape(shape)
    if op == "Tile":
        return rng.integers(1, 3, size=shape).astype(dtype)
    if op == "ConstantOfShape":
        return rng.integers(1, 4, size=shape).astype(dtype)
    if op == "Split":
        d = shapes.dim(data, _attr(n, "axis", 0))
        if count <= 0:
            return None
        parts = np.full(count, d // count)
        parts[: d % count] += 1
        return parts.reshape(shape).astype(dtype)
    if op == "TopK":
        d = shapes.dim(data, _attr(n, "axis", -1))
        return np.full(shape, max(min(d, 3), 0), dtype)
    if op == "Range":
        return np.full(shape, (0, 8, 1)[k] if k < 3 else 1, dtype)
    if op == "Pad":
        return rng.integers(0, 3, size=shape).astype(dtype)
    if op.startswith("Reduce") or op in ("Unsqueeze", "Squeeze"):
        rank = shapes.rank(data) or 1
        if op == "Unsqueeze":
            rank += count
        return rng.permutation(rank)[:count].reshape(shape).astype(dtype) if count <= rank else None
    if op in ("Div", "Mod"):
        # non-zero, both signs, never -1: onnxruntime's integer Div of INT64_MIN (or the type's minimum) by -1
        # traps the whole process with SIGFPE, and the check runs the original model in evonnx's own process
        choices = np.array([1, 2, 3, 4, 5, 6, 7, -2, -3, -4, -5, -6, -7])
        return np.asarray(rng.choice(choices, size=shape), dtype)
    return None


def unfeedable(model: onnx.ModelProto) -> str | None:
    """Why onnxruntime's Python API cannot run `model` on numpy arrays, or None: an input or output of bfloat16, a
    float8, 4-bit or 2-bit type has no numpy type there ("No corresponding Numpy type for Tensor Type")."""
    init = {t.name for t in model.graph.initializer}
    for kind, vis in (("input", [i for i in model.graph.input if i.name not in init]), ("output", model.graph.output)):
        for vi in vis:
            if not vi.type.HasField("tensor_type"):
                continue
            elem = vi.type.tensor_type.elem_type
            if elem != onnx.TensorProto.STRING and np.dtype(onnx.helper.tensor_dtype_to_np_dtype(elem)).kind == "V":
                type_name = onnx.helper.tensor_dtype_to_string(elem).removeprefix("TensorProto.").lower()
                return f"{kind} '{vi.name}' is {type_name}, which onnxruntime's Python API cannot feed or return"
    return None


def synthesize(model: onnx.ModelProto, shapes: Mapping[str, Sequence[int]], seed: int,
               regime: str = "small") -> dict[str, np.ndarray]:
    """One input set: every graph input named in `shapes`, at its shape there, values as the module says."""
    rng = np.random.default_rng(seed)
    consumers = _consumers(model)
    dims: _Shapes | None = None
    feeds: dict[str, np.ndarray] = {}
    for i in model.graph.input:
        if i.name not in shapes:
            continue
        dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(i.type.tensor_type.elem_type))
        shape = [int(d) for d in shapes[i.name]]
        if dtype.kind == "f":
            arr = _float_values(rng, shape, regime).astype(dtype)
        elif dtype == np.bool_:
            arr = rng.random(shape) < 0.5
        elif dtype.kind in "iu":
            use = _use(i.name, consumers)
            got = None
            if use is not None:
                dims = dims or _Shapes(model, shapes)
                got = _int_values(use[0], use[1], shape, dtype, dims, rng)
            if got is None:
                high = min(8 if regime == "small" else 2000, int(np.iinfo(dtype).max))
                got = rng.integers(0, high, size=shape).astype(dtype)
            arr = got
        else:  # strings: evonnx never fuses them; the check only has to feed something onnxruntime accepts
            arr = np.array([f"s{v}" for v in rng.integers(0, 1000, size=int(np.prod(shape)))],
                           dtype=object).reshape(shape)
        feeds[i.name] = np.asarray(arr, dtype=dtype)  # a rank-0 input is a 0-d array, never a numpy scalar
    return feeds


def load_user_inputs(path: str | Path, model: onnx.ModelProto) -> list[tuple[str, dict[str, np.ndarray]]]:
    """The input sets of `--inputs` (see the module), each labelled with its file or folder, keyed by input name.

    An .npz names its arrays by input name. A test-data folder's `input_N.pb` are the graph's inputs that are not
    initializers, in order (a TensorProto's own name, when set, must be one of them). Raises UsageError naming
    the file when a set cannot be read or does not fit the model's inputs."""
    p = Path(path)
    defaults = {t.name for t in model.graph.initializer}
    names = [i.name for i in model.graph.input if i.name not in defaults]
    optional = overridable(model)  # inputs with a default: may be given
    if not p.exists():
        raise UsageError(f"--inputs {p}: no such file or folder")
    if p.is_file():
        return [(p.name, _read_npz(p, names, optional))]
    sets: list[tuple[str, dict[str, np.ndarray]]] = []
    for f in sorted(p.glob("*.npz")):
        sets.append((f.name, _read_npz(f, names, optional)))
    for folder in [p, *sorted(q for q in p.glob("test_data_set_*") if q.is_dir())]:
        pbs = sorted(folder.glob("input_*.pb"), key=lambda q: int(q.stem.split("_")[1])
                     if q.stem.split("_")[1].isdigit() else 1 << 30)
        if pbs:
            sets.append((str(folder.relative_to(p.parent)), _read_pbs(pbs, names)))
    if not sets:
        raise UsageError(f"--inputs {p}: no .npz files and no input_N.pb test data in the folder")
    return sets


def _read_npz(f: Path, names: Sequence[str], optional: Sequence[str] = ()) -> dict[str, np.ndarray]:
    try:
        with np.load(f, allow_pickle=False) as z:
            arrays = {k: np.asarray(z[k]) for k in z.files}
    except (OSError, ValueError) as e:
        raise UsageError(f"--inputs {f}: not a readable .npz file ({e})") from e
    return _fit(f, arrays, names, optional)


def _read_pbs(pbs: Sequence[Path], names: Sequence[str]) -> dict[str, np.ndarray]:
    arrays: dict[str, np.ndarray] = {}
    for k, f in enumerate(pbs):
        t = onnx.TensorProto()
        try:
            t.ParseFromString(f.read_bytes())
            arr = numpy_helper.to_array(t)
        except Exception as e:  # noqa: BLE001 - protobuf and numpy_helper raise several types
            raise UsageError(f"--inputs {f}: not a readable TensorProto ({type(e).__name__})") from e
        if k >= len(names):
            raise UsageError(f"--inputs {f}: the model has only {len(names)} inputs")
        arrays[t.name if t.name in names else names[k]] = arr
    return _fit(pbs[0].parent, arrays, names)


def _fit(where: Path, arrays: dict[str, np.ndarray], names: Sequence[str],
         optional: Sequence[str] = ()) -> dict[str, np.ndarray]:
    extra = [k for k in arrays if k not in names and k not in optional]
    missing = [k for k in names if k not in arrays]
    if extra or missing:
        raise UsageError(f"--inputs {where}: " + "; ".join(
            ([f"no model input named {', '.join(repr(k) for k in extra)}"] if extra else [])
            + ([f"missing {', '.join(repr(k) for k in missing)}"] if missing else []))
            + f" (the model's inputs: {', '.join(repr(k) for k in names)})")
    return {k: arrays[k] for k in [*names, *optional] if k in arrays}
