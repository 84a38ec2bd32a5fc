"""The public API: `optimize` a model file, `load_session` an optimized one.

This is the one place the core reaches into `evonnx.passes` and `evonnx.kernels` (imported inside the functions,
so `import evonnx` stays light): it orchestrates them, and the CLI only calls it.
"""

from __future__ import annotations

import logging
import os
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import onnx

from evonnx.errors import EvonnxError, InvalidModelError
from evonnx.model import DOMAIN, load_model
from evonnx.records import FusionPlan, KernelSpec
from evonnx.verify import CheckResult, check_models

log = logging.getLogger(__name__)

LIBRARY_SUFFIX = ".evonnx.so"


def library_path(model_path: str | Path) -> Path:
    """`out.onnx` -> `out.evonnx.so`, next to the model."""
    p = Path(model_path)
    stem = p.name[:-5] if p.name.endswith(".onnx") else p.name
    return p.with_name(stem + LIBRARY_SUFFIX)


@dataclass
class OptimizeResult:
    output: Path
    library: Path
    nodes_before: int
    nodes_after: int
    kernels: list[KernelSpec]
    plan: FusionPlan
    check: CheckResult | None
    seconds: float

    def summary(self) -> str:
        copies = (f", {self.plan.copies_removed} full-tensor copies of scatter writes removed"
                  if self.plan.copies_removed else "")
        lines = [f"{self.output}: {self.nodes_before} nodes -> {self.nodes_after} "
                 f"({len(self.kernels)} fused kernels{copies}); library {self.library}"]
        for k in self.kernels:
            ops: dict[str, int] = {}
            for op in k.source_ops:
                ops[op] = ops.get(op, 0) + 1
            absorbed = ", ".join(f"{op}x{n}" if n > 1 else op for op, n in sorted(ops.items()))
            lines.append(f"  {k.name}: {len(k.source_ops)} nodes -> 1 [{absorbed}]"
                         f"{' exact' if k.exact else ''}")
        lines.append(f"  check: {self.check if self.check is not None else 'skipped (--no-check)'}")
        lines.append(f"  time: {self.seconds:.2f} s")
        return "\n".join(lines)


def _exact_outputs(model: onnx.ModelProto, specs: Sequence[KernelSpec]) -> set[str]:
    """Graph outputs no inexact kernel contributes to: they must match the original bit for bit."""
    inexact = {s.name for s in specs if not s.exact}
    producer = {o: n for n in model.graph.node for o in n.output}
    out = set()
    for g_out in model.graph.output:
        stack, seen, tainted = [g_out.name], set(), False
        while stack and not tainted:
            t = stack.pop()
            n = producer.get(t)
            if n is None or n.name in seen:
                continue
            seen.add(n.name)
            tainted = n.domain == DOMAIN and n.name in inexact
            stack.extend(n.input)
        if not tainted:
            out.add(g_out.name)
    return out


