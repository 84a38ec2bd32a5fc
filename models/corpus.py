"""Export the whole-model corpus: real detection models as their users export them (issue #9).

Usage (with the corpus venv described in models/README.md, "Whole-model corpus"):

    python models/corpus.py                       # every entry into ~/.cache/evonnx/corpus
    python models/corpus.py --out /tmp/corpus --only yolov8n --only retinanet_resnet50_fpn_hot
    python models/corpus.py --list                # entries, whether each file exists, recorded status
    python models/corpus.py --codebase yolox --codebase detr   # only the entries of those code bases
    python models/corpus.py --codebase transformers --out /tmp/hfcorp   # the Hugging Face transformers models
    python models/corpus.py --codebase yolov4 --out /tmp/v4corp   # YOLOv4 as Tianxiaomo/pytorch-YOLOv4 exports it
    python models/corpus.py --codebase ultralytics/yolov5 --sources /tmp/src   # a repository at its pinned commit

Every model is built with random weights (ultralytics from its YAML configs, torchvision with ``weights=None,
weights_backbone=None``, transformers from config objects in code, YOLOv4 from corpus_yolov4's modules,
corpus_repos' repositories from their own configs at pinned commits, each in a child process) after
``torch.manual_seed(SEED)``, so nothing is downloaded, and a rerun gives the same bytes (the script restarts
itself with ``PYTHONHASHSEED=0``; see the end). Each entry is exported into ``<out>/<name>.onnx`` (one file, no
external data), checked with ``onnx.checker``, run once in onnxruntime (CPU) on its input recipe, and recorded in
``<out>/corpus.json``. An entry whose file still has the recorded hash, or whose export failed under the same
package versions, is skipped unless ``--force``. An exporter failure is an entry with ``"status": "export_failed"``
and a one-line reason, never a silent gap.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import functools
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

SEED = 0
GENERATOR = "models/corpus.py"
# evonnx's cache folder (README, "Headers"): $EVONNX_CACHE_DIR, else $XDG_CACHE_HOME/evonnx, else ~/.cache/evonnx
DEFAULT_OUT = Path(os.environ.get("EVONNX_CACHE_DIR")
                   or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "evonnx") / "corpus"
TS_OPSET = 17  # TorchScript exporter, as torchvision's own ONNX tests and most user recipes
DYNAMO_OPSET = 18  # the dynamo exporter's own default
HOT_BIAS = 4.0
VERSIONED = ("torch", "torchvision", "ultralytics", "transformers", "onnx", "onnxruntime", "onnxscript", "onnxslim",
             "numpy", "effdet", "timm")

# ultralytics reads these when it is imported: no DNS probe, no pip, settings outside the user's home
os.environ.setdefault("YOLO_OFFLINE", "1")
os.environ.setdefault("YOLO_AUTOINSTALL", "False")
# transformers / huggingface_hub: never reach the hub (every transformers model is built from a config in code)
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import corpus_convert  # noqa: E402
import corpus_heads  # noqa: E402  (models/ is sys.path[0] when this file runs as a script)
import corpus_repos  # noqa: E402
import corpus_torchvision  # noqa: E402
import corpus_transformers  # noqa: E402
import corpus_yolov4  # noqa: E402
import numpy as np  # noqa: E402
import onnx  # noqa: E402
import onnxruntime as ort  # noqa: E402
import torch  # noqa: E402


@dataclass(frozen=True)
class Entry:
    """One corpus model: how to build and export it, and the input its recipe describes."""

    name: str
    codebase: str  # "ultralytics" | "torchvision" | "transformers" | "yolov4" | a corpus_heads code base |
    #                a corpus_repos code base ("ultralytics/yolov5", "effdet", ...)
    arch: str  # ultralytics YAML, torchvision constructor, corpus_heads.HEADS, corpus_transformers.MODELS or
    #            corpus_yolov4.MODELS name
    exporter: str  # "ultralytics" | "torchscript" | "dynamo"
    description: str
    image_shape: tuple[int, ...]  # the recipe's input shape (NCHW: ultralytics, transformers; CHW: torchvision;
    #                               heads: ())
    dynamic: bool = False
    nms: bool = False
    hot: bool = False
    kwargs: dict[str, Any] = field(default_factory=dict)  # extra ultralytics export() arguments; torchvision:
    #                                                        the builder's
    check_shapes: tuple[tuple[int, ...], ...] = ()  # more shapes for ort_check where dims are symbolic
    opset: int = 0  # heads, transformers, yolov4: the opset asked of the exporter (0: the exporter's default for
    #                 its kind)
    check_batches: tuple[int, ...] = ()  # heads, transformers with a symbolic batch: more batch sizes for ort_check
    convert: str = ""  # then "qdq" (onnxruntime's static quantizer) or "fp16" (onnxconverter-common): corpus_convert
    scale: float = 1.0  # the image recipe's pixel range is [0, scale] (YOLOX takes 0-255)

    @property
    def is_head(self) -> bool:
        return self.arch in corpus_heads.HEADS_BY_NAME

    @property
    def is_transformers(self) -> bool:
        return self.codebase == "transformers"

    @property
    def is_yolov4(self) -> bool:
        return self.codebase == "yolov4"

    @property
    def is_repo(self) -> bool:
        return self.codebase in corpus_repos.BUILDERS


def _ultralytics_entries() -> list[Entry]:
    img, more = (1, 3, 640, 640), ((2, 3, 480, 640),)
    out: list[Entry] = []

    def add(name: str, yaml: str, what: str, *, both: bool = True, dyn_kw: dict[str, Any] | None = None,
            hot: bool = False, convert: str = "", **kw: Any) -> None:
        for dyn in (False, True) if both else (False,):
            args = kw | ((dyn_kw or {}) if dyn else {})
            out.append(Entry(
                name + ("_dynamic" if dyn else ""), "ultralytics", yaml, "ultralytics",
                what + (", dynamic batch/height/width" if dyn else ", static 640x640"), img,
                dynamic=dyn, nms=args.get("nms") is True, hot=hot, kwargs=args, check_shapes=more if dyn else (),
                convert=convert))

    add("yolov8n", "yolov8n.yaml", "YOLOv8n detect, raw (1,84,8400) for external NMS")
    add("yolov8n_opset13", "yolov8n.yaml", "YOLOv8n detect at opset 13", opset=13)
    add("yolov8n_nms", "yolov8n.yaml", "YOLOv8n detect with NMS in the graph (nms=True; dynamic: batch=4, "
        "the NMS loop unrolled over 4 images)", nms=True, dyn_kw={"batch": 4})
    add("yolov8n_nms_hot", "yolov8n.yaml", "YOLOv8n with NMS, class bias +4 so boxes pass conf=0.25 and reach NMS",
        nms=True, hot=True, dyn_kw={"batch": 4})
    add("yolo11n", "yolo11n.yaml", "YOLO11n detect, raw (1,84,8400)")
    add("yolo11n_nms", "yolo11n.yaml", "YOLO11n detect with NMS in the graph (nms=True)", both=False, nms=True)
    add("yolo11n_nms_hot", "yolo11n.yaml", "YOLO11n with NMS, class bias +4 so boxes reach NMS", both=False,
        nms=True, hot=True)
    add("yolov5nu", "yolov5n.yaml", "YOLOv5nu: ultralytics' anchor-free YOLOv5n, raw (1,84,8400)")
    add("yolov8n_seg", "yolov8n-seg.yaml", "YOLOv8n-seg: boxes+mask coefficients and (1,32,160,160) protos")
    add("yolov8n_seg_nms", "yolov8n-seg.yaml", "YOLOv8n-seg with NMS in the graph", both=False, nms=True)
    add("yolov8n_seg_nms_hot", "yolov8n-seg.yaml", "YOLOv8n-seg with NMS, class bias +4 so boxes reach NMS",
        both=False, nms=True, hot=True)
    add("yolov8n_pose", "yolov8n-pose.yaml", "YOLOv8n-pose: boxes + 17 keypoints, raw (1,56,8400)")
    add("yolov8n_pose_nms", "yolov8n-pose.yaml", "YOLOv8n-pose with NMS in the graph", both=False, nms=True)
    add("yolov8n_obb", "yolov8n-obb.yaml", "YOLOv8n-obb: rotated boxes (80 classes + angle), raw (1,85,8400)")
    add("yolo11n_seg", "yolo11n-seg.yaml", "YOLO11n-seg, raw outputs", both=False)
    add("yolo26n", "yolo26n.yaml", "YOLO26n, one-to-many head (nms=None, the default): raw for external NMS")
    add("yolo26n_e2e", "yolo26n.yaml", "YOLO26n NMS-free end-to-end head (nms=False): top-k in the graph",
        nms=False)
    add("yolov10n", "yolov10n.yaml", "YOLOv10n, one-to-many head (nms=None, the default)")
    add("yolov10n_e2e", "yolov10n.yaml", "YOLOv10n NMS-free end-to-end head (nms=False): top-k in the graph",
        both=False, nms=False)
    for base, yaml in (("yolov8n", "yolov8n.yaml"), ("yolo11n", "yolo11n.yaml")):
        add(f"{base}_qdq", yaml, f"{base} quantized by onnxruntime.quantization (static, QDQ, uint8 activations, int8 "
            "weights per channel; corpus_convert)", both=False, convert="qdq")
        add(f"{base}_fp16", yaml, f"{base} in float16 by onnxconverter-common (inputs and outputs too; "
            "corpus_convert)", both=False, convert="fp16")
    add("rtdetr_l", "rtdetr-l.yaml", "RT-DETR-l: transformer decoder, deformable attention as GridSample, (1,300,6)",
        both=False)
    return out


TORCHVISION = (  # (constructor, CHW recipe shape)
    ("ssdlite320_mobilenet_v3_large", (3, 320, 320)),
    ("fasterrcnn_mobilenet_v3_large_320_fpn", (3, 320, 320)),
    ("retinanet_resnet50_fpn", (3, 512, 512)),
    ("fcos_resnet50_fpn", (3, 512, 512)),
)


def _torchvision_entries() -> list[Entry]:
    out: list[Entry] = []
    for arch, shape in TORCHVISION:
        more = ((shape[0], 384, 512),)
        for hot in (False, True):
            base = arch + ("_hot" if hot else "")
            what = f"torchvision {arch}, transform and post-processing in the graph" + (
                f", classification bias set to +{HOT_BIAS:g} so detections pass the score threshold" if hot else "")
            out.append(Entry(base, "torchvision", arch, "torchscript", what + ", static", shape, hot=hot))
            out.append(Entry(base + "_dynamic", "torchvision", arch, "torchscript", what + ", dynamic height/width",
                             shape, dynamic=True, hot=hot, check_shapes=more))
            out.append(Entry(base + "_dynamo", "torchvision", arch, "dynamo", what + ", static", shape, hot=hot))
    for m in corpus_torchvision.MORE:
        out.append(Entry(f"tv_{m.arch}", "torchvision", m.arch, "torchscript", m.what + ", static, score threshold 0",
                         m.shape, kwargs=m.kwargs))
        if m.dynamo:
            out.append(Entry(f"tv_{m.arch}_dynamo", "torchvision", m.arch, "dynamo",
                             m.what + ", static, score threshold 0", m.shape, kwargs=m.kwargs))
    return out


def _head_entries() -> list[Entry]:
    """Every corpus_heads head through every (exporter, opset, dynamic batch) of corpus_heads.VARIANTS."""
    out: list[Entry] = []
    for head in corpus_heads.HEADS:
        for exporter, opset, dyn in corpus_heads.VARIANTS:
            tag = "ts" if exporter == "torchscript" else "dynamo"
            out.append(Entry(
                f"{head.name}_{tag}{opset}" + ("_dynamic" if dyn else ""), head.codebase, head.name, exporter,
                head.what + (", dynamic batch" if dyn else ", static batch 1"), (), dynamic=dyn,
                nms=False, opset=opset, check_batches=(3,) if dyn else ()))
    return out


# (corpus_transformers.MODELS name, exporter, opset, dynamic batch): both exporters for the DETR, RT-DETR and
# YOLOS families; TorchScript at 17 (18 once), dynamo at 18 (its default and lowest, see corpus_heads.VARIANTS)
TRANSFORMERS: tuple[tuple[str, str, int, bool], ...] = (
    ("detr", "torchscript", 17, False), ("detr", "torchscript", 17, True), ("detr", "dynamo", 18, False),
    ("conditional_detr", "torchscript", 17, False),
    ("deformable_detr", "torchscript", 17, False), ("deformable_detr", "dynamo", 18, False),
    ("rtdetr", "torchscript", 17, False), ("rtdetr", "torchscript", 17, True), ("rtdetr", "dynamo", 18, True),
    ("rtdetr_v2", "torchscript", 18, False),
    ("yolos", "torchscript", 17, False), ("yolos", "dynamo", 18, False),
)


def _transformers_entries() -> list[Entry]:
    out: list[Entry] = []
    for arch, exporter, opset, dyn in TRANSFORMERS:
        m = corpus_transformers.MODELS_BY_NAME[arch]
        tag = "ts" if exporter == "torchscript" else "dynamo"
        out.append(Entry(
            f"hf_{arch}_{tag}{opset}" + ("_dynamic" if dyn else ""), "transformers", arch, exporter,
            f"transformers {m.model_class}: {m.what}" + (", dynamic batch" if dyn else ", static batch 1"),
            (1, 3, *m.image), dynamic=dyn, opset=opset, check_batches=(3,) if dyn else ()))
    return out


# (corpus_yolov4.MODELS name, exporter, opset, dynamic batch): TorchScript at 11 as the repository's
# demo_pytorch2onnx.py (static and its dynamic-batch variant) and at 17, dynamo at 18 (static: see corpus_yolov4)
YOLOV4: tuple[tuple[str, str, int, bool], ...] = (
    ("yolov4", "torchscript", 11, False), ("yolov4", "torchscript", 11, True), ("yolov4", "torchscript", 17, False),
    ("yolov4", "dynamo", 18, False),
)


def _yolov4_entries() -> list[Entry]:
    out: list[Entry] = []
    h, w = corpus_yolov4.IMAGE
    for arch, exporter, opset, dyn in YOLOV4:
        m = corpus_yolov4.MODELS_BY_NAME[arch]
        tag = "ts" if exporter == "torchscript" else "dynamo"
        out.append(Entry(
            f"{arch}_{tag}{opset}" + ("_dynamic" if dyn else ""), "yolov4", arch, exporter,
            m.what + (", dynamic batch" if dyn else ", static batch 1"), (1, 3, h, w), dynamic=dyn, opset=opset,
            check_shapes=((3, 3, h, w),) if dyn else ()))
    return out


def _repos_entries() -> list[Entry]:
    shapes = {"batch": ", dynamic batch", "bhw": ", dynamic batch, height and width"}
    return [Entry(v.name, v.codebase, v.arch, v.exporter, v.what + shapes.get(v.dynamic, ", static"),
                  v.image, dynamic=bool(v.dynamic), nms=v.nms, check_shapes=v.check_shapes, opset=v.opset,
                  scale=v.scale) for v in corpus_repos.VARIANTS]


ENTRIES: tuple[Entry, ...] = tuple(_ultralytics_entries() + _torchvision_entries() + _head_entries()
                                   + _transformers_entries() + _yolov4_entries() + _repos_entries())


# ---------------------------------------------------------------------------------------------------------
# exporters: each writes one .onnx file at the given path and returns the source record
# ---------------------------------------------------------------------------------------------------------
class ExportFailed(Exception):
    """The exporter itself refused the model; the entry is recorded with this one-line reason."""


@contextlib.contextmanager
def _exporter_call() -> Iterator[None]:
    """Wrap the one call into an exporter: whatever it raises becomes the entry's recorded failure."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # TracerWarnings on every shape-to-Python conversion
            yield
    except Exception as exc:  # the exporter's own failure is the recorded result, not a crash of the run
        raise ExportFailed(corpus_repos.one_line(exc)) from exc


