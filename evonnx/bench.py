"""`evonnx bench`: CI regression on exported models. Each model is optimized (or its optimized model next to it is
taken), checked against onnxruntime, and timed against the original in one interleaved run per thread count
(`evonnx.measure.compare_models`, the never-slower guard's own measurement). The result is one report: JSON for
`evonnx compare`, markdown for a person, JUnit XML for a CI system.

Report (`Report.as_dict`): `machine` (CPU model, cores, onnxruntime and evonnx versions, provider) and `models`, one
object per model and thread count (`Entry`).
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import tempfile
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import onnx

from evonnx.api import library_path, optimize
from evonnx.errors import EvonnxError, UsageError, VerificationError
from evonnx.guard import timing_feeds
from evonnx.isolate import CrashError
from evonnx.measure import MeasureError, compare_models, cpu_model
from evonnx.model import DOMAIN, load_model
from evonnx.passes.rewrite import FUSED_OP
from evonnx.verify import check_models

REPORT_VERSION = 1
OPTIMIZED_SUFFIX = ".opt.onnx"


@dataclass
class Entry:
    """One model at one thread count. Times in milliseconds (medians, p10, p90 over the interleaved runs); `speedup`
    is onnxruntime's median over evonnx's (above 1 evonnx is faster) and `noise` its relative spread over the
    rounds. `status`: "ok", "failed" (the check refused the optimized model) or "error" (no optimized model, or it
    could not be timed: `message` says why). The time fields are None where nothing was timed."""

    model: str
    status: str
    message: str = ""
    optimized: str = ""
    nodes_before: int = 0
    nodes_after: int = 0
    kernels: int = 0
    fusion_ratio: float = 0.0  # share of the original's nodes that the optimized model no longer runs
    check: dict[str, Any] = field(default_factory=dict)  # passed, max_rel_err, runs
    threads: int = 1  # 0: onnxruntime's default
    sizes: dict[str, int] = field(default_factory=dict)  # the symbolic sizes timed
    ort_ms: float | None = None
    evonnx_ms: float | None = None
    speedup: float | None = None
    noise: float | None = None
    ort_p10_ms: float | None = None
    ort_p90_ms: float | None = None
    evonnx_p10_ms: float | None = None
    evonnx_p90_ms: float | None = None
    seconds: float = 0.0  # optimizing and checking, once per model


def machine(provider: str) -> dict[str, Any]:
    """What the numbers were measured on."""
    import importlib.metadata

    import onnxruntime as ort

    try:
        version = importlib.metadata.version("evonnx")
    except importlib.metadata.PackageNotFoundError:
        version = "unknown"
    return {"cpu": cpu_model(), "cores": os.cpu_count() or 1, "onnxruntime": ort.__version__, "evonnx": version,
            "provider": provider, "python": platform.python_version(), "platform": platform.platform()}


def find_models(paths: Sequence[Path]) -> list[Path]:
    """The original models named: files as given, folders searched for `*.onnx` (sorted, recursively), without the
    optimized `*.opt.onnx` files next to them. Raises UsageError for a path that does not exist or names no
    model."""
    out: list[Path] = []
    for p in paths:
        if p.is_dir():
            found = sorted(q for q in p.rglob("*.onnx") if q.is_file() and not q.name.endswith(OPTIMIZED_SUFFIX))
            if not found:
                raise UsageError(f"{p}: no .onnx model in this folder")
            out += found
        elif p.is_file():
            out.append(p)
        else:
            raise UsageError(f"{p}: no such file or folder")
    return list(dict.fromkeys(out))


def optimized_next_to(model: Path) -> Path | None:
    """`X.opt.onnx` beside `X.onnx` with its library, when both exist."""
    stem = model.name[:-5] if model.name.endswith(".onnx") else model.name
    opt = model.with_name(stem + OPTIMIZED_SUFFIX)
    return opt if opt.is_file() and library_path(opt).is_file() else None


def _counts(original: onnx.ModelProto, optimized: onnx.ModelProto) -> dict[str, Any]:
    before, after = len(original.graph.node), len(optimized.graph.node)
    kernels = sum(1 for n in optimized.graph.node if n.domain == DOMAIN and n.op_type == FUSED_OP)  # not NMS
    ratio = (before - (after - kernels)) / before if before else 0.0
    return {"nodes_before": before, "nodes_after": after, "kernels": kernels,
            "fusion_ratio": round(min(1.0, max(0.0, ratio)), 4)}


@dataclass
class Options:
    threads: Sequence[int] = (1,)
    seconds: float = 1.0  # timed runs per model and side, per thread count
    rounds: int = 10
    sizes: Mapping[str, int] | None = None
    shapes: Mapping[str, Sequence[int]] | None = None
    guard: bool = True
    out_dir: Path | None = None  # keep the optimized models here (default: a temporary folder, removed)
    reuse: bool = True  # take X.opt.onnx next to X.onnx where it exists


def _prepare(model: Path, out: Path, opts: Options
             ) -> tuple[Path, Path, dict[str, Any], list[dict[str, int]], float]:
    """The optimized model and library for `model`, its check and the sizes the check ran: taken from beside it,
    or made in `out`. Raises EvonnxError (VerificationError where the check refuses)."""
    t0 = time.perf_counter()
    given = optimized_next_to(model) if opts.reuse else None
    if given is not None:
        original = load_model(model, infer=False)  # the check's reference is the model as written, as optimize's
        result = check_models(original, given, library_path(given), set(), sizes=opts.sizes, shapes=opts.shapes)
        check = {"passed": True, "max_rel_err": result.max_rel_err, "runs": len(result.runs), "summary": str(result)}
        return given, library_path(given), check, result.runs, time.perf_counter() - t0
    dst = out / (model.name[:-5] if model.name.endswith(".onnx") else model.name)
    dst = dst.with_name(dst.name + OPTIMIZED_SUFFIX)
    k = 1
    while dst.exists():  # two models of one name from different folders
        k += 1
        dst = dst.with_name(f"{dst.name[:-len(OPTIMIZED_SUFFIX)]}-{k}{OPTIMIZED_SUFFIX}")
    res = optimize(model, dst, sizes=opts.sizes, shapes=opts.shapes, guard=opts.guard)
    assert res.check is not None
    check = {"passed": True, "max_rel_err": res.check.max_rel_err, "runs": len(res.check.runs),
             "summary": str(res.check)}
    return res.output, res.library, check, res.check.runs, time.perf_counter() - t0


def bench_model(model: Path, out: Path, opts: Options, label: str | None = None) -> list[Entry]:
    """`model` optimized (or taken), checked and timed at each of `opts.threads`: one Entry per thread count, or
    one "failed"/"error" Entry when it gets no checked optimized model."""
    name = label or str(model)
    try:
        optimized, library, check, runs, seconds = _prepare(model, out, opts)
    except VerificationError as e:
        return [Entry(name, "failed", str(e).splitlines()[0], check={"passed": False, "max_rel_err": None,
                                                                       "message": str(e).splitlines()[0]})]
    except EvonnxError as e:
        return [Entry(name, "error", str(e).splitlines()[0], check={"passed": None, "max_rel_err": None})]
    original = load_model(model, infer=False)
    base = Entry(name, "ok", optimized=str(optimized), check=check, seconds=round(seconds, 3),
                 **_counts(original, onnx.load(str(optimized), load_external_data=False)))
    errors: list[str] = []
    raw = original.SerializeToString()
    for feeds, sizes in timing_feeds(original, opts.sizes, opts.shapes, errors, runs):
        try:
            entries = []
            for threads in opts.threads:
                c = compare_models(raw, optimized, library, feeds, threads=threads, seconds=opts.seconds,
                                   rounds=opts.rounds)
                o, v = c.original, c.optimized
                entries.append(Entry(**{**asdict(base), "threads": threads, "sizes": dict(sizes),
                                        "ort_ms": o["median_us"] / 1e3, "evonnx_ms": v["median_us"] / 1e3,
                                        "speedup": c.ratio, "noise": c.noise,
                                        "ort_p10_ms": o["p10_us"] / 1e3, "ort_p90_ms": o["p90_us"] / 1e3,
                                        "evonnx_p10_ms": v["p10_us"] / 1e3, "evonnx_p90_ms": v["p90_us"] / 1e3}))
            return entries
        except MeasureError as e:
            errors.append(str(e))
        except (VerificationError, CrashError) as e:
            # the optimized model fails or crashes on the timing inputs where the original runs: failed; the
            # original crashing in onnxruntime is no fault of the optimized model: an error
            if isinstance(e, CrashError) and "the original model" in e.doing:
                return [Entry(**{**asdict(base), "status": "error", "message": f"cannot time it: {e}"})]
            return [Entry(**{**asdict(base), "status": "failed", "message": str(e).splitlines()[0],
                             "check": {**check, "passed": False, "message": str(e).splitlines()[0]}})]
    why = errors[-1].splitlines()[0][:200] if errors else "no input set"
    return [Entry(**{**asdict(base), "status": "error", "message": f"cannot time it: {why}"})]


@dataclass
class Report:
    machine: dict[str, Any]
    models: list[Entry]

    def as_dict(self) -> dict[str, Any]:
        return {"evonnx_bench": REPORT_VERSION, "machine": self.machine, "models": [asdict(e) for e in self.models]}

    def json(self) -> str:
        return json.dumps(self.as_dict(), indent=1) + "\n"

    @property
    def failed(self) -> bool:
        return any(e.status != "ok" for e in self.models)


def _ms(x: float | None) -> str:
    return "–" if x is None else f"{x:.3g}"


def _threads(n: int) -> str:
    return str(n) if n else "default"


def line(e: Entry) -> str:
    """One plain line per entry, for logs."""
    if e.status != "ok":
        return f"{e.model}: {e.status}: {e.message}"
    return (f"{e.model}: {e.nodes_before} -> {e.nodes_after} nodes, {e.kernels} kernels, check passed, "
            f"{_threads(e.threads)} thread(s): {e.speedup:.3f}x (onnxruntime {_ms(e.ort_ms)} ms, evonnx "
            f"{_ms(e.evonnx_ms)} ms, noise +-{(e.noise or 0):.1%})")


def markdown(report: Report) -> str:
    m = report.machine
    rows = [f"### evonnx bench: {len(report.models)} result(s) on {m['cpu']} ({m['cores']} cores), onnxruntime "
            f"{m['onnxruntime']}, evonnx {m['evonnx']}", "",
            "| model | threads | nodes | kernels | fusion | check | onnxruntime ms | evonnx ms | speedup |",
            "|---|---:|---:|---:|---:|---|---:|---:|---:|"]
    for e in report.models:
        check = {"ok": "passed", "failed": "**failed**", "error": "error"}[e.status]
        speed = "–" if e.speedup is None else f"{e.speedup:.2f}x ±{(e.noise or 0):.0%}"
        model = e.model.replace("|", "\\|")
        rows.append(f"| {model} | {_threads(e.threads)} | {e.nodes_before} → {e.nodes_after} | {e.kernels} | "
                    f"{e.fusion_ratio:.0%} | {check} | {_ms(e.ort_ms)} | {_ms(e.evonnx_ms)} | {speed} |")
    notes = [f"- {e.model}: {e.message}".replace("|", "\\|") for e in report.models if e.status != "ok"]
    return "\n".join(rows + ([""] + notes if notes else [])) + "\n"


def junit(report: Report) -> str:
    """One test case per model and thread count; a failed check is a failure, no optimized model an error."""
    suite = ET.Element("testsuite", name="evonnx bench", tests=str(len(report.models)),
                       failures=str(sum(e.status == "failed" for e in report.models)),
                       errors=str(sum(e.status == "error" for e in report.models)),
                       time=f"{sum({e.model: e.seconds for e in report.models}.values()):.3f}")
    for e in report.models:
        case = ET.SubElement(suite, "testcase", classname="evonnx.bench",
                             name=f"{e.model} [{_threads(e.threads)} threads]", time=f"{e.seconds:.3f}")
        if e.status == "failed":
            ET.SubElement(case, "failure", message=e.message[:500]).text = e.message
        elif e.status == "error":
            ET.SubElement(case, "error", message=e.message[:500]).text = e.message
        else:
            ET.SubElement(case, "system-out").text = line(e)
    return ET.tostring(suite, encoding="unicode", xml_declaration=True) + "\n"


def bench(paths: Sequence[Path], opts: Options, provider: str = "cpu",
          progress: Callable[[int, int, str, list[Entry] | None], None] | None = None) -> Report:
    """Every model of `paths` (`find_models`), in order. `progress(k, n, model, entries)` is called before each
    model (entries None) and after it."""
    models = find_models(paths)
    if provider != "cpu":
        raise UsageError(f"provider {provider!r}: evonnx bench times onnxruntime's CPU EP only so far")
    tmp = None
    if opts.out_dir is None:
        tmp = Path(tempfile.mkdtemp(prefix="evonnx-bench-"))
    out = opts.out_dir or tmp
    assert out is not None
    try:
        out.mkdir(parents=True, exist_ok=True)
        report = Report(machine(provider), [])
        for k, model in enumerate(models):
            if progress:
                progress(k, len(models), str(model), None)
            entries = bench_model(model, out, opts)
            if tmp is not None:  # removed below: the report names no file that will not exist
                for e in entries:
                    e.optimized = "" if e.optimized.startswith(str(tmp)) else e.optimized
            report.models += entries
            if progress:
                progress(k + 1, len(models), str(model), entries)
        return report
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
