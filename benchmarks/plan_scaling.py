"""Optimize time against graph size (issue 8): synthetic graphs of N nodes, each pass of `evonnx optimize` timed.

    .venv/bin/python benchmarks/plan_scaling.py                          # all shapes, N = 250 ... 5000
    .venv/bin/python benchmarks/plan_scaling.py --shapes chain --sizes 5000 --e2e
    .venv/bin/python benchmarks/plan_scaling.py --shapes chain --sizes 5000 --profile /tmp/prof

Shapes (all float32, batch 8, built with onnx.helper):
- chain: one deep chain of N elementwise nodes (Add, Mul, Neg, Abs, Sigmoid, ... with small constants) on x[8,64];
- wide: N/4 independent 4-node chains from one input x[8,64], concatenated 16 at a time into N/64 outputs;
- mixed: detector post-processing blocks (Slice a channel range of x[8,85,64], Transpose, Sigmoid, Mul, Add the
  previous block, every 8th block Reshaped for a Concat), 5 to 6 nodes a block.

The passes are run as `evonnx.optimize` runs them (load, analyze, dependences, node stats, search planner,
lower_groups, rewrite + export, C code generation, gcc build, check), each timed with `time.perf_counter`;
`--e2e` also times one whole `evonnx.optimize` call. The table goes to stdout and to
benchmarks/results/plan_scaling.txt (`--out`). This is a benchmark, not a test: nothing asserts on time.
"""

from __future__ import annotations

import argparse
import cProfile
import datetime
import os
import platform
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import onnx_graphsurgeon as gs  # noqa: E402

import evonnx  # noqa: E402
from evonnx.api import _exact_outputs, library_path  # noqa: E402
from evonnx.kernels.build import build_model_library  # noqa: E402
from evonnx.kernels.codegen_c import generate_source  # noqa: E402
from evonnx.model import DOMAIN, default_opset, load_model  # noqa: E402
from evonnx.passes.analyze import analyze  # noqa: E402
from evonnx.passes.cost_model import calibrate, node_stats  # noqa: E402
from evonnx.passes.dependences import analyze_dependences  # noqa: E402
from evonnx.passes.lazy import naming  # noqa: E402
from evonnx.passes.lower_groups import lower_groups  # noqa: E402
from evonnx.passes.plan_search import plan_search  # noqa: E402
from evonnx.passes.rewrite import rewrite  # noqa: E402
from evonnx.verify import check_models  # noqa: E402

OPSET = 17
BATCH = 8
STAGES = ("load", "analyze", "deps", "stats", "plan", "lower", "rewrite", "codegen", "build", "check")


# -- synthetic graphs -------------------------------------------------------------------------------------
class _Builder:
    def __init__(self) -> None:
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.count = 0

    def name(self, prefix: str) -> str:
        self.count += 1
        return f"{prefix}{self.count}"

    def const(self, value: np.ndarray) -> str:
        n = self.name("c")
        self.inits.append(numpy_helper.from_array(np.asarray(value), n))
        return n

    def node(self, op: str, inputs: Sequence[str], **attrs: object) -> str:
        out = self.name("t")
        self.nodes.append(helper.make_node(op, list(inputs), [out], name=self.name("n"), **attrs))
        return out

    def model(self, inputs: Sequence[tuple[str, list[int]]], outputs: Sequence[str], label: str) -> onnx.ModelProto:
        g = helper.make_graph(self.nodes, label,
                              [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs],
                              [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs],
                              initializer=self.inits)
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=8)
        return onnx.shape_inference.infer_shapes(m, strict_mode=True)


def _elementwise(b: _Builder, x: str, k: int) -> str:
    """The k-th step of an elementwise chain; values stay bounded (no overflow along thousands of steps)."""
    step = k % 6
    if step == 0:
        return b.node("Add", [x, b.const(np.float32(0.25 + 0.01 * (k % 7)))])
    if step == 1:
        return b.node("Mul", [x, b.const(np.float32(0.9))])
    if step == 2:
        return b.node("Neg", [x])
    if step == 3:
        return b.node("Abs", [x])
    if step == 4:
        return b.node("Sigmoid", [x])
    return b.node("Sub", [x, b.const(np.float32(0.5))])


def chain(n: int) -> onnx.ModelProto:
    b = _Builder()
    t = "x"
    for k in range(n):
        t = _elementwise(b, t, k)
    return b.model([("x", [BATCH, 64])], [t], f"chain{n}")