@contextlib.contextmanager
def _output_to(log: Path) -> Iterator[None]:
    """Send everything written to fds 1 and 2 (Python, C++, subprocesses) to ``log`` for the duration."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    with log.open("w") as f:
        os.dup2(f.fileno(), 1)
        os.dup2(f.fileno(), 2)
        try:
            yield
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])


@contextlib.contextmanager
def _chdir(path: Path) -> Iterator[None]:
    old = Path.cwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(old)


def _export_ultralytics(e: Entry, dst: Path, stage: Path) -> dict[str, Any]:
    # ultralytics' check_requirements would pip-install onnxslim, and with autoinstall off it exports an
    # unslimmed graph after a warning: a different model. Require it here instead.
    import onnxslim  # noqa: F401
    from ultralytics import RTDETR, YOLO
    from ultralytics import __version__ as ul_version

    args: dict[str, Any] = {"format": "onnx", "imgsz": 640, "dynamic": e.dynamic, "device": "cpu"}
    args.update(e.kwargs)
    cls = RTDETR if e.arch.startswith("rtdetr") else YOLO
    torch.manual_seed(SEED)
    with _chdir(stage):
        model = cls(e.arch)
        hot = _hot_bias_ultralytics(model.model) if e.hot else None
        with _exporter_call():
            produced = Path(model.export(**args))
    if not produced.is_absolute():
        produced = stage / produced
    m = onnx.load(str(produced))
    # the only non-reproducible bytes: ultralytics stamps the export time into the metadata
    kept = [p for p in m.metadata_props if p.key != "date"]
    del m.metadata_props[:]
    m.metadata_props.extend(kept)
    onnx.save(m, str(dst))
    call = f'torch.manual_seed({SEED}); model = {cls.__name__}("{e.arch}"); ' + (f"{hot[0]}; " if hot else "")
    call += "model.export(" + ", ".join(f"{k}={v!r}" for k, v in args.items()) + ")"
    notes = "random weights from the YAML; simplify=True (the default: onnxslim); metadata 'date' dropped"
    return {"codebase": "ultralytics", "version": ul_version, "call": call,
            "notes": notes + (f"; {hot[1]}" if hot else "")}


def _hot_bias_ultralytics(model: Any) -> tuple[str, str]:
    """Lift the Detect head's class logits (init about -9 to -12) to +4: sigmoid 0.98 passes conf=0.25."""
    head = model.model[-1]
    with torch.no_grad():
        for branch in ("cv3", "one2one_cv3"):
            for seq in getattr(head, branch, ()):
                seq[-1].bias.fill_(HOT_BIAS)
    return (f"model.model.model[-1].cv3[i][-1].bias[:] = {HOT_BIAS:g}",
            f"hot: every class logit bias +{HOT_BIAS:g} (sigmoid 0.98), so boxes pass conf=0.25 and reach NMS")


