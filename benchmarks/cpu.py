"""CPU benchmark: evonnx-optimized models against onnxruntime on the originals, in one run.

    .venv/bin/python benchmarks/cpu.py                       # every manifest model, 1 and 2 threads
    .venv/bin/python benchmarks/cpu.py --models yolo_decode,delta2bbox --threads 1 --json out.json
    .venv/bin/python benchmarks/cpu.py --half --threads 1    # the float16 versions (models/fp16/)

See benchmarks/README.md for what is measured and what each column means.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from inputs import MANIFEST, REPO, half_feeds, largest_case, load_manifest, make_inputs  # noqa: E402

sys.path.insert(0, str(REPO))
from evonnx.measure import (  # noqa: E402
    MIN_RUNS,
    MeasureError,
    Runner,
    cpu_model,
    cpu_snapshot,
    geomean,
    interleaved,
    median_ns,
    other_load,
    runs_for,
    session_options,
    stats,
    warm_up,
)

NOISY_LOAD = 0.25  # cores used by other processes above which a row is marked noisy
COPY_MIN_BYTES = 256 * 1024  # the numpy copy is timed on at least this many bytes per side (see README)


class BenchError(MeasureError):
    """A model could not be benchmarked: optimization failed or outputs differ."""


# ---------------------------------------------------------------------------------------------------------
# statistics
# ---------------------------------------------------------------------------------------------------------
# ---------------------------------------------------------------------------------------------------------
# onnxruntime sessions and the timed call
# ---------------------------------------------------------------------------------------------------------
def compare(model: str, ref: Mapping[str, np.ndarray], got: Mapping[str, np.ndarray], what: str) -> float:
    """allclose with evonnx's own check tolerances (evonnx.verify); exact for int/bool. Returns max abs diff."""
    from evonnx.verify import ATOL_SCALE, RTOL

    worst = 0.0
    for name, r in ref.items():
        if name not in got:
            raise BenchError(f"{model}: {what}: output {name!r} missing")
        g = got[name]
        if r.shape != g.shape or r.dtype != g.dtype:
            raise BenchError(f"{model}: {what}: output {name!r} is {g.dtype}{list(g.shape)}, "
                             f"expected {r.dtype}{list(r.shape)}")
        if r.dtype.kind not in "fc":
            if not np.array_equal(r, g):
                raise BenchError(f"{model}: {what}: output {name!r} differs at {int(np.sum(r != g))} positions")
            continue
        finite = np.isfinite(r)
        scale = float(np.max(np.abs(r[finite]))) if finite.any() else 1.0
        atol = ATOL_SCALE.get(str(r.dtype), 1e-3) * max(1.0, scale)
        rtol = RTOL.get(str(r.dtype), 1e-3)
        ok = np.isclose(g, r, rtol=rtol, atol=atol, equal_nan=True)
        if not ok.all():
            i = tuple(int(x) for x in np.argwhere(~ok)[0])
            raise BenchError(f"{model}: {what}: output {name!r} differs beyond rtol {rtol} atol {atol:.3g} at "
                             f"{int((~ok).sum())} positions, first {list(i)}: {g[i]!r} vs {r[i]!r}")
        both = finite & np.isfinite(g)
        if both.any():
            worst = max(worst, float(np.max(np.abs(g[both].astype(np.float64) - r[both]))))
    return worst


