"""Two optimized builds of one model timed in one process (a developer's A/B of a kernel change).

    .venv/bin/python benchmarks/ab_builds.py ORIGINAL.onnx A.opt.onnx B.opt.onnx [--dim N=1] [--rounds 30]

A and B are `evonnx optimize` outputs of the same model by two versions of evonnx (each beside its library). On
this project's development machine, timings of one build move by up to 2x between processes (the same kernel 3.4
to 6.0 ms), and ratios against onnxruntime by 10-30 % (the strided kernels more than onnxruntime's streaming
ones): a comparison of two builds in two processes does not settle a few percent. Both libraries cannot be loaded
in one process as built (the same custom-op domain, and kernel names from the same plan), so B's model and library
are copied with their domain and kernel names renamed (same length, so the protobuf and the library stay valid);
then A, B and onnxruntime on the original run in interleaved rounds of 10 runs, and the medians of the per-round
ratios are printed. The outputs of A and B are compared first (within 1e-3 relative).

This is a benchmark, not a test: nothing asserts on time.
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

import evonnx
from evonnx.verify import make_inputs

DOMAIN, RENAMED = b"ai.evonnx", b"ai.evonnq"


def renamed_copy(model: Path, folder: Path) -> Path:
    """`model` and its library copied into `folder` with the custom-op domain and kernel names renamed."""
    data, lib = model.read_bytes(), evonnx.library_path(model).read_bytes()
    for name in set(re.findall(rb"evo\d+_[0-9a-f]{8}", data)):
        new = b"evq" + name[3:]
        data, lib = data.replace(name, new), lib.replace(name, new)
    data, lib = data.replace(DOMAIN, RENAMED), lib.replace(DOMAIN, RENAMED)
    out = folder / "b.opt.onnx"
    out.write_bytes(data)
    evonnx.library_path(out).write_bytes(lib)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("original", type=Path)
    ap.add_argument("a", type=Path)
    ap.add_argument("b", type=Path)
    ap.add_argument("--dim", action="append", default=[], metavar="SYM=N", help="size of a symbolic dim")
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    sizes = {k: int(v) for k, v in (d.split("=", 1) for d in args.dim)}
    feeds = make_inputs(onnx.load(str(args.original)), sizes or {"batch": 1}, 0)
    so = ort.SessionOptions()
    so.intra_op_num_threads = args.threads
    with tempfile.TemporaryDirectory(prefix="evonnx-ab-") as tmp:
        sess = {"A": evonnx.load_session(args.a, sess_options=so),
                "B": evonnx.load_session(renamed_copy(args.b, Path(tmp)), sess_options=so),
                "ort": ort.InferenceSession(str(args.original), so, providers=["CPUExecutionProvider"])}
        for x, y in zip(sess["A"].run(None, feeds), sess["B"].run(None, feeds), strict=True):
            if not np.allclose(x, y, rtol=1e-3, atol=1e-3, equal_nan=True):
                print("A and B give different outputs", file=sys.stderr)
                return 1
        times: dict[str, list[float]] = {k: [] for k in sess}
        for _ in range(args.rounds):
            for k, s in sess.items():
                t0 = time.perf_counter()
                for _ in range(10):
                    s.run(None, feeds)
                times[k].append((time.perf_counter() - t0) / 10 * 1e6)
    t = {k: np.array(v) for k, v in times.items()}
    print(f"median us: A {np.median(t['A']):.1f}, B {np.median(t['B']):.1f}, onnxruntime {np.median(t['ort']):.1f}; "
          f"ratio to onnxruntime: A {np.median(t['ort'] / t['A']):.3f}, B {np.median(t['ort'] / t['B']):.3f}; "
          f"B/A time {np.median(t['B'] / t['A']):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