def _hot_bias(model: Any, arch: str) -> tuple[str, str]:
    """Set the final classification bias so random-weight scores pass the score threshold; say how."""
    b = f"{HOT_BIAS:g}"
    with torch.no_grad():
        if arch.startswith(("retinanet", "fcos")):  # sigmoid scores: init prior 0.01 < score_thresh 0.05
            model.head.classification_head.cls_logits.bias.fill_(HOT_BIAS)
            return (f"model.head.classification_head.cls_logits.bias[:] = {b}",
                    f"hot: every class at sigmoid({b}) = 0.98 > score_thresh 0.05")
        if arch.startswith("ssdlite"):  # softmax is shift-invariant: lift classes 1..4 of every anchor
            k = model.head.classification_head.num_columns
            for block in model.head.classification_head.module_list:
                block[-1].bias.view(-1, k)[:, 1:5] = HOT_BIAS
            return (f"model.head.classification_head.module_list[i][-1].bias.view(-1, {k})[:, 1:5] = {b}",
                    "hot: softmax over 91 classes, classes 1..4 lifted (cold already passes score_thresh 0.001)")
        if arch.startswith("fasterrcnn"):  # softmax: classes 1..4 at e^4 / (4 e^4 + 87) = 0.18 > 0.05
            model.roi_heads.box_predictor.cls_score.bias[1:5] = HOT_BIAS
            return (f"model.roi_heads.box_predictor.cls_score.bias[1:5] = {b}",
                    "hot: softmax over 91 classes, classes 1..4 at about 0.18 > box_score_thresh 0.05")
    raise ValueError(f"no hot variant known for {arch}")


