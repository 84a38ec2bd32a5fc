"""Export the detection post-processing models to ONNX, check them against PyTorch, write the manifest.

Usage (from the repository root, with the export venv described in models/README.md):

    python models/export.py                   # every model, into models/
    python models/export.py --only delta2bbox --out /tmp/m

Each model is exported, its IR version capped at 10, ``onnx.checker.check_model(full_check=True)`` run, and
then it is run in onnxruntime on seeded, realistic inputs for every case in ``Spec.cases`` (the export shape
first, then other batch sizes / feature-map sizes where the graph has symbolic dims) and compared with the
PyTorch module. ``manifest.json`` is written with sorted keys and no timestamps, so reruns are byte-stable.
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import json
import os
import sys
import tempfile
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from export_specs import SPECS, Inputs, Spec  # noqa: E402  (sibling module; models/ is not a package)

MAX_IR_VERSION = 10  # onnxruntime 1.31 reads IR ≤ 13; onnx 1.23 would stamp 14 on a fresh save
SEED = 20240607


class ExportCheckError(RuntimeError):
    """An exported model failed a check (numerics, shapes, or the expected presence of ScatterND)."""


# ---------------------------------------------------------------------------------------------------------
# export, check, describe
# ---------------------------------------------------------------------------------------------------------
def _export(spec: Spec, module: nn.Module, inputs: Inputs, path: Path) -> None:
    args = tuple(inputs.values())
    names = list(inputs)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # TracerWarnings about traced shapes are expected here
        if spec.exporter == "torchscript":
            torch.onnx.export(
                module,
                args,
                str(path),
                dynamo=False,
                input_names=names,
                output_names=list(spec.output_names),
                opset_version=spec.opset,
                dynamic_axes=spec.dynamic_axes or None,
                do_constant_folding=True,
            )
        elif spec.exporter == "dynamo":
            dims: dict[str, torch.export.Dim] = {}
            shapes: dict[str, dict[int, torch.export.Dim] | None] = {}
            for name in names:
                axes = spec.dynamic_axes.get(name)
                shapes[name] = (
                    {a: dims.setdefault(s, torch.export.Dim(s)) for a, s in axes.items()} if axes else None
                )
            program = torch.onnx.export(
                module,
                args,
                dynamo=True,
                input_names=names,
                output_names=list(spec.output_names),
                opset_version=spec.opset,
                dynamic_shapes=shapes if dims else None,
                external_data=False,
                optimize=True,
                verbose=False,
            )
            if program is None:
                raise ExportCheckError(f"{spec.name}: the dynamo exporter returned no program")
            program.save(str(path), external_data=False)
        else:
            raise ValueError(f"{spec.name}: unknown exporter {spec.exporter!r}")


def _finalize(path: Path, out: Path) -> onnx.ModelProto:
    model = onnx.load(str(path))
    model.ir_version = min(model.ir_version, MAX_IR_VERSION)
    # Keep the file reproducible: the dynamo exporter stamps every node with metadata (FX node, stack trace
    # with absolute paths); neither exporter's doc strings carry meaning for evonnx.
    del model.metadata_props[:]
    model.ClearField("doc_string")
    for node in model.graph.node:
        del node.metadata_props[:]
        node.ClearField("doc_string")
    onnx.checker.check_model(model, full_check=True)
    onnx.save(model, str(out))
    return model


def _compare(ref: np.ndarray, got: np.ndarray) -> tuple[float, bool]:
    if ref.shape != got.shape or ref.dtype != got.dtype:
        raise ExportCheckError(
            f"shape/dtype mismatch: torch {ref.shape} {ref.dtype}, onnx {got.shape} {got.dtype}"
        )
    if ref.dtype == np.bool_:
        mismatches = int(np.count_nonzero(ref != got))
        return float(mismatches), mismatches == 0
    finite = np.isfinite(ref) & np.isfinite(got)
    nonfinite = ~finite
    same_nonfinite = np.array_equal(np.isnan(ref), np.isnan(got)) and np.array_equal(
        ref[nonfinite], got[nonfinite]
    )
    diff = float(np.max(np.abs(ref[finite] - got[finite]), initial=0.0))
    scale = float(np.max(np.abs(ref[finite]), initial=1.0))
    return diff, same_nonfinite and diff <= 1e-6 * max(scale, 1.0) + 1e-6


def _dims_of(vi: onnx.ValueInfoProto) -> list[int | str]:
    return [d.dim_param if d.dim_param else d.dim_value for d in vi.type.tensor_type.shape.dim]


def _io(vi: onnx.ValueInfoProto, example: tuple[int, ...] | None) -> dict[str, Any]:
    elem = vi.type.tensor_type.elem_type
    entry: dict[str, Any] = {
        "name": vi.name,
        "dtype": np.dtype(onnx.helper.tensor_dtype_to_np_dtype(elem)).name,
        "shape": _dims_of(vi),
    }
    if example is not None:
        entry["example_shape"] = list(example)
    return entry


def _pin_generated_dims(model: onnx.ModelProto, spec: Spec, out_shapes: list[list[tuple[int, ...]]]) -> bool:
    """Replace exporter-invented output dim names (``Concatoutput_dim_2``) by the size every case produced.

    The TorchScript exporter names every output dim it could not infer once any output axis is dynamic.
    A dim is pinned only when it is not one of the spec's symbolic axes and all checked cases agree on it.
    """
    changed = False
    for k, vi in enumerate(model.graph.output):
        declared = set(spec.dynamic_axes.get(vi.name, {}).values())
        for axis, dim in enumerate(vi.type.tensor_type.shape.dim):
            if not dim.dim_param or dim.dim_param in declared:
                continue
            sizes = {shapes[k][axis] for shapes in out_shapes}
            if len(sizes) == 1 and "_dim_" in dim.dim_param:
                dim.dim_value = sizes.pop()  # clears dim_param (oneof)
                changed = True
    return changed


def _run_spec(spec: Spec, out: Path) -> dict[str, Any]:
    torch.manual_seed(SEED)
    module = spec.make_module().eval()
    path = out / f"{spec.name}.onnx"
    example = spec.make_inputs(torch.Generator().manual_seed(SEED), spec.cases[0])
    with tempfile.TemporaryDirectory() as tmp:
        raw = Path(tmp) / "raw.onnx"
        _export(spec, module, {k: v.clone() for k, v in example.items()}, raw)
        model = _finalize(raw, path)

    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    checked = []
    out_shapes: list[list[tuple[int, ...]]] = []
    for case in spec.cases:
        inputs = spec.make_inputs(torch.Generator().manual_seed(SEED), case)
        with torch.no_grad():
            ref = module(*(v.clone() for v in inputs.values()))
        refs = ref if isinstance(ref, tuple) else (ref,)
        got = sess.run(None, {k: v.numpy() for k, v in inputs.items()})
        for name, r, o in zip(spec.output_names, refs, got, strict=True):
            diff, ok = _compare(r.numpy(), o)
            shapes = {k: list(v.shape) for k, v in inputs.items()}
            print(f"  {spec.name} {shapes} {name}{list(o.shape)}: max_abs_diff={diff:.3g}")
            if not ok:
                raise ExportCheckError(f"{spec.name}: onnxruntime differs from PyTorch on {shapes} ({diff})")
        checked.append({k: list(v.shape) for k, v in inputs.items()})
        out_shapes.append([tuple(o.shape) for o in got])

    if _pin_generated_dims(model, spec, out_shapes):
        onnx.checker.check_model(model, full_check=True)
        onnx.save(model, str(path))
        sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        got = sess.run(None, {k: v.numpy() for k, v in example.items()})
        if [tuple(o.shape) for o in got] != out_shapes[0]:
            raise ExportCheckError(f"{spec.name}: output shapes changed after pinning dims")

    ops = collections.Counter(f"{n.domain}::{n.op_type}" if n.domain else n.op_type for n in model.graph.node)
    example_outputs = [tuple(o.shape) for o in sess.run(None, {k: v.numpy() for k, v in example.items()})]
    opset = next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))
    return {
        "name": spec.name,
        "file": path.name,
        "sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
        "size_bytes": path.stat().st_size,
        "opset": opset,
        "ir_version": model.ir_version,
        "exporter": spec.exporter,  # "torchscript" = torch.onnx.export(dynamo=False); "dynamo" = True
        "torch_version": torch.__version__,
        "inputs": [_io(vi, tuple(example[vi.name].shape)) for vi in model.graph.input],
        "outputs": [_io(vi, shp) for vi, shp in zip(model.graph.output, example_outputs, strict=True)],
        "checked_cases": checked,
        "input_hints": spec.input_hints,
        "description": spec.description,
        "source": spec.source,
        "writes": spec.writes,
        "node_count": len(model.graph.node),
        "initializer_count": len(model.graph.initializer),
        "op_histogram": dict(sorted(ops.items())),
    }


def main(argv: list[str] | None = None) -> int:
    fmt = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=fmt)
    parser.add_argument("--only", action="append", metavar="NAME", help="export only NAME (repeatable)")
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent, help="output folder")
    args = parser.parse_args(argv)

    known = {s.name for s in SPECS}
    unknown = set(args.only or ()) - known
    if unknown:
        parser.error(f"unknown model(s) {sorted(unknown)}; known: {sorted(known)}")
    specs = [s for s in SPECS if not args.only or s.name in args.only]
    args.out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(min(8, os.cpu_count() or 1))

    manifest_path = args.out / "manifest.json"
    entries: dict[str, Any] = {}
    if args.only and manifest_path.exists():  # refresh only the named models
        entries = {m["name"]: m for m in json.loads(manifest_path.read_text())["models"]}
    for spec in specs:
        print(f"[{spec.name}] exporting ({spec.exporter}, opset {spec.opset})")
        entry = _run_spec(spec, args.out)
        writes_scatter = any(op.startswith("Scatter") for op in entry["op_histogram"])
        if writes_scatter != spec.writes:
            raise ExportCheckError(
                f"{spec.name}: writes={spec.writes} but op histogram {entry['op_histogram']}"
            )
        entries[spec.name] = entry
        size_kb = entry["size_bytes"] / 1024
        print(f"  nodes={entry['node_count']} size={size_kb:.1f} KB ops={entry['op_histogram']}")

    order = {s.name: i for i, s in enumerate(SPECS)}
    manifest = {
        "generator": "models/export.py",
        "seed": SEED,
        "models": sorted(entries.values(), key=lambda m: order.get(m["name"], len(order))),
    }
    manifest_path.write_text(json.dumps(manifest, indent=2, sort_keys=True, ensure_ascii=False) + "\n")
    print(f"wrote {manifest_path} ({len(entries)} models)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
