"""The public API: `optimize` a model file, `load_session` an optimized one.

This is the one place the core reaches into `evonnx.passes` and `evonnx.kernels` (imported inside the functions,
so `import evonnx` stays light): it orchestrates them, and the CLI only calls it.
"""

from __future__ import annotations

import logging
import os
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

import onnx
import onnx_graphsurgeon as gs

from evonnx.blame import blame_reason
from evonnx.errors import (
    InvalidModelError,
    KernelFailure,
    NodeFailure,
    OutputMismatch,
    UnloadableModel,
    UsageError,
    VariantError,
    VerificationError,
)
from evonnx.excuses import decided_on_inexact
from evonnx.guard import GUARD_STAGES, guard_suspects, profiled_slower, time_against_original
from evonnx.index import Poly, Sym
from evonnx.inputs import load_user_inputs
from evonnx.isolate import load_failure
from evonnx.kernels.build import DEFAULT_CUDA_ARCHS, build_model_library
from evonnx.kernels.codegen_c import generate_source
from evonnx.kernels.codegen_cuda import generate_cuda, generate_cuda_host
from evonnx.measure import Comparison, MeasureError
from evonnx.model import DOMAIN, exact_outputs, load_model, overridable
from evonnx.outputs import Staging, check_paths
from evonnx.passes.lower_gathers import enabled as runtime_gathers_enabled
from evonnx.passes.ort_layout import fold_like_onnxruntime
from evonnx.passes.pipeline import PipelineResult, run_pipeline
from evonnx.records import KernelSpec
from evonnx.report import GuardResult, OptimizeResult, report_json
from evonnx.sizes import check_sizes
from evonnx.verify import CheckResult, check_models

if TYPE_CHECKING:
    import numpy as np
    import onnxruntime as ort

log = logging.getLogger(__name__)

LIBRARY_SUFFIX = ".evonnx.so"
# Kernels one `optimize` leaves to onnxruntime because a difference at the check started in them (evonnx.blame);
# past that the plan is refused as a whole: so many kernels differing is a bug to report, not to route around
MAX_BLAMED = 4


def library_path(model_path: str | Path) -> Path:
    """`out.onnx` -> `out.evonnx.so`, next to the model."""
    p = Path(model_path)
    stem = p.name[:-5] if p.name.endswith(".onnx") else p.name
    return p.with_name(stem + LIBRARY_SUFFIX)


def _worst(comparisons: Sequence[Comparison]) -> float:
    return min(c.ratio for c in comparisons)


@dataclass
class _Tied:
    """A plan the guard measured as a tie below 1.0x, kept while the plan without its slower kernels is tried: its
    build, its measurement, what the trial leaves (`what`, `kernels`), and its staged files as written."""

    result: PipelineResult
    out_model: onnx.ModelProto
    checked: CheckResult | None
    comparisons: list[Comparison]
    what: str
    kernels: int
    dst: Path
    lib: Path
    model_bytes: bytes
    library_bytes: bytes

    def restore(self, staged: Staging, guarded: GuardResult,
                why: str) -> tuple[PipelineResult, onnx.ModelProto, CheckResult | None]:
        """The tie stands: its files written back, its measurement reported, the trial reported as declined."""
        staged.path(self.dst).write_bytes(self.model_bytes)
        staged.path(self.lib).write_bytes(self.library_bytes)
        guarded.comparisons = self.comparisons
        guarded.dropped.pop()
        guarded.declined.append((self.what, self.kernels, why))
        return self.result, self.out_model, self.checked


def _folded_away(as_written: onnx.ModelProto, planned: onnx.ModelProto) -> list[str]:
    """Names of the nodes of `as_written` that the planned graph (onnxruntime's, after its session-start
    folding) no longer holds."""
    kept = {n.name for n in planned.graph.node}
    return [n.name for n in as_written.graph.node if n.name not in kept]


def _exact_outputs(model: onnx.ModelProto, specs: Sequence[KernelSpec]) -> set[str]:
    """Graph outputs that must match the original bit for bit (`model.exact_outputs`)."""
    return exact_outputs(model, {s.name for s in specs if not s.exact})