def _export_torchvision(e: Entry, dst: Path, stage: Path) -> dict[str, Any]:
    import torchvision

    torch.manual_seed(SEED)
    model, ctor = corpus_torchvision.build(e.arch, e.kwargs)
    hot = _hot_bias(model, e.arch) if e.hot else None
    image = torch.rand(e.image_shape, generator=torch.Generator().manual_seed(SEED))
    image_code = f"image = torch.rand({tuple(e.image_shape)}, generator=torch.Generator().manual_seed({SEED}))"
    with torch.no_grad():
        out_names = list(model([image])[0].keys())
    tmp = stage / "model.onnx"
    if e.exporter == "torchscript":
        axes = None
        if e.dynamic:
            axes = {"images": {1: "height", 2: "width"}} | {n: {0: "detections"} for n in out_names}
        kw: dict[str, Any] = {"dynamo": False, "opset_version": TS_OPSET, "input_names": ["images"],
                              "output_names": out_names, "dynamic_axes": axes}
    else:
        kw = {"dynamo": True, "opset_version": DYNAMO_OPSET, "input_names": ["images"],
              "output_names": out_names, "external_data": False}
    with _exporter_call():
        torch.onnx.export(model, ([image],), str(tmp), **kw)
    m = onnx.load(str(tmp))
    # the dynamo exporter stamps each node with a stack trace holding absolute paths: not part of the graph
    for node in m.graph.node:
        del node.metadata_props[:]
        node.doc_string = ""
    m.graph.doc_string = ""
    m.doc_string = ""
    onnx.save(m, str(dst))
    call = f"torch.manual_seed({SEED}); model = {ctor}; " + (f"{hot[0]}; " if hot else "")
    args = ", ".join(f"{k}={v!r}" for k, v in kw.items() if v is not None)
    call += f"{image_code}; torch.onnx.export(model, ([image],), f, {args})"
    notes = "node metadata_props and doc strings stripped" + (f"; {hot[1]}" if hot else "")
    return {"codebase": "torchvision", "version": torchvision.__version__, "call": call, "notes": notes}