# ---------------------------------------------------------------------------------------------------------
# floors
# ---------------------------------------------------------------------------------------------------------
def copy_floor(io_bytes: int, seconds: float) -> dict[str, Any]:
    """Bandwidth floor: numpy copy of a buffer whose read + write traffic equals the model's I/O bytes."""
    side = max(COPY_MIN_BYTES, -(-io_bytes // 2 // 64) * 64)
    src = np.ones(side // 4, dtype=np.float32)
    dst = np.empty_like(src)
    tiny_s, tiny_d = np.ones(1, np.float32), np.empty(1, np.float32)
    for _ in range(20):
        np.copyto(dst, src)
        np.negative(src, out=dst)
    est = median_ns(lambda: np.copyto(dst, src), 20)
    runs = runs_for(est, seconds / 2)
    overhead = min(median_ns(lambda: np.copyto(tiny_d, tiny_s), 2000),
                   median_ns(lambda: np.negative(tiny_s, out=tiny_d), 2000))
    t_copy = median_ns(lambda: np.copyto(dst, src), runs)
    t_neg = median_ns(lambda: np.negative(src, out=dst), runs)
    t = max(min(t_copy, t_neg) - overhead, 1.0)
    bw = 2 * side / t  # bytes per ns = GB/s
    return {"floor_us": io_bytes / bw / 1e3, "bandwidth_GBps": bw, "buffer_bytes_per_side": side,
            "copyto_us": t_copy / 1e3, "negative_us": t_neg / 1e3, "numpy_call_overhead_us": overhead / 1e3,
            "runs": runs}


def one_node_model(io_bytes: int) -> tuple[bytes, int]:
    """A one-node model, Neg on float32[n], whose input + output bytes equal the model's I/O bytes."""
    import onnx
    from onnx import TensorProto, helper

    n = max(1, -(-io_bytes // 8))
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [n])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [n])
    graph = helper.make_graph([helper.make_node("Neg", ["x"], ["y"])], "copy_floor", [x], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model.SerializeToString(), n


# ---------------------------------------------------------------------------------------------------------
# one model
# ---------------------------------------------------------------------------------------------------------
def bench_model(entry: Mapping[str, Any], args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    import onnxruntime as ort

    import evonnx

    name = entry["name"]
    cases = entry["checked_cases"]
    case = largest_case(entry) if args.case is None else min(args.case, len(cases) - 1)
    shapes = {k: list(v) for k, v in cases[case].items()}
    rec: dict[str, Any] = {"name": name, "writes": bool(entry.get("writes")), "case": case,
                           "case_clamped": args.case is not None and args.case != case, "shapes": shapes}
    src = REPO / "models" / ("fp16" if args.half else "") / entry["file"]
    dst = workdir / f"{name}.opt.onnx"
    dump = Path(args.dump_dir) / name if args.dump_dir else None
    try:
        res = evonnx.optimize(src, dst, shapes=shapes, dump_dir=dump)
    except Exception as e:  # noqa: BLE001 - report any failure of the optimizer as a failed row
        raise BenchError(f"{name}: optimize failed: {type(e).__name__}: {e}") from e
    rec.update(nodes_before=res.nodes_before, nodes_after=res.nodes_after, kernels=len(res.kernels),
               absorbed_nodes=sum(len(k.source_ops) for k in res.kernels), optimize_s=res.seconds,
               check=str(res.check))

    feeds = make_inputs(entry, shapes, seed=args.seed)
    if args.half:
        feeds = half_feeds(feeds)
    feeds_copy = {k: v.copy() for k, v in feeds.items()}
    ort_inputs = {k: ort.OrtValue.ortvalue_from_numpy(v) for k, v in feeds.items()}
    ref_sess = ort.InferenceSession(str(src), session_options(1), providers=["CPUExecutionProvider"])
    ref = dict(zip([o.name for o in ref_sess.get_outputs()], ref_sess.run(None, feeds), strict=True))
    del ref_sess
    in_bytes = sum(v.nbytes for v in feeds.values())
    out_bytes = sum(v.nbytes for v in ref.values())
    rec.update(input_bytes=in_bytes, output_bytes=out_bytes)
    rec["floor"] = copy_floor(in_bytes + out_bytes, args.seconds / 4)
    node_bytes, node_n = one_node_model(in_bytes + out_bytes)
    node_in = np.ones(node_n, np.float32)
    node_feeds = {"x": node_in}
    node_ort = {"x": ort.OrtValue.ortvalue_from_numpy(node_in)}
    node_tmpl = {"y": np.empty(node_n, np.float32)}

    rec["threads"] = []
    for threads in args.threads:
        orig = Runner("onnxruntime", ort.InferenceSession(str(src), session_options(threads, args.spin),
                                                          providers=["CPUExecutionProvider"]),
                      feeds, ort_inputs, ref, args.api)
        opt = Runner("evonnx", evonnx.load_session(dst, sess_options=session_options(threads, args.spin)),
                     feeds, ort_inputs, ref, args.api)
        node = Runner("1-node", ort.InferenceSession(node_bytes, session_options(threads, args.spin),
                                                     providers=["CPUExecutionProvider"]),
                      node_feeds, node_ort, node_tmpl, args.api)
        # correctness before timing, through the plain API and through the timed path
        compare(name, ref, dict(zip(opt.out_names, opt.sess.run(None, feeds), strict=True)),
                f"{threads} thread(s), sess.run")
        compare(name, ref, orig.outputs(), f"{threads} thread(s), onnxruntime, timed path")
        max_abs = compare(name, ref, opt.outputs(), f"{threads} thread(s), evonnx, timed path")

        est = [warm_up(r, 0.2) for r in (orig, opt, node)]
        if args.repeat:
            repeats = [args.repeat, args.repeat, args.repeat]
        else:
            repeats = [runs_for(est[0], args.seconds), runs_for(est[1], args.seconds),
                       runs_for(est[2], args.seconds / 3)]
        snap = cpu_snapshot()
        times = interleaved([orig, opt, node], repeats, args.rounds)
        load = other_load(snap, cpu_snapshot())
        s_orig, s_opt, s_node = (stats(t) for t in times)

        # nothing the timing did may have changed the inputs or the results
        for k, v in feeds.items():
            if not np.array_equal(v, feeds_copy[k], equal_nan=v.dtype.kind == "f"):
                raise BenchError(f"{name}: input {k!r} was modified while timing")
        compare(name, ref, opt.outputs(), f"{threads} thread(s), evonnx, after timing")
        floor_us = rec["floor"]["floor_us"]
        rec["threads"].append({
            "threads": threads, "onnxruntime": s_orig, "evonnx": s_opt, "one_node": s_node,
            "speedup": s_orig["median_us"] / s_opt["median_us"],
            "evonnx_over_floor": s_opt["median_us"] / floor_us,
            "evonnx_over_one_node": s_opt["median_us"] / s_node["median_us"],
            "max_abs_diff": max_abs, "other_load_cores": load,
        })
        del orig, opt, node
        gc.collect()  # free the sessions (and their thread pools) before the next ones start
    return rec


# ---------------------------------------------------------------------------------------------------------
# report
# ---------------------------------------------------------------------------------------------------------
def fmt_us(x: float) -> str:
    return f"{x:.1f}" if x < 1000 else f"{x:.0f}"


def fmt_small(x: float) -> str:
    return f"{x:.3g}" if x < 100 else f"{x:.0f}"


def fmt_load(x: float | None) -> str:
    return "?" if x is None else f"{x:.2f}" + ("*" if x > NOISY_LOAD else "")


def fmt_stat(s: Mapping[str, float]) -> str:
    return f"{fmt_us(s['median_us'])} ({fmt_us(s['p10_us'])}-{fmt_us(s['p90_us'])})"


COLUMNS = ["model", "nodes", "kern", "opt s", "thr", "ORT µs (p10-p90)", "evonnx µs (p10-p90)", "speedup",
           "floor µs", "evonnx/floor", "1-node µs", "evonnx/1-node", "other"]


def table_rows(results: Sequence[Mapping[str, Any]]) -> list[list[str]]:
    rows = []
    for r in results:
        label = r["name"] + (" [w]" if r["writes"] else "")
        if "error" in r:
            rows.append([label, "FAILED: " + r["error"].splitlines()[0][:200]])
            continue
        for t in r["threads"]:
            rows.append([label, f"{r['nodes_before']}→{r['nodes_after']}", str(r["kernels"]),
                         f"{r['optimize_s']:.1f}", str(t["threads"]), fmt_stat(t["onnxruntime"]),
                         fmt_stat(t["evonnx"]), f"{t['speedup']:.2f}x", fmt_small(r["floor"]["floor_us"]),
                         fmt_small(t["evonnx_over_floor"]), fmt_us(t["one_node"]["median_us"]),
                         f"{t['evonnx_over_one_node']:.2f}", fmt_load(t["other_load_cores"])])
    return rows


def render(rows: Sequence[Sequence[str]]) -> str:
    full = [r for r in rows if len(r) == len(COLUMNS)]
    widths = [max(len(COLUMNS[i]), *(len(r[i]) for r in full)) if full else len(COLUMNS[i])
              for i in range(len(COLUMNS))]
    right = set(range(1, len(COLUMNS)))

    def line(cells: Sequence[str]) -> str:
        if len(cells) != len(COLUMNS):
            return "| " + " | ".join(cells) + " |"
        return "| " + " | ".join(c.rjust(w) if i in right else c.ljust(w)
                                 for i, (c, w) in enumerate(zip(cells, widths, strict=True))) + " |"

    sep = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    return "\n".join([line(COLUMNS), sep, *(line(r) for r in rows)])


def summary(results: Sequence[Mapping[str, Any]], threads: Sequence[int]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    ok = [r for r in results if "error" not in r]
    for th in threads:
        for subset, pick in (("all", lambda r: True), ("no_writes", lambda r: not r["writes"])):
            sp = [t["speedup"] for r in ok if pick(r) for t in r["threads"] if t["threads"] == th]
            fl = [t["evonnx_over_floor"] for r in ok if pick(r) for t in r["threads"] if t["threads"] == th]
            out[f"{th}t_{subset}"] = {"models": len(sp), "geomean_speedup": geomean(sp),
                                      "geomean_evonnx_over_floor": geomean(fl)}
    return out


def machine_info() -> dict[str, Any]:
    import onnxruntime as ort

    cpu = cpu_model()
    try:
        rev = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, check=True).stdout.strip()
        rev += " (uncommitted changes)" if dirty else ""
    except (OSError, subprocess.CalledProcessError):
        rev = "unknown"
    return {"cpu": cpu, "cores": os.cpu_count(), "python": platform.python_version(),
            "onnxruntime": ort.__version__, "numpy": np.__version__, "evonnx_commit": rev,
            "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")}


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", help="comma-separated manifest names (default: all, in manifest order)")
    p.add_argument("--threads", default="1,2", help="intra-op thread counts (default 1,2)")
    p.add_argument("--repeat", type=int, default=0,
                   help="timed runs per measurement for every session (default: enough for ~--seconds, >= 50)")
    p.add_argument("--seconds", type=float, default=1.5,
                   help="target time of one measurement when --repeat is not given (default 1.5)")
    p.add_argument("--rounds", type=int, default=10, help="interleaved rounds per measurement (default 10)")
    p.add_argument("--case", type=int, default=None,
                   help="index into each model's checked_cases, clamped to its last (default: the largest case)")
    p.add_argument("--api", choices=("iobinding", "run"), default="iobinding",
                   help="timed call: run_with_iobinding with preallocated outputs (default) or sess.run")
    p.add_argument("--no-spin", dest="spin", action="store_false",
                   help="set session.intra_op.allow_spinning=0 on every session (default: onnxruntime's, spinning)")
    p.add_argument("--seed", type=int, default=0, help="input seed (default 0)")
    p.add_argument("--half", action="store_true",
                   help="the float16 versions in models/fp16/ (models/fp16.py), float inputs in float16")
    p.add_argument("--json", help="write all numbers here")
    p.add_argument("--plot", help="also write a PNG of each model's time over its floor here (benchmarks/plot.py)")
    p.add_argument("--dump-dir", help="also write each model's plan.txt / kernels.c under DIR/<model>/")
    p.add_argument("--manifest", default=str(MANIFEST), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.threads = [int(t) for t in args.threads.split(",") if t.strip()]
    if not args.threads or min(args.threads) < 1:
        p.error("--threads: give positive integers, e.g. 1,2")
    if args.repeat < 0 or args.rounds < 1 or args.seconds <= 0:
        p.error("--repeat, --rounds and --seconds must be positive")
    if args.case is not None and args.case < 0:
        p.error("--case must be >= 0")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.plot:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            print("benchmarks/cpu.py: --plot needs matplotlib (pip install 'evonnx[plot]')", file=sys.stderr)
            return 2
    manifest = load_manifest(args.manifest)
    names = list(manifest) if not args.models else [m.strip() for m in args.models.split(",") if m.strip()]
    unknown = [n for n in names if n not in manifest]
    if unknown:
        print(f"unknown model(s) {unknown}; the manifest has: {', '.join(manifest)}", file=sys.stderr)
        return 2
    info = machine_info()
    cmd = " ".join([Path(sys.executable).name, *sys.argv]) if argv is None else "main(" + " ".join(argv) + ")"
    head = (f"evonnx CPU benchmark, {info['date']}: {info['cpu']}, {info['cores']} cores; onnxruntime "
            f"{info['onnxruntime']}, numpy {info['numpy']}, python {info['python']}; evonnx {info['evonnx_commit']}\n"
            f"command: {cmd}\n"
            f"{'float16 versions (models/fp16/); ' if args.half else ''}"
            f"CPU EP, ORT_ENABLE_ALL, sequential, inter-op 1; timed call: {args.api}; "
            f"case: {'largest checked case' if args.case is None else f'checked_cases[{args.case}]'}; "
            f"{args.rounds} interleaved rounds; spinning {'on' if args.spin else 'off'}; repeat: "
            f"{args.repeat if args.repeat else f'~{args.seconds:g} s per measurement, >= {MIN_RUNS} runs'}")
    print(head, flush=True)
    t_start = time.perf_counter()
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="evonnx-bench-") as tmp:
        for n in names:
            t0 = time.perf_counter()
            try:
                rec = bench_model(manifest[n], args, Path(tmp))
            except BenchError as e:
                rec = {"name": n, "writes": bool(manifest[n].get("writes")), "error": str(e)}
                print(f"\n!!! {n}: FAILED: {e}\n", file=sys.stderr, flush=True)
            rec["bench_s"] = time.perf_counter() - t0
            results.append(rec)
            if "error" not in rec:
                brief = "; ".join(f"{t['threads']}t {fmt_us(t['onnxruntime']['median_us'])} -> "
                                  f"{fmt_us(t['evonnx']['median_us'])} µs ({t['speedup']:.2f}x)"
                                  for t in rec["threads"])
                print(f"  {n}: {brief}  [{rec['bench_s']:.0f} s]", file=sys.stderr, flush=True)
    total = time.perf_counter() - t_start
    summ = summary(results, args.threads)
    print(flush=True)
    print(render(table_rows(results)))
    print()
    for th in args.threads:
        a, w = summ[f"{th}t_all"], summ[f"{th}t_no_writes"]
        print(f"geomean speedup, {th} thread(s): {a['geomean_speedup']:.2f}x over {a['models']} models; "
              f"{w['geomean_speedup']:.2f}x over {w['models']} without writes; "
              f"geomean evonnx/floor {a['geomean_evonnx_over_floor']:.1f}")
    noisy = sum(1 for r in results for t in r.get("threads", [])
                if t["other_load_cores"] is not None and t["other_load_cores"] > NOISY_LOAD)
    if noisy:
        print(f"{noisy} row(s) marked * ran while other processes kept more than {NOISY_LOAD} cores busy: "
              "treat their timings as noisy.")
    failed = [r["name"] for r in results if "error" in r]
    print(f"[w] = writes (ScatterND). total {total:.0f} s." + (f" FAILED: {', '.join(failed)}" if failed else ""))
    if args.json:
        Path(args.json).write_text(json.dumps({"meta": {**info, "command": cmd, "args": {
            k: v for k, v in vars(args).items() if k != "manifest"}, "total_s": total},
            "summary": summ, "models": results}, indent=1))
        print(f"wrote {args.json}")
    if args.plot:
        from plot import write_plot

        write_plot({"models": results}, None, Path(args.plot),
                   f"evonnx {info['evonnx_commit']}, {info['cpu']}, {info['cores']} cores, onnxruntime "
                   f"{info['onnxruntime']}, {info['date'][:10]}")
        print(f"wrote {args.plot}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