def optimize(src: str | Path, dst: str | Path | None = None, *, check: bool = True,
             dump_dir: str | Path | None = None, cflags: Sequence[str] = (), ort_headers: str | Path | None = None,
             sizes: Mapping[str, int] | None = None, shapes: Mapping[str, Sequence[int]] | None = None,
             planner: str = "search", report: str | Path | None = None, target: str = "cpu",
             cuda_archs: Sequence[str] | None = None, inputs: str | Path | None = None,
             guard: bool | None = None, guard_seconds: float = 0.5, cuda_compiler: str = "auto",
             progress: Callable[[str], None] | None = None) -> OptimizeResult:
    """Optimize `src` into `dst` (default `<src>.opt.onnx`) and its kernel library `dst` -> `*.evonnx.so`.

    `inputs` names input sets the check runs besides the ones it synthesizes (`evonnx.inputs.load_user_inputs`).
    `planner` is "search" (cost-model search, the default) or "greedy". `report` names a JSON file for the
    machine-readable report (see README). `target` "cuda" or "both" adds CUDA kernels for onnxruntime's CUDA
    execution provider, compiled by `cuda_compiler` ("nvcc", "nvrtc", or "auto": nvcc where found, else NVRTC);
    the CPU kernels are always in the library. Nothing is written unless the optimized model reproduces
    onnxruntime's outputs on the original.

    The never-slower guard (`guard`, default on unless EVONNX_GUARD=0) times the optimized model against the
    original on this machine's CPU at 1 thread and at onnxruntime's default thread count, about `guard_seconds`
    each; while its median loses by more than 2%, kernels are left to onnxruntime in stages
    (`GUARD_STAGES`), ending with none at all, and each stage is rebuilt and checked again. A tie below 1.0x tries
    the plan without the kernels onnxruntime's profiler finds slower than their nodes, and keeps the faster.

    Before any work, outputs that cannot be written (a folder, a missing or read-only folder) or that would
    overwrite the input or one another raise UsageError. The outputs are staged next to their final paths and
    renamed into place together at the end; on any failure, Ctrl-C included, nothing is written and no temporary
    file or folder is left (`--dump-dir`, a debugging aid, is written as soon as the kernels are generated).
    """
    t0 = time.perf_counter()
    src = Path(src)
    dst = Path(dst) if dst is not None else src.with_name(src.name.removesuffix(".onnx") + ".opt.onnx")
    lib = library_path(dst)
    outputs = {"output": dst, "kernel library": lib, **({"report": Path(report)} if report is not None else {})}
    check_paths(src, outputs, Path(dump_dir) if dump_dir is not None else None)
    if target not in ("cpu", "cuda", "both"):
        raise UsageError(f"target must be cpu, cuda or both, not '{target}'")
    if planner not in ("search", "greedy"):
        raise UsageError(f"planner must be search or greedy, not '{planner}'")
    with Staging(outputs) as staged:
        inferred = original = load_model(src)
        as_written = load_model(src, infer=False)
        # plan on the graph onnxruntime runs: what it folds at session start never becomes a kernel
        # (EVONNX_ORT_FOLD=0: plan on the graph as written). onnxruntime folds the model as written, not as ONNX
        # shape inference annotates it: with the inferred value_info it rewrites more (torchvision FCOS: a
        # Reshape to [Shape(x)[0], 4] became one to [0, -1], which fails where x is empty and the model as written
        # runs), so the folding starts from the model as written too
        if os.environ.get("EVONNX_ORT_FOLD", "1") != "0":
            original = fold_like_onnxruntime(as_written) or original
        user_inputs = load_user_inputs(inputs, original) if inputs is not None and check else []
        if check:
            check_sizes(original, sizes, shapes)
        symbol_sizes = {**_sizes_from_shapes(original, shapes or {}), **(sizes or {})}
        if guard is None:
            guard = os.environ.get("EVONNX_GUARD", "1") != "0"
        request = _BuildRequest(original, as_written, inferred, dst, lib, staged, planner, symbol_sizes, target,
                                dump_dir, tuple(cflags), ort_headers, cuda_archs, cuda_compiler, sizes, shapes,
                                user_inputs, progress or (lambda _: None))
        leave: dict[str, str] = {}
        guarded: GuardResult | None = None
        stage = 0
        everything = {n.name for n in original.graph.node}
        blamed = 0  # kernels left to onnxruntime because a difference at the check started in them
        tied: _Tied | None = None  # a plan measured as a tie below 1.0x, while the plan without its slower kernels runs
        while True:
            last = bool(leave) and set(leave) >= everything  # the guard's last stage: the original is written
            try:
                # the last stage writes the original: NMS in subgraph bodies, which `everything` does not name,
                # goes back to onnxruntime too
                result, out_model, checked = _build(request, leave, check and not last, nms=not last)
            except VerificationError as e:
                if isinstance(e, UnloadableModel) and request.original is not inferred and not leave:
                    # planned on onnxruntime's basic rewrite, which it may write back in a form it cannot load again
                    # (its float16 Casts around If/Loop bodies broke SSA: fuzz cases 176 and 4098): plan on the
                    # model as written instead
                    log.info("check: %s; planning on the model as written", e)
                    original = inferred
                    request = replace(request, original=inferred)
                    everything = {n.name for n in original.graph.node}
                    continue
                if isinstance(e, UnloadableModel) and e.nodes and not set(e.nodes) <= set(leave):
                    # onnxruntime refuses one kernel at session start, on the graph as onnxruntime transforms it (its
                    # Casts around a float16 Softplus, which it runs in float, feed the kernel float where the plan
                    # has float16: fuzz case 2266 of seed 29000000): that kernel's nodes go back to onnxruntime
                    leave.update({n: f"left to onnxruntime: onnxruntime cannot load its kernel ({str(e)[:160]})"
                                  for n in e.nodes})
                    log.info("check: %s; leaving that kernel's %d nodes to onnxruntime", e, len(e.nodes))
                    continue
                if isinstance(e, KernelFailure) and e.nodes and not set(e.nodes) <= set(leave):
                    # the kernel's check is onnxruntime's node's (or onnxruntime's node next to the kernels
                    # failed), and the original ran there only through onnxruntime's graph optimizations: the
                    # kernels' nodes go to onnxruntime, which serves them as it does
                    leave.update({n: f"left to onnxruntime: the original runs where the node fails without "
                                     f"onnxruntime's graph optimizations ({str(e)[:160]})" for n in e.nodes})
                    log.info("check: %s; leaving the %d nodes of %s to onnxruntime", e, len(e.nodes),
                             f"kernel {e.kernel}" if e.kernel else "the kernels next to that node")
                    continue
                decided, moved = set(), e.output if isinstance(e, OutputMismatch) else None
                if moved:
                    decided = decided_on_inexact(original, moved) - set(leave)
                if decided and tied is None:
                    # an output differs through a decision on inexact values (excuses.decided_on_inexact): the
                    # nodes computing its operands go to onnxruntime, so that it decides on its own bits
                    leave.update({n: f"left to onnxruntime: a decision on its value moved output '{moved}' at "
                                     f"the check ({str(e)[:160]})" for n in decided})
                    log.info("check: %s; leaving %d nodes that a decision on inexact values reads to onnxruntime",
                             e, len(decided))
                    continue
                if isinstance(e, OutputMismatch) and e.nodes and not set(e.nodes) <= set(leave) \
                        and blamed < MAX_BLAMED:
                    # the difference starts in one kernel (evonnx.blame): its nodes go to onnxruntime, and the rest
                    # of the plan is built and checked again
                    blamed += 1
                    leave.update({n: blame_reason(e.kernel, str(e)) for n in e.nodes})
                    log.warning("check: %s; kernel %s is where it starts: leaving its %d nodes to onnxruntime", e,
                                e.kernel, len(e.nodes))
                    continue
                if tied is not None and guarded is not None:  # the tried plan failed the check: the tie stands
                    result, out_model, checked = tied.restore(staged, guarded, f"it failed the check: {str(e)[:120]}")
                    break
                if not leave or guarded is None:
                    raise
                # a plan with fewer kernels failed the check (a decision that flips on other values): nothing
                # but the original is certain, so every node goes back to onnxruntime
                guarded.dropped.append(("every other kernel, as the reduced plan failed the check", 0, str(e)[:160]))
                leave.update({n: "left to onnxruntime by the never-slower guard (a reduced plan failed the check)"
                              for n in everything})
                continue
            if not result.specs and not result.nms:
                # no kernel (planned none, or none beat onnxruntime): the model is written as the original was,
                # not the pipeline's graph, whose plan-time folding (onnxruntime's, for one) nobody timed, with an
                # empty kernel library
                if guarded is None and guard:
                    guarded = GuardResult([], note="nothing to time (no kernel)")
                elif guarded is not None and guarded.dropped:
                    guarded.comparisons = []
                out_model = as_written
                onnx.save(out_model, str(staged.path(dst)))
                break
            if not guard:
                break
            request.progress("timing against onnxruntime (the never-slower guard)")
            try:
                comparisons = time_against_original(as_written, staged.path(dst), staged.path(lib), sizes, shapes,
                                                    guard_seconds, checked.runs if checked is not None else ())
            except MeasureError as e:
                if tied is not None and guarded is not None:  # the tried plan could not be timed: the tie stands
                    result, out_model, checked = tied.restore(staged, guarded, f"the plan without them failed to "
                                                                               f"time: {e}")
                elif guarded is None:
                    guarded = GuardResult([], note=f"skipped: {e}")
                else:  # a later stage could not be timed: what was dropped stays reported
                    guarded.comparisons = []
                    guarded.dropped.append((f"nothing more (the next measurement failed: {e})", 0, ""))
                break
            if tied is not None and guarded is not None:  # the plan without the tie's slower kernels, timed
                guarded.comparisons = comparisons
                if (trial := _worst(comparisons)) <= _worst(tied.comparisons):  # the better of the two stays
                    result, out_model, checked = tied.restore(staged, guarded, f"measured {trial:.3f}x without them")
                break
            losing = [c for c in comparisons if c.slower]
            if guarded is None:
                guarded = GuardResult(comparisons)
            guarded.comparisons = comparisons
            if not losing:
                if stage > 0 or _worst(comparisons) >= 1.0:
                    break
                # a tie below 1.0x: the kernels onnxruntime's profiler says are slower than their nodes are left
                # to it on trial, and the faster of the two plans is written (mmdet RetinaNet's TopK head: 0.985x
                # at the guard, 0.930x in whole_models.py)
                key, what = GUARD_STAGES[0]
                stage = 1
                chosen = profiled_slower(as_written, staged.path(dst), staged.path(lib), result, sizes, shapes,
                                         checked.runs if checked is not None else ())
                if not chosen:
                    break
                tied = _Tied(result, out_model, checked, comparisons, what, len(chosen), dst, lib,
                             staged.path(dst).read_bytes(), staged.path(lib).read_bytes())
                leave.update({n: f"left to onnxruntime by the never-slower guard ({what}: measured a tie of "
                                 f"{_worst(comparisons):.3f}x with them)" for nodes in chosen for n in nodes})
                guarded.dropped.append((what, len(chosen), str(min(comparisons, key=lambda c: c.ratio))))
                continue
            while stage < len(GUARD_STAGES):
                key, what = GUARD_STAGES[stage]
                stage += 1
                chosen = (profiled_slower(as_written, staged.path(dst), staged.path(lib), result, sizes,
                                          shapes, checked.runs if checked is not None else ())
                          if key == "slower" else [s.source_nodes for s in guard_suspects(original, result.specs,
                                                                                          key)]
                          + ([[n] for n in result.nms] if key == "all" else []))
                if chosen:
                    break
            else:
                break  # unreachable: the last stage takes every kernel
            reason = f"left to onnxruntime by the never-slower guard ({what}: measured {losing[0].ratio:.3f}x)"
            # the last stage leaves every node (a re-plan could fuse nodes no kernel held yet): the original
            leave.update({n: reason for n in (everything if key == "all" else
                                                (n for nodes in chosen for n in nodes))})
            guarded.dropped.append((what, len(chosen), str(losing[0])))
            log.info("guard: %s; leaving %d %s to onnxruntime", losing[0], len(chosen), what)
        out = OptimizeResult(dst, lib, len(as_written.graph.node), len(out_model.graph.node), result.specs,
                             result.plan, checked, time.perf_counter() - t0, guarded,
                             _folded_away(as_written, original), [] if out_model is as_written else result.nms)
        if report is not None:
            staged.path(Path(report)).write_text(report_json(out, result, out_model, planner))
        staged.commit()
    return out