def _strip_and_save(tmp: Path, dst: Path) -> None:
    """As _export_torchvision: the dynamo exporter's per-node stack traces hold absolute paths; drop them."""
    m = onnx.load(str(tmp))
    for node in m.graph.node:
        del node.metadata_props[:]
        node.doc_string = ""
    m.graph.doc_string = ""
    m.doc_string = ""
    onnx.save(m, str(dst))


def _export_module(export: Callable[..., dict[str, Any]], module: Any, e: Entry, dst: Path,
                   stage: Path) -> dict[str, Any]:
    """`export(module, exporter, opset, dynamic, path, seed)` of a corpus module (corpus_heads, corpus_transformers)
    through torch.onnx.export, as the entry's exporter and opset say, saved without its exporter's metadata."""
    tmp = stage / "model.onnx"
    with _exporter_call():
        source = export(module, e.exporter, e.opset, e.dynamic, str(tmp), SEED)
    _strip_and_save(tmp, dst)
    source["version"] = f"{source['version']}; torch {torch.__version__}"
    return source


def _export_head(e: Entry, dst: Path, stage: Path) -> dict[str, Any]:
    """A corpus_heads module through torch.onnx.export, as the entry's exporter and opset say."""
    return _export_module(corpus_heads.export, corpus_heads.HEADS_BY_NAME[e.arch], e, dst, stage)


def _export_transformers(e: Entry, dst: Path, stage: Path) -> dict[str, Any]:
    """A transformers detector wrapped with its post-processing (corpus_transformers.Detect), through
    torch.onnx.export as the entry's exporter and opset say."""
    source = _export_module(corpus_transformers.export, corpus_transformers.MODELS_BY_NAME[e.arch], e, dst, stage)
    g = onnx.load(str(dst), load_external_data=False).graph
    static = [vi.name for vi in g.input if vi.type.tensor_type.shape.dim[0].HasField("dim_value")]
    if e.dynamic and static:
        # torch.onnx's non-strict capture retries a ConstraintViolation with torch.export's suggested fixes
        # ("batch = 2"): the file has a static batch although a dynamic one was asked for. Kept and said.
        source["notes"] += (f"; dynamic batch asked, but inputs {static} have a static batch in the graph (the "
                            "exporter specialized it without an error)")
    return source


def _export_repo(e: Entry, dst: Path, stage: Path, sources: Path) -> dict[str, Any]:
    """A corpus_repos variant: built and exported in a child process from its repository (under `sources`) at the
    pinned commit."""
    tmp = stage / "model.onnx"
    variant = next(v for v in corpus_repos.VARIANTS if v.name == e.name)
    try:
        source = corpus_repos.export_in_child(variant, sources, tmp)
    except RuntimeError as exc:  # the child's own one-line reason, or a refused source tree
        raise ExportFailed(str(exc)) from exc
    except (OSError, subprocess.SubprocessError) as exc:
        raise ExportFailed(corpus_repos.one_line(exc)) from exc
    _strip_and_save(tmp, dst)
    return source


