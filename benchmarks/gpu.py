"""GPU benchmark: evonnx-optimized models (library built for CUDA) against the originals, both on onnxruntime's
CUDA execution provider, in one run.

    .venv/bin/python benchmarks/gpu.py                            # every manifest model, its largest checked case
    .venv/bin/python benchmarks/gpu.py --models yolo_decode,delta2bbox --runs 2000 --json gpu.json

What is measured, per model:
- Inputs are uploaded once and bound on the device (IOBinding); outputs are bound to device memory, so no host
  copy is timed. A timed call is `run_with_iobinding` followed by `synchronize_outputs`: onnxruntime synchronises
  the CUDA stream at the end of Run (its default), and the explicit sync makes sure, so each sample is the
  latency to finished outputs.
- original and optimized are timed in alternating rounds in the same process; reported are medians, p10/p90 and
  the ratio original / optimized of the medians (> 1: evonnx is faster).
- Bandwidth floor: a one-node model (Neg on float32[n]) whose read + write bytes equal the model's input + output
  bytes, on the same provider and timed the same way. That is one device pass over the data plus onnxruntime's
  per-Run cost: no fused model can beat it by much. `floor_us` is its median.
- Outputs of both are compared (verify's tolerances) before timing; a mismatch fails the model.

Needs a CUDA GPU, its driver, onnxruntime-gpu and nvcc; without one it stops at once and says which is missing.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cpu import one_node_model  # noqa: E402  (the same one-node floor model as the CPU benchmark)
from inputs import REPO, largest_case, load_manifest, make_inputs  # noqa: E402

CUDA = "CUDAExecutionProvider"


class BenchError(RuntimeError):
    """A model could not be benchmarked."""


def optimize_for_cuda(src: Path, dst: Path, shapes: dict[str, list[int]]) -> tuple[Path, Any]:
    """`evonnx optimize` (checked on CPU), then the library rebuilt with the CUDA kernels embedded."""
    from evonnx.api import library_path, optimize
    from evonnx.kernels.build import build_model_library
    from evonnx.kernels.codegen_c import generate
    from evonnx.kernels.codegen_cuda import generate_cuda, generate_cuda_host

    res = optimize(src, dst, shapes=shapes)
    lib = library_path(dst)
    build_model_library(generate(res.kernels, dst.name) + generate_cuda_host(res.kernels), lib,
                        model_name=dst.name, cuda_source=generate_cuda(res.kernels, dst.name))
    return lib, res


def session(model: Path | bytes, library: Path | None = None):  # noqa: ANN201
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    if library is not None:
        so.register_custom_ops_library(str(library))
    return ort.InferenceSession(model if isinstance(model, bytes) else str(model), so,
                                providers=[(CUDA, {"device_id": 0}), "CPUExecutionProvider"])


class Bound:
    """A session with device inputs and device outputs bound once; `__call__` is one timed inference."""

    def __init__(self, sess: Any, feeds: dict[str, np.ndarray]):
        import onnxruntime as ort

        self.sess = sess
        self.io = sess.io_binding()
        self.inputs = {k: ort.OrtValue.ortvalue_from_numpy(v, "cuda", 0) for k, v in feeds.items()}
        for k, v in self.inputs.items():
            self.io.bind_ortvalue_input(k, v)
        for o in sess.get_outputs():
            self.io.bind_output(o.name, "cuda", 0)

    def __call__(self) -> None:
        self.sess.run_with_iobinding(self.io)
        self.io.synchronize_outputs()

    def outputs(self) -> list[np.ndarray]:
        self()
        return [np.asarray(v) for v in self.io.copy_outputs_to_cpu()]


def samples(fn: Callable[[], None], runs: int) -> list[int]:
    out = []
    clock = time.perf_counter_ns
    for _ in range(runs):
        t0 = clock()
        fn()
        out.append(clock() - t0)
    return out


def stats(ns: Sequence[int]) -> dict[str, float]:
    a = np.asarray(ns, dtype=np.float64) / 1e3
    p10, p50, p90 = np.percentile(a, [10, 50, 90])
    return {"median_us": float(p50), "p10_us": float(p10), "p90_us": float(p90), "runs": int(a.size)}


def bench_model(entry: dict[str, Any], args: argparse.Namespace, work: Path) -> dict[str, Any]:
    import onnx

    from evonnx.api import _exact_outputs
    from evonnx.errors import VerificationError
    from evonnx.verify import CheckResult, _compare

    name = entry["name"]
    shapes = {k: list(v) for k, v in entry["checked_cases"][largest_case(entry)].items()}
    src = REPO / "models" / entry["file"]
    dst = work / f"{name}.opt.onnx"
    try:
        lib, res = optimize_for_cuda(src, dst, shapes)
    except Exception as e:  # noqa: BLE001 - a failed optimization is a failed row
        raise BenchError(f"{name}: optimize for CUDA failed: {type(e).__name__}: {e}") from e
    feeds = make_inputs(entry, shapes, seed=args.seed)
    orig = Bound(session(src), feeds)
    opt = Bound(session(dst, lib), feeds)
    ref, got = orig.outputs(), opt.outputs()
    exact = _exact_outputs(onnx.load(str(dst)), res.kernels)
    check = CheckResult()
    try:
        for o, r, g in zip(orig.sess.get_outputs(), ref, got, strict=True):
            _compare(o.name, r, g, o.name in exact, check)
    except VerificationError as e:
        raise BenchError(f"{name}: optimized outputs differ on CUDA: {e}") from e
    io_bytes = sum(v.nbytes for v in feeds.values()) + sum(r.nbytes for r in ref)
    floor_bytes, floor_n = one_node_model(io_bytes)
    floor = Bound(session(floor_bytes), {"x": np.ones(floor_n, np.float32)})

    for fn in (orig, opt, floor):  # warm up: kernel loading, arena growth, cuDNN-free but lazy module loads
        samples(fn, args.warmup)
    t_orig: list[int] = []
    t_opt: list[int] = []
    t_floor: list[int] = []
    per_round = max(1, args.runs // args.rounds)
    for _ in range(args.rounds):  # alternate, so clock or thermal drift hits both alike
        t_orig += samples(orig, per_round)
        t_opt += samples(opt, per_round)
        t_floor += samples(floor, per_round)
    so, sp, sf = stats(t_orig), stats(t_opt), stats(t_floor)
    return {"name": name, "shapes": shapes, "nodes_before": res.nodes_before, "nodes_after": res.nodes_after,
            "kernels": len(res.kernels), "io_bytes": io_bytes, "original": so, "optimized": sp,
            "ratio": so["median_us"] / sp["median_us"], "floor_us": sf["median_us"], "check": str(check)}


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", help="comma-separated manifest names (default: all)")
    p.add_argument("--runs", type=int, default=1000, help="timed runs per variant (default 1000)")
    p.add_argument("--rounds", type=int, default=10, help="alternating rounds the runs are split into")
    p.add_argument("--warmup", type=int, default=50)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", help="write the results here")
    args = p.parse_args(argv)

    from evonnx.kernels.build import cuda_unavailable

    missing = cuda_unavailable()
    if missing is not None:
        print(f"benchmarks/gpu.py: cannot run: {missing}", file=sys.stderr)
        return 2
    import onnxruntime as ort

    manifest = load_manifest()
    names = args.models.split(",") if args.models else list(manifest)
    unknown = [n for n in names if n not in manifest]
    if unknown:
        print(f"unknown models {unknown}; the manifest has {list(manifest)}", file=sys.stderr)
        return 2
    results, failed = [], []
    with tempfile.TemporaryDirectory(prefix="evonnx-gpu-bench-") as tmp:
        for n in names:
            try:
                r = bench_model(manifest[n], args, Path(tmp))
            except BenchError as e:
                failed.append(str(e))
                print(f"FAILED {e}", file=sys.stderr)
                continue
            results.append(r)
            print(f"{n:24s} original {r['original']['median_us']:9.1f} us  optimized {r['optimized']['median_us']:9.1f}"
                  f" us  ratio {r['ratio']:5.2f}x  floor {r['floor_us']:8.1f} us  ({r['nodes_before']} -> "
                  f"{r['nodes_after']} nodes)", flush=True)
    if results:
        geo = float(np.exp(np.mean([np.log(r["ratio"]) for r in results])))
        print(f"geomean ratio (original / optimized): {geo:.2f}x over {len(results)} models")
    if args.json:
        Path(args.json).write_text(json.dumps({"onnxruntime": ort.__version__, "machine": platform.node(),
                                               "results": results, "failed": failed}, indent=2))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