@dataclass(frozen=True)
class _BuildRequest:
    """What every guard stage of one `optimize` builds from: the models, the staged paths and the options."""

    original: onnx.ModelProto  # as evonnx plans on it (onnxruntime's folding applied)
    as_written: onnx.ModelProto  # the file's model: the check's reference
    inferred: onnx.ModelProto  # the file's model with ONNX shape inference's value_info (`_declare_as_written`)
    dst: Path
    lib: Path
    staged: Staging
    planner: str
    symbol_sizes: Mapping[str, int]
    target: str
    dump_dir: str | Path | None
    cflags: tuple[str, ...]
    ort_headers: str | Path | None
    cuda_archs: Sequence[str] | None
    cuda_compiler: str
    sizes: Mapping[str, int] | None
    shapes: Mapping[str, Sequence[int]] | None
    user_inputs: Sequence[tuple[str, Mapping[str, np.ndarray]]]
    progress: Callable[[str], None]  # told each stage as it starts (the CLI's status line)


def _build(req: _BuildRequest, leave: Mapping[str, str], check: bool,
           nms: bool = True) -> tuple[PipelineResult, onnx.ModelProto, CheckResult | None]:
    """Plan (leaving the nodes `leave` names to onnxruntime), generate, build and check into the staged paths."""
    original, as_written, dst, lib, staged = req.original, req.as_written, req.dst, req.lib, req.staged
    target, dump_dir, cflags, ort_headers, cuda_archs = (req.target, req.dump_dir, req.cflags, req.ort_headers,
                                                         req.cuda_archs)
    planner, symbol_sizes, sizes, shapes, user_inputs = (req.planner, req.symbol_sizes, req.sizes, req.shapes,
                                                         req.user_inputs)

    req.progress("planning" + (f" without {len(leave)} nodes the guard left to onnxruntime" if leave else ""))
    result = run_pipeline(original, planner=planner, sizes=symbol_sizes, leave=leave, nms=nms and target == "cpu",
                          runtime_indices=target == "cpu" and runtime_gathers_enabled())
    out_model = gs.export_onnx(result.optimized)
    _restore_defaults(original, out_model)
    _declare_as_written(as_written, req.inferred, out_model)
    out_model.ir_version = original.ir_version
    del out_model.opset_import[:]
    out_model.opset_import.extend(o for o in original.opset_import if o.domain != DOMAIN)
    out_model.opset_import.append(onnx.helper.make_opsetid(DOMAIN, 1))
    for name in ("producer_name", "producer_version", "domain", "model_version", "doc_string"):
        setattr(out_model, name, getattr(original, name))
    out_model.producer_name = "evonnx"
    source = generate_source(result.specs, dst.name)
    cuda_source = None
    if target in ("cuda", "both"):
        source = source.append(generate_cuda_host(result.specs))
        cuda_source = generate_cuda(result.specs, dst.name)
    if dump_dir is not None:
        _dump(Path(dump_dir), result, source.text, out_model, cuda_source)
    req.progress(f"compiling {len(result.specs)} kernels" + (" (C and CUDA)" if cuda_source is not None else ""))

    def build(cpu_variants: bool | None) -> None:
        build_model_library(source, staged.path(lib), model_name=dst.name, cflags=tuple(cflags),
                            headers=Path(ort_headers) if ort_headers is not None else None, cuda_source=cuda_source,
                            cuda_archs=tuple(cuda_archs) if cuda_archs else DEFAULT_CUDA_ARCHS,
                            cuda_compiler=req.cuda_compiler, cpu_variants=cpu_variants)

    def check_built(cpu_variants: bool | None) -> CheckResult:
        # onnxruntime on the model as written: the inferred shapes evonnx planned with can change what its
        # own optimizations do (a Reshape of an empty tensor that fails only with them)
        req.progress("checking against onnxruntime on the original")
        return check_models(as_written, staged.path(dst), staged.path(lib), _exact_outputs(out_model, result.specs),
                            sizes=sizes, shapes=shapes, equal_symbols=_equal_symbols(original, result),
                            user_inputs=user_inputs, cpu_variants=cpu_variants)

    build(None)
    onnx.save(out_model, str(staged.path(dst)))
    checked = None
    if not check:
        # no comparison was asked for, but a model onnxruntime cannot load is no model: the same error, and the
        # same plan on the model as written, as where the check finds it
        if result.specs or result.nms:
            req.progress("loading the optimized model in onnxruntime")
            if failure := load_failure(staged.path(dst), staged.path(lib), as_written.SerializeToString()):
                unloadable = UnloadableModel(f"onnxruntime cannot load the optimized model: {failure}")
                unloadable.nodes = _named_kernel_nodes(failure, result.specs)
                raise unloadable
    else:
        try:
            checked = check_built(None)
        except NodeFailure as e:
            e.nodes = _next_to_failed_node(out_model, result.specs, e.text)
            raise
        except (KernelFailure, OutputMismatch) as e:
            e.nodes = next((spec.source_nodes for spec in result.specs if spec.name == e.kernel), ())
            raise
        except UnloadableModel as e:
            e.nodes = _named_kernel_nodes(str(e), result.specs)
            raise
        except VariantError as e:
            # a compiler bug in the x86-64-v3 build alone: the library carries the baseline kernels, which the
            # check ran on every input set, and is checked again as built
            log.warning("%s: %s; building the baseline CPU kernels alone", dst.name, e)
            req.progress("compiling the baseline CPU kernels alone (the x86-64-v3 ones differ: a compiler bug)")
            build(False)
            checked = check_built(False)
            checked.variant_bug = str(e)
    return result, out_model, checked