def _export_yolov4(e: Entry, dst: Path, stage: Path) -> dict[str, Any]:
    """A corpus_yolov4 model (post-processing decode in the graph, no NMS) through torch.onnx.export, as the
    entry's exporter and opset say."""
    return _export_module(corpus_yolov4.export, corpus_yolov4.MODELS_BY_NAME[e.arch], e, dst, stage)


# ---------------------------------------------------------------------------------------------------------
# records
# ---------------------------------------------------------------------------------------------------------
def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _dims(vi: onnx.ValueInfoProto) -> list[int | str]:
    return [d.dim_value if d.HasField("dim_value") else (d.dim_param or "?") for d in vi.type.tensor_type.shape.dim]


def _io(vis: Any) -> list[dict[str, Any]]:
    return [{"name": vi.name, "dtype": onnx.helper.tensor_dtype_to_np_dtype(vi.type.tensor_type.elem_type).name,
             "shape": _dims(vi)} for vi in vis]


def _recipe(e: Entry) -> dict[str, Any]:
    if e.is_head:
        head = corpus_heads.HEADS_BY_NAME[e.arch]
        h: dict[str, Any] = {"kind": "head_outputs", "batch": 1, "seed": SEED,
                             "distribution": corpus_heads.SAMPLING,
                             "inputs": [s.record() for s in head.inputs]}
        if e.check_batches:
            h["also_checked_batches"] = list(e.check_batches)
        return h
    if e.is_transformers:
        sizes = list(corpus_transformers.TARGET_SIZES)
        t: dict[str, Any] = {"kind": "image_and_sizes", "batch": 1, "seed": SEED, "range": [0, 1],
                             "shape": list(e.image_shape),
                             "distribution": f"pixel_values: numpy.random.default_rng({SEED}).random((batch, "
                                             f"*shape[1:]), dtype=numpy.float32); target_sizes: int64 {sizes} (h, w) "
                                             "per image",
                             "note": "pixel_values as the image processor leaves them would be normalized; the graph "
                                     "does not normalize, so any float image works"}
        if e.check_batches:
            t["also_checked_batches"] = list(e.check_batches)
        return t
    r: dict[str, Any] = {"kind": "image", "range": [0, e.scale],
                         "dtype": "float16" if e.convert == "fp16" else "float32", "shape": list(e.image_shape),
                         "distribution": f"numpy.random.default_rng({SEED}).random(shape, dtype=numpy.float32)"
                                         + (f" * {e.scale:g}" if e.scale != 1 else "")}
    if e.check_shapes:
        r["also_checked"] = [list(s) for s in e.check_shapes]
    if e.is_yolov4:
        r["note"] = ("the image as the repository's demo feeds it (RGB / 255, NCHW); the graph decodes boxes "
                     "(x1y1x2y2 in [0, 1]) and confs, no NMS")
    if e.codebase == "torchvision":
        r["note"] = "one CHW image (the list of one image torchvision takes); the graph normalizes and resizes it"
    if e.nms and e.kwargs.get("batch", 1) > 1:
        r["note"] = f"batch up to {e.kwargs['batch']} (NMS loop unrolled over that batch, smaller ones padded)"
    return r


def _check_feeds(e: Entry, first_input: str) -> Iterator[tuple[list[int], dict[str, np.ndarray]]]:
    """The recipe input, then each ``also_checked`` one: (shape of the first input, feeds)."""
    if e.is_head:
        specs = corpus_heads.HEADS_BY_NAME[e.arch].inputs
        for batch in (1, *e.check_batches):
            feeds = corpus_heads.sample_inputs(specs, SEED, batch)
            yield list(next(iter(feeds.values())).shape), feeds
        return
    if e.is_transformers:
        for batch in (1, *e.check_batches):
            image, sizes = corpus_transformers.example_inputs(corpus_transformers.MODELS_BY_NAME[e.arch], batch, SEED)
            yield list(image.shape), {"pixel_values": image, "target_sizes": sizes}
        return
    for shape in (e.image_shape, *e.check_shapes):
        image = np.random.default_rng(SEED).random(shape, dtype=np.float32) * np.float32(e.scale)
        yield list(shape), {first_input: image.astype(np.float16) if e.convert == "fp16" else image}


def _ort_check(path: Path, e: Entry) -> dict[str, Any]:
    """Run the model once per recipe shape in onnxruntime (CPU); record output shapes, or the error line."""
    so = ort.SessionOptions()
    so.intra_op_num_threads = 2
    so.log_severity_level = 3
    runs = []
    try:
        sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
        for shape, feeds in _check_feeds(e, sess.get_inputs()[0].name):
            t0 = time.perf_counter()
            outs = sess.run(None, feeds)
            outputs = [{"name": o.name, "shape": list(a.shape), "dtype": a.dtype.name,
                        "nonzero": int(np.count_nonzero(a)),
                        "nonfinite": int(a.size - np.count_nonzero(np.isfinite(a))) if a.dtype.kind == "f" else 0}
                       for o, a in zip(sess.get_outputs(), outs, strict=True)]
            runs.append({"input_shape": shape, "seconds": round(time.perf_counter() - t0, 3),
                         "outputs": outputs})
    except Exception as exc:  # an onnxruntime failure is the recorded result of the check
        return {"status": "error", "error": corpus_repos.one_line(exc), "runs": runs}
    return {"status": "ok", "runs": runs}


