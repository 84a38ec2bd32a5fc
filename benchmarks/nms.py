"""NonMaxSuppression benchmark (issue 14): onnxruntime's CPU NonMaxSuppression against evonnx's op, one node each,
timed in one interleaved run (`evonnx.measure.compare_models`, medians), on box sets shaped like the exports that
carry NMS in their graph. Every case is also compared row for row before it is timed.

    .venv/bin/python benchmarks/nms.py [--threads 1] [--seconds 1.0] [--out benchmarks/results/nms.txt]

Cases:
- torchvision batched NMS (SSDlite320, RetinaNet, FCOS): one class, the class-offset layout (each class's boxes
  moved by class * (max coordinate + 1)), 91 classes x 300 candidates, iou 0.55, max INT64_MAX, no score threshold;
- YOLO-style: 25,200 boxes x 80 classes (the issue's GPU size) with a score threshold of 0.25 and 0.001;
- dense: 10,000 random overlapping boxes in one class.
This is a benchmark, not a test: nothing asserts on time.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto as T
from onnx import helper

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import evonnx  # noqa: E402
from evonnx.api import library_path  # noqa: E402
from evonnx.measure import compare_models  # noqa: E402


def _model(path: Path) -> Path:
    inputs = [helper.make_tensor_value_info("boxes", T.FLOAT, ["B", "N", 4]),
              helper.make_tensor_value_info("scores", T.FLOAT, ["B", "C", "N"]),
              helper.make_tensor_value_info("max_output", T.INT64, [1]),
              helper.make_tensor_value_info("iou", T.FLOAT, [1]),
              helper.make_tensor_value_info("score", T.FLOAT, [1])]
    node = helper.make_node("NonMaxSuppression", [i.name for i in inputs], ["selected"], name="nms")
    graph = helper.make_graph([node], "nms", inputs, [helper.make_tensor_value_info("selected", T.INT64, ["K", 3])])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8), str(path))
    return path


def _boxes(rng: np.random.Generator, n: int, extent: float, size: float) -> np.ndarray:
    y, x = (rng.random((2, n), dtype=np.float32) * extent)
    h, w = (rng.random((2, n), dtype=np.float32) * size + 2)
    return np.stack([y, x, y + h, x + w], axis=-1).astype(np.float32)


def cases(rng: np.random.Generator) -> list[tuple[str, dict[str, np.ndarray]]]:
    out = []
    per, classes = 300, 91
    b = _boxes(rng, per * classes, 320, 120)
    offset = (np.repeat(np.arange(classes), per) * 321).astype(np.float32)[:, None]
    s = rng.random((1, 1, per * classes), dtype=np.float32)
    out.append(("torchvision batched NMS: 27,300 boxes, 91 classes offset, iou 0.55",
                {"boxes": (b + offset)[None], "scores": s, "max_output": np.array([2**63 - 1], np.int64),
                 "iou": np.array([0.55], np.float32), "score": np.array([-np.inf], np.float32)}))
    b = _boxes(rng, 25200, 640, 120)[None]
    s = (rng.random((1, 80, 25200), dtype=np.float32) ** 8).astype(np.float32)
    for threshold in (0.25, 0.001):
        out.append((f"YOLO: 25,200 boxes x 80 classes, score > {threshold}, iou 0.45, max 100",
                    {"boxes": b, "scores": s, "max_output": np.array([100], np.int64),
                     "iou": np.array([0.45], np.float32), "score": np.array([threshold], np.float32)}))
    out.append(("dense: 10,000 boxes in one class, iou 0.5",
                {"boxes": _boxes(rng, 10000, 640, 80)[None], "scores": rng.random((1, 1, 10000), dtype=np.float32),
                 "max_output": np.array([2**63 - 1], np.int64), "iou": np.array([0.5], np.float32),
                 "score": np.array([0.0], np.float32)}))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seconds", type=float, default=1.0)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    command = " ".join(argv if argv is not None else sys.argv[1:])
    lines = [f"# {datetime.datetime.now(datetime.UTC).isoformat(timespec='seconds')}; "
             f"{platform.machine()}, {len(os.sched_getaffinity(0))} cores; onnxruntime "
             f"{ort.__version__}; {args.threads} thread(s); command: benchmarks/nms.py {command}",
             "| case | rows | onnxruntime ms | evonnx ms | ratio (noise) |", "|---|---|---|---|---|"]
    with tempfile.TemporaryDirectory(prefix="evonnx-nms-bench-") as tmp:
        src = _model(Path(tmp) / "nms.onnx")
        dst = Path(tmp) / "nms.opt.onnx"
        evonnx.optimize(src, dst, guard=False)
        so = ort.SessionOptions()
        so.register_custom_ops_library(str(library_path(dst)))
        check = ort.InferenceSession(str(dst), so, providers=["CPUExecutionProvider"])
        ref = ort.InferenceSession(str(src), providers=["CPUExecutionProvider"])
        for name, feeds in cases(np.random.default_rng(0)):
            a, b = ref.run(None, feeds)[0], check.run(None, feeds)[0]
            if a.shape != b.shape or not np.array_equal(a, b):
                raise SystemExit(f"{name}: evonnx's rows differ from onnxruntime's")
            c = compare_models(src, dst, library_path(dst), feeds, threads=args.threads, seconds=args.seconds)
            row = (f"| {name} | {len(a)} | {c.original['median_us'] / 1e3:.2f} | {c.optimized['median_us'] / 1e3:.2f}"
                   f" | {c.ratio:.2f}x (±{100 * c.noise:.1f}%) |")
            print(row, flush=True)
            lines.append(row)
    text = "\n".join(lines) + "\n"
    if args.out is not None:
        args.out.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
