"""Planner benchmarks (issue 4): greedy vs search, planning time, and the cost model's ranking of plans.

    python benchmarks/planners.py compare [--models a,b]   # kernels and measured latency, greedy vs search
    python benchmarks/planners.py plan-time [--nodes 5000]  # planning time of a synthetic 5,000-node graph
    python benchmarks/planners.py ranking [--models a,b]   # estimated cost vs measured latency of candidate plans

Latencies: onnxruntime CPU EP, ORT_ENABLE_ALL, 1 intra-op thread, sequential, IO binding; the sessions being
compared are timed interleaved in rounds in the same process, and the median per session is reported. Sizes:
each model's largest checked case from models/manifest.json, inputs from its hints (benchmarks/inputs.py).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
import onnx_graphsurgeon as gs
import onnxruntime as ort

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.inputs import make_inputs  # noqa: E402
from evonnx.api import library_path  # noqa: E402
from evonnx.model import load_model  # noqa: E402
from evonnx.passes.cost_model import calibrate, node_stats  # noqa: E402
from evonnx.passes.pipeline import run_pipeline  # noqa: E402
from evonnx.passes.plan_fusion import _Graph, finish_plan  # noqa: E402
from evonnx.passes.plan_search import _Costing  # noqa: E402


def _manifest() -> dict[str, dict]:
    data = json.loads((ROOT / "models" / "manifest.json").read_text())
    return {m["name"]: m for m in data["models"]}


def _case(m: dict) -> dict[str, list[int]]:
    cases = m["checked_cases"]
    return max(cases, key=lambda c: sum(int(np.prod(v)) for v in c.values()))


def _session(path: Path, lib: Path | None) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    so.log_severity_level = 3
    if lib is not None:
        so.register_custom_ops_library(str(lib))
    return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])


def _time(sessions: list[ort.InferenceSession], feeds: dict[str, np.ndarray], rounds: int = 9,
          budget_s: float = 1.0) -> list[float]:
    """Median µs per session, measured interleaved in rounds."""
    bindings = []
    for s in sessions:
        b = s.io_binding()
        for k, v in feeds.items():
            b.bind_cpu_input(k, v)
        for o in s.get_outputs():
            b.bind_output(o.name)
        for _ in range(5):
            s.run_with_iobinding(b)
        bindings.append(b)
    samples: list[list[float]] = [[] for _ in sessions]
    for _ in range(rounds):
        for k, (s, b) in enumerate(zip(sessions, bindings)):
            end = time.perf_counter() + budget_s / rounds
            while time.perf_counter() < end or len(samples[k]) < 3:
                t0 = time.perf_counter_ns()
                s.run_with_iobinding(b)
                samples[k].append((time.perf_counter_ns() - t0) / 1e3)
    return [statistics.median(x) for x in samples]


def _build(model: onnx.ModelProto, sets: list[set[int]] | None, planner: str, out: Path,
           sizes: dict[str, int]) -> tuple[Path, int, float]:
    """Optimized model + library for a given plan (node-index sets) or planner; returns path, kernels, est µs."""
    from evonnx.kernels.build import build_model_library
    from evonnx.kernels.codegen_c import generate
    from evonnx.passes.lower_groups import lower_groups
    from evonnx.passes.rewrite import rewrite

    r = run_pipeline(model, planner=planner, sizes=sizes)
    gr = _Graph(r.graph, r.analysis)
    costing = _Costing(r.graph, r.analysis, gr, r.stats, r.cost_model)
    fusible = [i for i in range(len(gr.nodes)) if gr.fusible[i]]
    if sets is None:
        index = {n.name: i for i, n in enumerate(gr.nodes)}
        sets = [{index[x] for x in g.nodes} for g in r.plan.groups]
        plan, specs, optimized = r.plan, r.specs, r.optimized
    else:
        plan = finish_plan(gr, r.analysis, r.deps, sets, {})
        specs, _ = lower_groups(r.graph, plan, r.analysis)
        optimized = rewrite(r.graph, specs, r.analysis)
    m = gs.export_onnx(optimized)
    m.ir_version = model.ir_version
    del m.opset_import[:]
    m.opset_import.extend([o for o in model.opset_import if o.domain != "ai.evonnx"] +
                          [onnx.helper.make_opsetid("ai.evonnx", 1)])
    onnx.save(m, str(out))
    build_model_library(generate(specs, out.name), library_path(out), model_name=out.name)
    return out, len(specs), costing.plan([s for s in sets], fusible)


def compare(names: list[str]) -> None:
    man = _manifest()
    print("| model | greedy kernels | search kernels | greedy µs | search µs | search/greedy |")
    print("|---|---|---|---|---|---|")
    for name in names:
        m = man[name]
        case = _case(m)
        model = load_model(ROOT / "models" / m["file"])
        sizes = _sizes(model, case)
        with tempfile.TemporaryDirectory() as d:
            pg, kg, _ = _build(model, None, "greedy", Path(d) / "g.onnx", sizes)
            ps, ks, _ = _build(model, None, "search", Path(d) / "s.onnx", sizes)
            feeds = make_inputs(m, case, seed=0)
            tg, ts = _time([_session(pg, library_path(pg)), _session(ps, library_path(ps))], feeds)
        print(f"| {name} | {kg} | {ks} | {tg:.1f} | {ts:.1f} | {ts / tg:.2f} |", flush=True)


def _sizes(model: onnx.ModelProto, case: dict[str, list[int]]) -> dict[str, int]:
    out: dict[str, int] = {}
    for i in model.graph.input:
        for d, n in zip(i.type.tensor_type.shape.dim, case.get(i.name, [])):
            if d.HasField("dim_param"):
                out[d.dim_param] = int(n)
    return out


def plan_time(nodes: int) -> None:
    """Copies of the shipped models side by side in one graph until it has `nodes` nodes; times analysis and
    both planners on it (median of 3)."""
    from evonnx.passes.analyze import analyze
    from evonnx.passes.dependences import analyze_dependences
    from evonnx.passes.plan_fusion import plan_fusion
    from evonnx.passes.plan_search import plan_search

    man = _manifest()
    big = gs.Graph(opset=17)
    count = k = 0
    names = sorted(n for n in man if "dynamo" not in n)
    while count < nodes:
        name = names[k % len(names)]
        g = gs.import_onnx(load_model(ROOT / "models" / man[name]["file"]))
        for t in g.tensors().values():
            t.name = f"c{k}_{t.name}"
        for n in g.nodes:
            n.name = f"c{k}_{n.name}"
        big.nodes.extend(g.nodes)
        big.inputs.extend(g.inputs)
        big.outputs.extend(g.outputs)
        count += len(g.nodes)
        k += 1
    big.toposort()
    print(f"synthetic graph: {len(big.nodes)} nodes from {k} model copies")
    cm = calibrate()
    for label, fn in (("analyze", None), ("greedy", "greedy"), ("search", "search")):
        times = []
        for _ in range(3):
            t0 = time.perf_counter()
            an = analyze(big, 17)
            deps = analyze_dependences(big, an)
            t1 = time.perf_counter()
            if fn == "greedy":
                plan_fusion(big, an, deps)
            elif fn == "search":
                plan_search(big, an, deps, node_stats(big, an), cm)
            t2 = time.perf_counter()
            times.append(t1 - t0 if fn is None else t2 - t1)
        print(f"{label:8s}: median {statistics.median(times):.3f} s over 3 runs")


def ranking(names: list[str], variants: int, seed: int) -> None:
    """Candidate plans per model: the search plan, no fusion, and random splits of the search plan's groups at a
    point of their topological order (always legal). Counts the pairs the cost model orders like the timings."""
    man = _manifest()
    rng = random.Random(seed)
    agree = total = 0
    for name in names:
        m = man[name]
        case = _case(m)
        model = load_model(ROOT / "models" / m["file"])
        sizes = _sizes(model, case)
        r = run_pipeline(model, planner="search", sizes=sizes)
        index = {n.name: i for i, n in enumerate(r.graph.nodes)}
        base = [{index[x] for x in g.nodes} for g in r.plan.groups]
        cands: list[list[set[int]]] = [base, []]
        for _ in range(variants):
            sets = [set(s) for s in base]
            big = max(range(len(sets)), key=lambda j: len(sets[j])) if sets else None
            if big is None or len(sets[big]) < 4:
                break
            order = sorted(sets[big])
            cut = rng.randrange(1, len(order))
            sets[big:big + 1] = [set(order[:cut]), set(order[cut:])]
            cands.append(sets)
        with tempfile.TemporaryDirectory() as d:
            built = [_build(model, c, "search", Path(d) / f"v{j}.onnx", sizes) for j, c in enumerate(cands)]
            feeds = make_inputs(m, case, seed=0)
            measured = _time([_session(p, library_path(p)) for p, _, _ in built], feeds)
        est = [e for _, _, e in built]
        a = t = 0
        for i in range(len(cands)):
            for j in range(i + 1, len(cands)):
                if abs(measured[i] - measured[j]) < 0.03 * min(measured[i], measured[j]):
                    continue  # within noise: not a meaningful order
                t += 1
                a += (est[i] < est[j]) == (measured[i] < measured[j])
        agree += a
        total += t
        print(f"{name}: {len(cands)} plans, {a}/{t} pairs ordered alike; "
              f"estimated µs {[round(x, 1) for x in est]}, measured µs {[round(x, 1) for x in measured]}",
              flush=True)
    print(f"overall: {agree}/{total} pairs ordered alike ({100 * agree / max(total, 1):.0f}%)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("compare")
    c.add_argument("--models", default="")
    p = sub.add_parser("plan-time")
    p.add_argument("--nodes", type=int, default=5000)
    r = sub.add_parser("ranking")
    r.add_argument("--models", default="delta2bbox,yolo_decode,anchor_grid,valid_flags,bbox2delta")
    r.add_argument("--variants", type=int, default=4)
    r.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    names = [x for x in getattr(args, "models", "").split(",") if x] or sorted(_manifest())
    if args.cmd == "compare":
        compare(names)
    elif args.cmd == "plan-time":
        plan_time(args.nodes)
    else:
        ranking(names, args.variants, args.seed)


if __name__ == "__main__":
    main()