def optimize(src: str | Path, dst: str | Path | None = None, *, check: bool = True,
             dump_dir: str | Path | None = None, cflags: Sequence[str] = (), ort_headers: str | Path | None = None,
             sizes: Mapping[str, int] | None = None, shapes: Mapping[str, Sequence[int]] | None = None,
             planner: str = "search", report: str | Path | None = None, target: str = "cpu",
             cuda_archs: Sequence[str] | None = None) -> OptimizeResult:
    """Optimize `src` into `dst` (default `<src>.opt.onnx`) and its kernel library `dst` -> `*.evonnx.so`.

    `planner` is "search" (cost-model search, the default) or "greedy". `report` names a JSON file for the
    machine-readable report (see README). `target` "cuda" or "both" adds CUDA kernels (needs nvcc) for
    onnxruntime's CUDA execution provider; the CPU kernels are always in the library. Nothing is written unless
    the optimized model reproduces onnxruntime's outputs on the original.
    """
    import onnx_graphsurgeon as gs

    from evonnx.kernels.build import build_model_library
    from evonnx.kernels.codegen_c import generate
    from evonnx.passes.pipeline import run_pipeline

    t0 = time.perf_counter()
    src = Path(src)
    dst = Path(dst) if dst is not None else src.with_name(src.name.removesuffix(".onnx") + ".opt.onnx")
    if dst.resolve() == src.resolve():
        raise InvalidModelError(f"{dst}: the output would overwrite the input")
    if not dst.parent.is_dir():
        raise InvalidModelError(f"{dst.parent}: output folder does not exist")
    original = load_model(src)
    symbol_sizes = {**_sizes_from_shapes(original, shapes or {}), **(sizes or {})}
    result = run_pipeline(original, planner=planner, sizes=symbol_sizes)
    out_model = gs.export_onnx(result.optimized)
    out_model.ir_version = original.ir_version
    del out_model.opset_import[:]
    out_model.opset_import.extend(o for o in original.opset_import if o.domain != DOMAIN)
    out_model.opset_import.append(onnx.helper.make_opsetid(DOMAIN, 1))
    for field in ("producer_name", "producer_version", "domain", "model_version", "doc_string"):
        setattr(out_model, field, getattr(original, field))
    out_model.producer_name = "evonnx"
    if target not in ("cpu", "cuda", "both"):
        raise InvalidModelError(f"target must be cpu, cuda or both, not '{target}'")
    source = generate(result.specs, dst.name)
    cuda_source = None
    if target in ("cuda", "both"):
        from evonnx.kernels.codegen_cuda import generate_cuda, generate_cuda_host

        source += generate_cuda_host(result.specs)
        cuda_source = generate_cuda(result.specs, dst.name)
    if dump_dir is not None:
        _dump(Path(dump_dir), result, source, out_model, cuda_source)
    lib = library_path(dst)
    fd, tmp_model = tempfile.mkstemp(prefix=".evonnx-", suffix=".onnx", dir=dst.parent)
    os.close(fd)
    tmp_lib = Path(tmp_model).with_suffix(".so")
    try:
        onnx.save(out_model, tmp_model)
        build_model_library(source, tmp_lib, model_name=dst.name, cflags=tuple(cflags),
                            headers=Path(ort_headers) if ort_headers is not None else None,
                            cuda_source=cuda_source,
                            **({"cuda_archs": tuple(cuda_archs)} if cuda_archs else {}))
        checked = None
        if check:
            checked = check_models(original, Path(tmp_model), tmp_lib, _exact_outputs(out_model, result.specs),
                                   sizes=sizes, shapes=shapes)
        os.replace(tmp_lib, lib)
        os.replace(tmp_model, dst)
    except (EvonnxError, OSError):
        for p in (Path(tmp_model), tmp_lib):
            p.unlink(missing_ok=True)
        raise
    out = OptimizeResult(dst, lib, len(original.graph.node), len(out_model.graph.node), result.specs, result.plan,
                         checked, time.perf_counter() - t0)
    if report is not None:
        from evonnx.report import write_report

        write_report(Path(report), out, result, out_model, planner)
    return out


def _sizes_from_shapes(model: onnx.ModelProto, shapes: Mapping[str, Sequence[int]]) -> dict[str, int]:
    """Symbolic dims of the inputs the user gave shapes for, so the cost model plans at those sizes."""
    out: dict[str, int] = {}
    for i in model.graph.input:
        if i.name in shapes:
            for d, n in zip(i.type.tensor_type.shape.dim, shapes[i.name]):
                if d.HasField("dim_param"):
                    out[d.dim_param] = int(n)
    return out


def _dump(d: Path, result: object, source: str, out_model: onnx.ModelProto, cuda_source: str | None) -> None:
    from evonnx.passes.pipeline import PipelineResult

    assert isinstance(result, PipelineResult)
    d.mkdir(parents=True, exist_ok=True)
    (d / "kernels.c").write_text(source)
    if cuda_source is not None:
        (d / "kernels.cu").write_text(cuda_source)
    lines = [str(g) for g in result.plan.groups] + ["", "left to onnxruntime:"]
    lines += [f"  {r}" for r in result.plan.rejected]
    (d / "plan.txt").write_text("\n".join(lines) + "\n")
    onnx.save(out_model, str(d / "optimized.onnx"))


def load_session(path: str | Path, providers: Sequence[str] | None = None, sess_options: object = None):  # noqa: ANN201
    """An `onnxruntime.InferenceSession` for an optimized model, with its kernel library registered."""
    import onnxruntime as ort

    lib = library_path(path)
    if not lib.exists():
        raise InvalidModelError(f"{path}: its kernel library {lib} is missing (written by 'evonnx optimize')")
    so = sess_options if isinstance(sess_options, ort.SessionOptions) else ort.SessionOptions()
    so.register_custom_ops_library(str(lib))
    return ort.InferenceSession(str(path), so, providers=list(providers or ["CPUExecutionProvider"]))