def _record(e: Entry, path: Path, source: dict[str, Any], seconds: float) -> dict[str, Any]:
    m = onnx.load(str(path))
    try:
        onnx.checker.check_model(str(path), full_check=True)
        checker = "ok"
    except Exception as exc:  # a checker complaint is recorded, the model is still what the exporter gave
        checker = corpus_repos.one_line(exc)
    inits = {i.name for i in m.graph.initializer}
    opset = next(o.version for o in m.opset_import if o.domain in ("", "ai.onnx"))
    hist = collections.Counter(n.op_type if n.domain in ("", "ai.onnx") else f"{n.domain}::{n.op_type}"
                               for n in m.graph.node)
    return {
        "name": e.name, "file": path.name, "sha256": _sha256(path), "size_bytes": path.stat().st_size,
        "status": "ok", "description": e.description, "source": source, "exporter": e.exporter,
        "opset": opset, "ir_version": m.ir_version, "dynamic": e.dynamic, "nms": e.nms,
        "inputs": _io(vi for vi in m.graph.input if vi.name not in inits), "outputs": _io(m.graph.output),
        "input_recipe": _recipe(e), "node_count": len(m.graph.node), "initializer_count": len(inits),
        "op_histogram": dict(sorted(hist.items())), "onnx_checker": checker,
        "export_seconds": round(seconds, 1), "ort_check": _ort_check(path, e),
    }


def _failed(e: Entry, reason: str, seconds: float) -> dict[str, Any]:
    return {"name": e.name, "file": None, "sha256": None, "size_bytes": None, "status": "export_failed",
            "reason": reason, "description": e.description,
            "source": {"codebase": e.codebase, "arch": e.arch}, "exporter": e.exporter,
            "opset": e.opset or (DYNAMO_OPSET if e.exporter == "dynamo" else TS_OPSET), "dynamic": e.dynamic,
            "nms": e.nms,
            "input_recipe": _recipe(e), "export_seconds": round(seconds, 1)}


def _versions() -> dict[str, str]:
    out = {}
    for pkg in VERSIONED:
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            out[pkg] = "not installed"
    return out


def _load_manifest(out: Path) -> dict[str, Any]:
    p = out / "corpus.json"
    return json.loads(p.read_text()) if p.exists() else {}


def _write_manifest(out: Path, versions: dict[str, str], records: dict[str, dict[str, Any]]) -> None:
    order = [e.name for e in ENTRIES]
    models = [records[n] for n in order if n in records]
    doc = {"generator": GENERATOR, "seed": SEED, "versions": versions, "models": models}
    tmp = out / ".corpus.json.tmp"
    tmp.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    os.replace(tmp, out / "corpus.json")


def _up_to_date(e: Entry, out: Path, rec: dict[str, Any] | None, same_versions: bool) -> bool:
    if rec is None:
        return False
    if rec.get("status") == "export_failed":
        return same_versions  # deterministic: the same packages fail the same way
    f = out / f"{e.name}.onnx"
    return f.exists() and rec.get("sha256") == _sha256(f)


def markdown_table(models: list[dict[str, Any]]) -> str:
    """The README's table: one row per recorded entry, ORT output shapes of the recipe run."""
    rows = ["| name | exporter, opset | input | nodes | MB | onnxruntime outputs (recipe input) | nonzero in "
            "output 0 |", "|---|---|---|---|---|---|---|"]
    for m in models:
        exp = f"{m['exporter']} {m['opset']}"
        if m["status"] != "ok":
            where = re.search(r"\[at ([^\]]*)\]", m["reason"])
            short = m["reason"].split(":")[0] + f" at {where.group(1)}" if where else m["reason"][:90]
            rows.append(f"| {m['name']} | {exp} | – | – | – | export_failed: {short} | – |")
            continue
        shape = "×".join(str(d) for d in m["inputs"][0]["shape"])
        chk = m["ort_check"]
        outs, nonzero = f"error: {chk.get('error')}", "–"
        if chk["status"] == "ok":
            outs = ", ".join("×".join(map(str, o["shape"])) for o in chk["runs"][0]["outputs"])
            nonzero = str(chk["runs"][0]["outputs"][0]["nonzero"])
        rows.append(f"| {m['name']} | {exp} | {shape} | {m['node_count']} | {m['size_bytes'] / 1e6:.1f} | {outs} "
                    f"| {nonzero} |")
    return "\n".join(rows)