_NAMED_KERNEL = re.compile(r"\(kernel '(evo[0-9]+_[0-9a-f]+)'\)")  # the runtime's messages (evonnx_ort.cc)


def _named_kernel_nodes(message: str, specs: Sequence[KernelSpec]) -> tuple[str, ...]:
    """The source nodes of the kernel that an onnxruntime error `message` names, or ()."""
    named = _NAMED_KERNEL.search(message)
    return next((tuple(spec.source_nodes) for spec in specs if named and spec.name == named.group(1)), ())


def _next_to_failed_node(out_model: onnx.ModelProto, specs: Sequence[KernelSpec], text: str) -> tuple[str, ...]:
    """The source nodes of the kernels that feed, or read, the node of `out_model` that onnxruntime's error `text`
    names (`Name:'...'`, matched against the graph's own names, which may hold quotes)."""
    failed = [n for n in out_model.graph.node if n.domain != DOMAIN and f"Name:'{n.name}' " in text]
    near = {t for n in failed for t in [*n.input, *n.output] if t}
    kernels = {n.name for n in out_model.graph.node if n.domain == DOMAIN and near & {*n.input, *n.output}}
    return tuple(m for spec in specs if spec.name in kernels for m in spec.source_nodes)


def _declare_as_written(as_written: onnx.ModelProto, inferred: onnx.ModelProto, out_model: onnx.ModelProto) -> None:
    """Declares no more of a shape than onnxruntime knows when it loads the original, where that can matter: the
    graph outputs as written, and of a kernel output only the dims that shape inference of the original as written
    knows, and knows to be what the kernel gives. The pipeline plans on the graph after onnxruntime's constant
    folding, and onnxruntime infers shapes at load time, before folding: a dim the original could not know there
    could contradict a node it runs anyway (fuzz case 3160: a kernel output [2, 1] concatenated with a constant
    [2, 0], inputs that disagree off the Concat's axis; shape inference believes the Slice that the kernel computes
    gives [2, 0], onnxruntime's Slice gives [2, 1], and the original loads and runs. Declared [2, 1], with the
    Concat's output declared [6, 0], onnxruntime refused to load the optimized model). `inferred` is
    `as_written` shape-inferred (`load_model` did that once for the whole `optimize`)."""
    written = {o.name: o for o in as_written.graph.output}
    known = {v.name: v for v in (*inferred.graph.value_info, *inferred.graph.output)}  # what it believes at load
    for o in out_model.graph.output:
        if o.name in written:
            o.type.CopyFrom(written[o.name].type)
    # The value_info of tensors onnxruntime computes stays as the pipeline inferred it: dropping it changed
    # onnxruntime's own result for the boxes of torchvision's Faster R-CNN (210.5 -> 127.6; the check refused it).
    kernel_outputs = {t for n in out_model.graph.node if n.domain == DOMAIN for t in n.output}
    # But a tensor onnxruntime computes and a Shape or Size reads keeps only its rank, unless the model as written
    # declares it: with a static shape declared, onnxruntime folds the Shape and drops, as unused, the nodes that
    # computed the tensor, which may be ones that fail in the original (fuzz case 1767: Sub(x[N], y[M]) read
    # through Shape -> GreaterOrEqual -> Shape; ONNX's inference knew the [1] of the GreaterOrEqual, onnxruntime's
    # own does not, and the optimized model returned where the original fails at N = 0, M = 3).
    declared = {v.name for v in as_written.graph.value_info}
    shape_read = {n.input[0] for n in out_model.graph.node if n.op_type in ("Shape", "Size") and n.input}
    for v in out_model.graph.value_info:
        if v.name not in kernel_outputs:
            if v.name in shape_read and v.name not in declared:
                for d in v.type.tensor_type.shape.dim:
                    d.Clear()
            continue
        ref = known.get(v.name)
        ref_dims = list(ref.type.tensor_type.shape.dim) if ref is not None and ref.type.tensor_type.HasField(
            "shape") else []
        for k, d in enumerate(v.type.tensor_type.shape.dim):
            if k >= len(ref_dims) or d.SerializeToString() != ref_dims[k].SerializeToString():
                d.Clear()  # rank kept, the dim unknown: onnxruntime did not know it, or believed another