def wide(n: int) -> onnx.ModelProto:
    b = _Builder()
    ends: list[str] = []
    for c in range(max(1, n // 4)):
        t = "x"
        for k in range(3):
            t = _elementwise(b, t, c + k)
        ends.append(t)
    outs = [b.node("Concat", ends[k:k + 16], axis=1) for k in range(0, len(ends), 16)]
    return b.model([("x", [BATCH, 64])], outs, f"wide{n}")


def mixed(n: int) -> onnx.ModelProto:
    b = _Builder()
    axes = b.const(np.array([1], np.int64))
    prev: str | None = None
    parts: list[str] = []
    outs: list[str] = []
    k = 0
    while len(b.nodes) < n:
        lo = (4 * k) % 80
        s = b.node("Slice", ["x", b.const(np.array([lo], np.int64)), b.const(np.array([lo + 4], np.int64)), axes])
        t = b.node("Transpose", [s], perm=[0, 2, 1])  # [B, 64, 4]
        u = b.node("Sigmoid", [t])
        v = b.node("Mul", [u, b.const(np.full((1, 1, 4), 1.0 + 0.01 * (k % 5), np.float32))])
        w = b.node("Add", [v, prev]) if prev is not None else v
        prev = b.node("Mul", [w, b.const(np.float32(0.5))])  # keeps the running sum bounded
        if k % 8 == 7:
            parts.append(b.node("Reshape", [prev, b.const(np.array([BATCH, 256], np.int64))]))
        if len(parts) == 16:
            outs.append(b.node("Concat", parts, axis=1))
            parts = []
        k += 1
    outs.append(b.node("Concat", parts, axis=1) if parts else prev)  # type: ignore[arg-type]
    return b.model([("x", [BATCH, 85, 64])], outs, f"mixed{n}")


SHAPES: dict[str, Callable[[int], onnx.ModelProto]] = {"chain": chain, "wide": wide, "mixed": mixed}


# -- the passes, as evonnx.optimize runs them -------------------------------------------------------------
def run_stages(src: Path, work: Path) -> tuple[dict[str, float], int, int]:
    """Seconds per stage, the node count, and the number of kernels."""
    t: dict[str, float] = {}

    def lap(stage: str, t0: float) -> float:
        now = time.perf_counter()
        t[stage] = now - t0
        return now

    dst = work / "out.onnx"
    lib = library_path(dst)
    t0 = time.perf_counter()
    original = load_model(src)
    t0 = lap("load", t0)
    with naming():  # tables and variables numbered as in a pipeline run
        g = gs.import_onnx(original)
        g.toposort()
        an = analyze(g, default_opset(original))
        t0 = lap("analyze", t0)
        deps = analyze_dependences(g, an)
        t0 = lap("deps", t0)
        stats = node_stats(g, an, {})
        cm = calibrate()
        t0 = lap("stats", t0)
        plan = plan_search(g, an, deps, stats, cm)
        t0 = lap("plan", t0)
        specs, _ = lower_groups(g, plan, an)
        t0 = lap("lower", t0)
    optimized = rewrite(g, specs, an)
    out_model = gs.export_onnx(optimized)
    out_model.ir_version = original.ir_version
    del out_model.opset_import[:]
    out_model.opset_import.extend(o for o in original.opset_import if o.domain != DOMAIN)
    out_model.opset_import.append(helper.make_opsetid(DOMAIN, 1))
    onnx.save(out_model, str(dst))
    t0 = lap("rewrite", t0)
    source = generate_source(specs, dst.name)
    t0 = lap("codegen", t0)
    build_model_library(source, lib, model_name=dst.name)
    t0 = lap("build", t0)
    check_models(original, dst, lib, _exact_outputs(out_model, specs))
    lap("check", t0)
    return t, len(original.graph.node), len(specs)


def machine_line() -> str:
    import onnxruntime as ort

    cpu = platform.processor() or platform.machine()
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                   if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    date = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    return (f"# {date}; {cpu}, {os.cpu_count()} cores; onnxruntime {ort.__version__}, python "
            f"{platform.python_version()}; command: {' '.join(['benchmarks/plan_scaling.py', *sys.argv[1:]])}")


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", default="chain,wide,mixed", help=f"comma-separated, of {','.join(SHAPES)}")
    p.add_argument("--sizes", default="250,500,1000,2000,5000", help="node counts N")
    p.add_argument("--e2e", action="store_true", help="also time one whole evonnx.optimize call per row")
    p.add_argument("--profile", metavar="DIR", help="write a cProfile of each row's passes to DIR/<shape><N>.prof")
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "plan_scaling.txt"),
                   help="where the table is written ('-': nowhere)")
    args = p.parse_args(argv)
    cols = [*STAGES, "total"] + (["e2e"] if args.e2e else [])
    lines = [machine_line(),
             "| shape | N nodes | kernels | " + " | ".join(cols) + " |",
             "|---|---|---|" + "---|" * len(cols)]
    print("\n".join(lines), flush=True)
    for shape in args.shapes.split(","):
        for n in (int(s) for s in args.sizes.split(",")):
            with tempfile.TemporaryDirectory(prefix="evonnx-scaling-") as d:
                work = Path(d)
                src = work / f"{shape}{n}.onnx"
                onnx.save(SHAPES[shape](n), str(src))
                prof = cProfile.Profile() if args.profile else None
                if prof is not None:
                    prof.enable()
                times, nodes, kernels = run_stages(src, work)
                if prof is not None:
                    prof.disable()
                    Path(args.profile).mkdir(parents=True, exist_ok=True)
                    prof.dump_stats(str(Path(args.profile) / f"{shape}{n}.prof"))
                times["total"] = sum(times[s] for s in STAGES)
                if args.e2e:
                    t0 = time.perf_counter()
                    evonnx.optimize(src, work / "e2e.onnx")
                    times["e2e"] = time.perf_counter() - t0
            row = f"| {shape} | {nodes} | {kernels} | " + " | ".join(f"{times[c]:.2f}" for c in cols) + " |"
            lines.append(row)
            print(row, flush=True)
    if args.out != "-":
        Path(args.out).write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