def export_entry(e: Entry, out: Path, sources: Path | None = None) -> dict[str, Any]:
    """Export one entry into ``out/<name>.onnx`` through a staging folder; return its manifest record. ``sources``:
    corpus_repos' repositories (default ``out/src``)."""
    stage = Path(tempfile.mkdtemp(prefix=f".stage-{e.name}-", dir=out))
    dst = out / f"{e.name}.onnx"
    t0 = time.perf_counter()
    try:
        staged = stage / "final.onnx"
        try:
            fn: Callable[[Entry, Path, Path], dict[str, Any]] = (
                _export_head if e.is_head else _export_transformers if e.is_transformers else
                _export_yolov4 if e.is_yolov4 else functools.partial(_export_repo, sources=sources or out / "src")
                if e.is_repo else
                _export_ultralytics if e.codebase == "ultralytics" else _export_torchvision)
            (out / "logs").mkdir(exist_ok=True)
            with _output_to(out / "logs" / f"{e.name}.log"):
                source = fn(e, staged, stage)
                if e.convert:
                    name = onnx.load(str(staged), load_external_data=False).graph.input[0].name
                    source |= corpus_convert.convert(e.convert, staged, stage, name, e.image_shape, SEED)
        except ExportFailed as exc:
            dst.unlink(missing_ok=True)
            return _failed(e, str(exc), time.perf_counter() - t0)
        if staged.stat().st_size >= 2**31:
            raise RuntimeError(f"{e.name}: {staged.stat().st_size} bytes, over the 2 GB single-file limit")
        os.replace(staged, dst)
        return _record(e, dst, source, time.perf_counter() - t0)
    finally:
        shutil.rmtree(stage, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"output folder (default {DEFAULT_OUT})")
    ap.add_argument("--only", action="append", default=[], metavar="NAME", help="export only NAME (repeatable)")
    ap.add_argument("--codebase", action="append", default=[], metavar="NAME",
                    help="export only the entries of code base NAME (repeatable; with --only: either)")
    ap.add_argument("--list", action="store_true", help="list the entries and exit")
    ap.add_argument("--force", action="store_true", help="re-export entries that are up to date")
    ap.add_argument("--table", action="store_true", help="print corpus.json as a Markdown table and exit")
    ap.add_argument("--sources", type=Path, metavar="DIR",
                    help="the corpus_repos repositories: DIR/<folder>, cloned at the pinned commit where missing "
                         "(default <out>/src)")
    a = ap.parse_args(argv)
    out = a.out.expanduser().resolve()
    sources = (a.sources or out / "src").expanduser().resolve()
    known = {e.name for e in ENTRIES}
    unknown = [n for n in a.only if n not in known]
    if unknown:
        ap.error(f"unknown entries: {', '.join(unknown)} (see --list)")
    bases = {e.codebase for e in ENTRIES}
    unknown = [c for c in a.codebase if c not in bases]
    if unknown:
        ap.error(f"unknown code bases: {', '.join(unknown)} (known: {', '.join(sorted(bases))})")
    old = _load_manifest(out)
    records = {r["name"]: r for r in old.get("models", []) if r.get("name") in known}
    if a.table:
        print(markdown_table([records[e.name] for e in ENTRIES if e.name in records]))
        return 0
    if a.list:
        for e in ENTRIES:
            f = out / f"{e.name}.onnx"
            rec = records.get(e.name, {})
            state = "exists " if f.exists() else "missing"
            print(f"{e.name:44s} {e.exporter:11s} {state} {rec.get('status', 'not exported'):13s} {e.description}")
        return 0
    out.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("YOLO_CONFIG_DIR", str(out / ".ultralytics-config"))
    versions = _versions()
    same = old.get("versions") == versions
    chosen = set(a.only) | {e.name for e in ENTRIES if e.codebase in a.codebase}
    todo = [e for e in ENTRIES if not chosen or e.name in chosen]
    t_all = time.perf_counter()
    for e in todo:
        if not a.force and _up_to_date(e, out, records.get(e.name), same):
            records[e.name]["description"] = e.description  # prose only: may be edited without a re-export
            print(f"corpus: {e.name}: up to date, skipped", flush=True)
            continue
        print(f"corpus: {e.name}: exporting ({e.exporter}), log in {out / 'logs' / (e.name + '.log')}", flush=True)
        rec = export_entry(e, out, sources)
        records[e.name] = rec
        _write_manifest(out, versions, records)
        if rec["status"] == "ok":
            chk = rec["ort_check"]
            shapes = [o["shape"] for o in chk["runs"][0]["outputs"]] if chk["runs"] else []
            print(f"corpus: {e.name}: ok, {rec['node_count']} nodes, {rec['size_bytes'] / 1e6:.1f} MB, "
                  f"{rec['export_seconds']} s, ort {chk['status']} {shapes or chk.get('error')}", flush=True)
        else:
            print(f"corpus: {e.name}: export_failed: {rec['reason']}", flush=True)
    _write_manifest(out, versions, records)
    print(f"corpus: {len(todo)} entries in {time.perf_counter() - t_all:.0f} s -> {out}", flush=True)
    return 0


if __name__ == "__main__":
    # onnxslim's symbolic shape inference names each class of equal dims after one member picked in set order,
    # so the value_info of dynamic ultralytics exports follows the string hash seed: fix it, then start again.
    if os.environ.get("PYTHONHASHSEED") != "0":
        os.environ["PYTHONHASHSEED"] = "0"
        os.execv(sys.executable, [sys.executable, str(Path(__file__).resolve()), *sys.argv[1:]])
    sys.exit(main())