def _restore_defaults(original: onnx.ModelProto, out_model: onnx.ModelProto) -> None:
    """The default values of the overridable inputs (`pipeline.overridable`) that the optimized graph still reads:
    evonnx planned them as run-time inputs, and a Run that does not feed them must still see the defaults."""
    inputs = {i.name for i in out_model.graph.input}
    have = {t.name for t in out_model.graph.initializer}
    by_name = {t.name: t for t in original.graph.initializer}
    for name in overridable(original):
        if name in inputs and name not in have:
            out_model.graph.initializer.append(by_name[name])


def _equal_symbols(model: onnx.ModelProto, result: PipelineResult) -> list[tuple[str, str]]:
    """The input dims the plan's broadcast checks tie together, as the check names them (a dim_param, else
    `input:axis`): the check sizes them alike and every other dim apart."""
    keys: dict[str, str] = {}
    for i in model.graph.input:
        for axis, d in enumerate(i.type.tensor_type.shape.dim):
            if not d.HasField("dim_value"):
                keys[f"{i.name}\0{axis}"] = d.dim_param or f"{i.name}:{axis}"

    def key(p: Poly) -> str | None:
        atom = p.atom()
        if not isinstance(atom, Sym):
            return None
        origin = result.analysis.sym_origin.get(atom.name)
        return keys.get(f"{origin[0]}\0{origin[1]}") if origin is not None else None

    pairs = []
    for spec in result.specs:
        for c in spec.checks:
            if c.kind == "bcast" and (a := key(c.lhs)) is not None and (b := key(c.rhs)) is not None and a != b:
                pairs.append((a, b))
    return pairs


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
    assert isinstance(result, PipelineResult)
    lines = [str(g) for g in result.plan.groups] + ["", "left to onnxruntime:"]
    lines += [f"  {r}" for r in result.plan.rejected]
    try:
        d.mkdir(parents=True, exist_ok=True)
        (d / "kernels.c").write_text(source)
        if cuda_source is not None:
            (d / "kernels.cu").write_text(cuda_source)
        (d / "plan.txt").write_text("\n".join(lines) + "\n")
        onnx.save(out_model, str(d / "optimized.onnx"))
    except OSError as e:
        raise UsageError(f"{d}: cannot write the dump ({e.strerror})") from e


def load_session(path: str | Path, providers: Sequence[str] | None = None,
                 sess_options: ort.SessionOptions | None = None) -> ort.InferenceSession:
    """An `onnxruntime.InferenceSession` for an optimized model, with its kernel library registered."""
    import onnxruntime as ort

    lib = library_path(path)
    if not lib.exists():
        raise InvalidModelError(f"{path}: its kernel library {lib} is missing (written by 'evonnx optimize')")
    so = sess_options if isinstance(sess_options, ort.SessionOptions) else ort.SessionOptions()
    # onnxruntime hands the path to dlopen, which searches its library path, not the current folder, for a name
    # without a slash: "m.opt.evonnx.so" would not be found, so the path is made absolute.
    so.register_custom_ops_library(str(lib.absolute()))
    return ort.InferenceSession(str(path), so, providers=list(providers or ["CPUExecutionProvider"]))
