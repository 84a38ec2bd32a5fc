"""The models `export.py` exports: one `Spec` per model (its PyTorch module from `detection.py`, exporter, opset,
symbolic axes and run-time cases) and the seeded, realistic input generators whose hints go into the manifest."""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
import detection as det  # noqa: E402  (sibling module; models/ is not a package)

Inputs = dict[str, torch.Tensor]
Dims = dict[str, int]


# ---------------------------------------------------------------------------------------------------------
# realistic input generators (a matching ``input_hints`` entry goes into the manifest)
# ---------------------------------------------------------------------------------------------------------
def _uniform(g: torch.Generator, shape: tuple[int, ...], lo: float, hi: float) -> torch.Tensor:
    return torch.rand(shape, generator=g) * (hi - lo) + lo


def _boxes(
    g: torch.Generator, shape: tuple[int, ...], lo: float, hi_x: float, hi_y: float, min_wh: float = 4.0
) -> torch.Tensor:
    """x1y1x2y2 boxes with x2 > x1, y2 > y1: top-left uniform, log-uniform sizes in [min_wh, 512]."""
    lead = shape[:-1]
    x1 = _uniform(g, lead, lo, hi_x)
    y1 = _uniform(g, lead, lo, hi_y)
    w = torch.exp(_uniform(g, lead, math.log(min_wh), math.log(512.0)))
    h = torch.exp(_uniform(g, lead, math.log(min_wh), math.log(512.0)))
    return torch.stack([x1, y1, x1 + w, y1 + h], dim=-1)


def _hint_boxes(lo: float, hi_x: float, hi_y: float, min_wh: float = 4.0) -> dict[str, Any]:
    """Manifest hint for ``_boxes``: x1/y1 uniform in the ranges, w/h log-uniform in ``wh_range``."""
    return {"kind": "boxes", "x1_range": [lo, hi_x], "y1_range": [lo, hi_y], "wh_range": [min_wh, 512.0]}


def _grid_points(sizes: tuple[tuple[int, int], ...], strides: tuple[int, ...]) -> torch.Tensor:
    """Anchor-free points (x, y) at cell centres, levels concatenated (mmdet MlvlPointGenerator, 0.5)."""
    pts = []
    for (h, w), s in zip(sizes, strides, strict=True):
        ys, xs = torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij")
        pts.append(torch.stack([(xs.reshape(-1) + 0.5) * s, (ys.reshape(-1) + 0.5) * s], dim=-1))
    return torch.cat(pts).float()


HINT_NORMAL = {"kind": "normal", "mean": 0.0, "std": 1.0}
HINT_SHAPE_ONLY = {"kind": "shape_only", "note": "values unused; only the shape matters"}


# ---------------------------------------------------------------------------------------------------------
# model specifications
# ---------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Spec:
    name: str
    make_module: Callable[[], nn.Module]
    make_inputs: Callable[[torch.Generator, Dims], Inputs]
    cases: tuple[Dims, ...]  # first case is the export shape
    output_names: tuple[str, ...]
    description: str
    source: str
    opset: int = 17
    exporter: str = "torchscript"  # or "dynamo"
    writes: bool = False
    dynamic_axes: dict[str, dict[int, str]] = field(default_factory=dict)
    input_hints: dict[str, Any] = field(default_factory=dict)


def _feats(g: torch.Generator, d: Dims, channels: int, bs: int = 1) -> Inputs:
    return {f"feat{i}": torch.randn(bs, channels, d[f"H{i}"], d[f"W{i}"], generator=g) for i in range(3)}


def _yolo_inputs(g: torch.Generator, d: Dims) -> Inputs:
    return {f"x{i}": torch.randn(1, 3 * 85, d[f"H{i}"], d[f"W{i}"], generator=g) for i in range(3)}


def _levels(h: int, w: int) -> Dims:
    return {"H0": h // 8, "W0": w // 8, "H1": h // 16, "W1": w // 16, "H2": h // 32, "W2": w // 32}


_LEVEL_AXES = {f"{p}{i}": {2: f"H{i}", 3: f"W{i}"} for p in ("feat", "x") for i in range(3)}


def _valid_flags_inputs(g: torch.Generator, d: Dims) -> Inputs:
    h, w = d["H"], d["W"]
    n = h * w * 3
    return {
        "feat": torch.randn(1, 8, h, w, generator=g),
        "anchors": _boxes(g, (n, 4), -100.0, w * 8 + 50.0, h * 8 + 50.0, min_wh=16.0),
        "pad_shape": torch.tensor([h * 8 - 44, w * 8 - 50], dtype=torch.int64),
        "img_shape": torch.tensor([h * 8 - 54, w * 8 - 60], dtype=torch.float32),
    }


def _delta2bbox_inputs(g: torch.Generator, d: Dims) -> Inputs:
    b, n = d["B"], d["N"]
    return {"rois": _boxes(g, (b, n, 4), 0.0, 1333.0, 800.0), "deltas": torch.randn(b, n, 4, generator=g)}


def _distance2bbox_inputs(g: torch.Generator, d: Dims) -> Inputs:
    b = d["B"]
    points = _grid_points(((80, 80), (40, 40), (20, 20)), (8, 16, 32))
    return {
        "points": points,
        "distance": _uniform(g, (b, points.shape[0], 4), 0.0, 200.0),
        "max_shape": _uniform(g, (b, 2), 480.0, 640.0).round(),
    }


def _yolo_cases() -> tuple[Dims, ...]:
    return (_levels(640, 640), _levels(480, 640), _levels(320, 256))


SPECS: tuple[Spec, ...] = (
    # ----------------------------------------------------------------------------- foundation set
    Spec(
        name="anchor_grid",
        make_module=det.AnchorGrid,
        make_inputs=lambda g, d: _feats(g, d, channels=8),
        cases=(_levels(640, 640), _levels(512, 384), _levels(800, 1344)),
        output_names=("anchors",),
        dynamic_axes={**{f"feat{i}": _LEVEL_AXES[f"feat{i}"] for i in range(3)}, "anchors": {0: "A"}},
        input_hints={f"feat{i}": HINT_SHAPE_ONLY for i in range(3)},
        description="Multi-level anchors (RetinaNet P3-P5: 9 base anchors × H×W per level, strides 8/16/32) "
        "generated in-graph from the feature maps' run-time shapes; 640×640 → 75,600 anchors.",
        source="mmdet AnchorGenerator.gen_base_anchors + grid_priors / single_level_grid_priors",
    ),
    Spec(
        name="valid_flags",
        make_module=det.ValidFlags,
        make_inputs=_valid_flags_inputs,
        cases=({"H": 168, "W": 200}, {"H": 100, "W": 136}),
        output_names=("inside_flags",),
        opset=13,
        dynamic_axes={"feat": {2: "H", 3: "W"}, "anchors": {0: "N"}, "inside_flags": {0: "N"}},
        input_hints={
            "feat": HINT_SHAPE_ONLY,
            "anchors": {**_hint_boxes(-100.0, 1650.0, 1394.0, min_wh=16.0), "note": "N must equal H*W*3"},
            "pad_shape": {"kind": "const", "value": [1300, 1550], "note": "(pad_h, pad_w) ≤ (8H, 8W)"},
            "img_shape": {"kind": "const", "value": [1290.0, 1540.0], "note": "(img_h, img_w)"},
        },
        description="Anchor valid mask for one stride-8 level (168×200×3 = 100,800 anchors): arange<valid "
        "masks, repeat-meshgrid, &, expand; then inside-image flags from anchor coordinates.",
        source="mmdet AnchorGenerator.valid_flags/single_level_valid_flags (no writes) + anchor_inside_flags",
    ),
    Spec(
        name="delta2bbox",
        make_module=det.Delta2BBox,
        make_inputs=_delta2bbox_inputs,
        cases=({"B": 2, "N": 20000}, {"B": 1, "N": 20000}, {"B": 3, "N": 20000}),
        output_names=("bboxes",),
        dynamic_axes={"rois": {0: "B"}, "deltas": {0: "B"}, "bboxes": {0: "B"}},
        input_hints={"rois": _hint_boxes(0.0, 1333.0, 800.0), "deltas": HINT_NORMAL},
        description="Batched delta decoder (B symbolic, N=20,000): means/stds, step-4 slices, expand_as, "
        "clamp(±log(1000/16)), exp, centre/size, clip to (800, 1333), stack.",
        source="mmdet 2.x DeltaXYWHBBoxCoder.decode → delta2bbox (ONNX/dynamic_clip_for_onnx path)",
    ),
    Spec(
        name="bbox2delta",
        make_module=det.BBox2Delta,
        make_inputs=lambda g, d: {
            "proposals": _boxes(g, (d["N"], 4), 0.0, 1333.0, 800.0),
            "gt": _boxes(g, (d["N"], 4), 0.0, 1333.0, 800.0),
        },
        cases=({"N": 100000},),
        output_names=("deltas",),
        opset=18,
        input_hints={"proposals": _hint_boxes(0.0, 1333.0, 800.0), "gt": _hint_boxes(0.0, 1333.0, 800.0)},
        description="Box encoder, N=100,000: centres/sizes of proposals and gt, (g-p)/pw, log(gw/pw), stack, "
        "(d-means)/stds. Non-box (random normal) inputs give NaN from log of negatives.",
        source="mmdet DeltaXYWHBBoxCoder.encode → bbox2delta",
    ),
    Spec(
        name="distance2bbox",
        make_module=det.Distance2BBox,
        make_inputs=_distance2bbox_inputs,
        cases=({"B": 8},),
        output_names=("bboxes",),
        input_hints={
            "points": {
                "kind": "grid_points",
                "range": [0.0, 640.0],
                "note": "cell centres of 80/40/20 grids",
            },
            "distance": {"kind": "uniform", "range": [0.0, 200.0]},
            "max_shape": {"kind": "uniform", "range": [480.0, 640.0], "note": "(h, w) per image"},
        },
        description="Anchor-free decoder: points (8400, 2) ± distances (8, 8400, 4), stack, then clip with "
        "cat/flip/unsqueeze of a per-image max_shape (8, 2) and two Where.",
        source="mmdet distance2bbox (FCOS/GFL/YOLOv8 heads; tensor max_shape clip path)",
    ),
    Spec(
        name="yolo_decode",
        make_module=det.YoloDecode,
        make_inputs=_yolo_inputs,
        cases=_yolo_cases(),
        output_names=("output",),
        dynamic_axes={**{f"x{i}": _LEVEL_AXES[f"x{i}"] for i in range(3)}, "output": {1: "A"}},
        input_hints={f"x{i}": HINT_NORMAL for i in range(3)},
        description="YOLOv5 Detect decode, 3 levels (1, 255, H, W) → (1, 25200, 85) at 640×640: view, "
        "permute, sigmoid, split, xy/wh with in-graph grids (H/W symbolic), cat.",
        source="ultralytics yolov5 models/yolo.py Detect.forward + _make_grid (inplace=False, --dynamic)",
    ),
    Spec(
        name="tblr2bbox",
        make_module=det.TBLR2BBox,
        make_inputs=lambda g, d: {
            "priors": _boxes(g, (d["N"], 4), 0.0, 1333.0, 800.0),
            "tblr": _uniform(g, (d["B"], d["N"], 4), 0.0, 0.5),
            "max_shape": torch.tensor([800.0, 1333.0]),
        },
        cases=({"B": 2, "N": 8400},),
        output_names=("bboxes",),
        opset=13,
        input_hints={
            "priors": _hint_boxes(0.0, 1333.0, 800.0),
            "tblr": {"kind": "uniform", "range": [0.0, 0.5]},
            "max_shape": {"kind": "const", "value": [800.0, 1333.0], "note": "(h, w)"},
        },
        description="TBLR decoder: priors (8400, 4) with tblr (2, 8400, 4), normalizer 4, split/cat per "
        "side, Clip with run-time max from a max_shape input.",
        source="mmdet TBLRBBoxCoder.decode → tblr2bboxes (normalize_by_wh, dynamic_clip_for_onnx)",
    ),
    # ------------------------------------------------------------------------- EasyView hotspots, no writes
    Spec(
        name="gen_base_anchors",
        make_module=det.GenBaseAnchors,
        make_inputs=lambda g, d: {
            "scales": torch.tensor([2 ** (i / d["S"]) for i in range(d["S"])]) * 4.0,
            "ratios": torch.tensor([0.5, 1.0, 2.0][: d["R"]]),
        },
        cases=({"S": 3, "R": 3},),
        output_names=("base_anchors",),
        input_hints={
            "scales": {"kind": "const", "value": [4.0, 5.0397, 6.3496], "note": "positive"},
            "ratios": {"kind": "const", "value": [0.5, 1.0, 2.0], "note": "positive (sqrt)"},
        },
        description="Base anchors of one level (stride 8) from 3 octave scales × 3 ratios → (9, 4): sqrt, "
        "reciprocal, outer products, view, stack. Tiny: measures launch overhead.",
        source="mmdet AnchorGenerator.gen_single_level_base_anchors (EasyView gen_base_anchors hotspot)",
    ),
    Spec(
        name="map_roi_levels",
        make_module=det.MapRoiLevels,
        make_inputs=lambda g, d: {
            "rois": torch.cat([torch.zeros(d["N"], 1), _boxes(g, (d["N"], 4), 0.0, 1333.0, 800.0)], dim=1)
        },
        cases=({"N": 1000},),
        output_names=("target_lvls",),
        input_hints={"rois": {"kind": "rois", "note": "column 0 batch index, columns 1:5 boxes x1y1x2y2"}},
        description="FPN level of 1000 rois (N, 5): column Gathers, sqrt of area, log2, floor, clamp, cast "
        "to int64. Random normal rois give NaN (sqrt of negative) and an undefined cast.",
        source="mmdet SingleRoIExtractor.map_roi_levels (EasyView map_roi_levels hotspot)",
    ),
    Spec(
        name="embedding_normalize",
        make_module=det.EmbeddingNormalize,
        make_inputs=lambda g, d: {"emb": torch.randn(1, 512, d["H"], d["W"], generator=g)},
        cases=({"H": 38, "W": 68}, {"H": 19, "W": 34}),
        output_names=("embeddings",),
        dynamic_axes={"emb": {2: "H", 3: "W"}, "embeddings": {1: "H", 2: "W"}},
        input_hints={"emb": HINT_NORMAL},
        description="JDE identity embeddings of one level (512 channels, 38×68 for a 608×1088 input), permuted "
        "to channels-last and L2-normalised per location — a reduction feeding an elementwise consumer.",
        source="Zhongdao/Towards-Realtime-MOT models.py YOLOLayer (F.normalize of p_emb)",
    ),
    Spec(
        name="detr_postprocess",
        make_module=det.DetrPostProcess,
        make_inputs=lambda g, d: {
            "pred_logits": torch.randn(d["B"], d["Q"], 92, generator=g) * 3.0,
            "pred_boxes": _uniform(g, (d["B"], d["Q"], 4), 0.05, 0.95),
            "target_sizes": _uniform(g, (d["B"], 2), 480.0, 1333.0).round(),
        },
        cases=({"B": 8, "Q": 300}, {"B": 2, "Q": 100}),
        output_names=("scores", "labels", "boxes"),
        dynamic_axes={"pred_logits": {0: "B", 1: "Q"}, "pred_boxes": {0: "B", 1: "Q"},
                      "target_sizes": {0: "B"}, "scores": {0: "B", 1: "Q"}, "labels": {0: "B", 1: "Q"},
                      "boxes": {0: "B", 1: "Q"}},
        input_hints={"pred_logits": {"kind": "normal", "mean": 0.0, "std": 3.0},
                     "pred_boxes": {"kind": "uniform", "range": [0.05, 0.95], "note": "normalised cx, cy, w, h"},
                     "target_sizes": {"kind": "uniform", "range": [480.0, 1333.0], "note": "(h, w) per image"}},
        description="DETR post-processing for B images × Q queries × 92 classes: softmax over classes, max and "
        "argmax over the 91 real classes, cxcywh → xyxy scaled per image — a softmax feeding reductions.",
        source="facebookresearch/detr models/detr.py PostProcess",
    ),
    Spec(
        name="score_filter",
        make_module=det.ScoreFilter,
        make_inputs=lambda g, d: {"prediction": _uniform(g, (d["B"], d["N"], 85), 0.0, 1.0)},
        cases=({"B": 1, "N": 25200}, {"B": 2, "N": 8400}),
        output_names=("candidates",),
        dynamic_axes={"prediction": {0: "B", 1: "N"}, "candidates": {0: "B", 1: "N"}},
        input_hints={"prediction": {"kind": "uniform", "range": [0.0, 1.0],
                                    "note": "decoded YOLOv5 output: xywh, objectness, 80 class scores"}},
        description="YOLOv5 pre-NMS candidate table (B, 25,200, 6): conf = obj × cls, max and argmax over 80 "
        "classes, xywh → xyxy, concat, zeroed below 0.25 — reductions feeding elementwise consumers.",
        source="ultralytics/yolov5 utils/general.py non_max_suppression (before NMS)",
    ),
    # ----------------------------------------------------------------------------- slice-assignment set
    Spec(
        name="offset2bbox_inplace",
        make_module=det.Offset2BBoxInplace,
        make_inputs=lambda g, d: {
            "points": _uniform(g, (d["N"], 2), 0.0, 800.0),
            "offsets": torch.randn(d["N"], 4, generator=g) * 4.0,
        },
        cases=({"N": 4000}, {"N": 3000}),
        output_names=("boxes",),
        writes=True,
        dynamic_axes={"points": {0: "N"}, "offsets": {0: "N"}, "boxes": {0: "N"}},
        input_hints={
            "points": {"kind": "uniform", "range": [0.0, 800.0]},
            "offsets": {"kind": "normal", "mean": 0.0, "std": 4.0},
        },
        description="Point+offset decoder writing boxes[:, 0::2] and boxes[:, 1::2] of a new_zeros "
        "(N, 4), N=4000 (symbolic).",
        source="EasyView offset2bbox hotspot (decoder with slice assignment, 4000×4)",
    ),
    Spec(
        name="valid_flags_inplace",
        make_module=det.ValidFlagsInplace,
        make_inputs=lambda g, d: {"feat": torch.randn(1, 8, d["H"], d["W"], generator=g)},
        cases=({"H": 168, "W": 200}, {"H": 176, "W": 208}),
        output_names=("valid",),
        writes=True,
        dynamic_axes={"feat": {2: "H", 3: "W"}, "valid": {0: "N"}},
        input_hints={"feat": {**HINT_SHAPE_ONLY, "min_shape": [1, 1, 163, 194]}},
        description="Valid mask of one stride-8 level (168×200×3 = 100,800): zeros(bool) with "
        "valid_x[:194] = 1, valid_y[:163] = 1 (constants from pad_shape), repeat-meshgrid, &, expand. "
        "H ≥ 163 and W ≥ 194 are required at run time (the write indices are export-time constants).",
        source="mmdet 2.x AnchorGenerator.single_level_valid_flags (as written)",
    ),
    Spec(
        name="clamp_inplace",
        make_module=det.ClampInplace,
        make_inputs=lambda g, d: {"boxes": _boxes(g, (d["N"], 4), -100.0, 1333.0, 800.0)},
        cases=({"N": 100000}, {"N": 1000}),
        output_names=("clamped",),
        opset=13,
        writes=True,
        dynamic_axes={"boxes": {0: "N"}, "clamped": {0: "N"}},
        input_hints={"boxes": _hint_boxes(-100.0, 1333.0, 800.0)},
        description="boxes[:, 0::2] = boxes[:, 0::2].clamp(0, 1333); boxes[:, 1::2] = ....clamp(0, 800) on "
        "(100000, 4).",
        source="torchvision clip_boxes_to_image / mmdet bbox clip, slice-assignment form",
    ),
    Spec(
        name="yolov5_inplace_decode",
        make_module=det.Yolov5InplaceDecode,
        make_inputs=_yolo_inputs,
        cases=_yolo_cases(),
        output_names=("output",),
        opset=13,
        writes=True,
        dynamic_axes={**{f"x{i}": _LEVEL_AXES[f"x{i}"] for i in range(3)}, "output": {1: "A"}},
        input_hints={f"x{i}": HINT_NORMAL for i in range(3)},
        description="YOLOv5 Detect decode with inplace=True: y[..., 0:2] = ...; y[..., 2:4] = ... per level "
        "(ScatterND), 3 levels → (1, 25200, 85) at 640×640, H/W symbolic.",
        source="ultralytics yolov5 models/yolo.py Detect.forward (inplace=True, export --inplace --dynamic)",
    ),
    Spec(
        name="delta2bbox_inplace",
        make_module=det.BoxCoderDecodeInplace,
        make_inputs=lambda g, d: {
            "rel_codes": torch.randn(d["N"], 4 * d["C"], generator=g),
            "boxes": _boxes(g, (d["N"], 4), 0.0, 1333.0, 800.0),
        },
        cases=({"N": 1000, "C": 81}, {"N": 300, "C": 81}),
        output_names=("pred_boxes",),
        writes=True,
        dynamic_axes={"rel_codes": {0: "N"}, "boxes": {0: "N"}, "pred_boxes": {0: "N"}},
        input_hints={"rel_codes": HINT_NORMAL, "boxes": _hint_boxes(0.0, 1333.0, 800.0)},
        description="R-CNN class-specific box decoder, 1000 proposals × 81 classes (N symbolic): step-4 "
        "slices, clamp, exp, four writes pred_boxes[:, k::4] = ... into zeros_like (1000, 324).",
        source="maskrcnn-benchmark BoxCoder.decode (the eager delta2bbox EasyView measured)",
    ),
    # ----------------------------------------------------------------------------- dynamo exporter variants
    Spec(
        name="delta2bbox_dynamo",
        make_module=det.Delta2BBox,
        make_inputs=_delta2bbox_inputs,
        cases=({"B": 2, "N": 20000}, {"B": 1, "N": 20000}, {"B": 3, "N": 20000}),
        output_names=("bboxes",),
        opset=18,
        exporter="dynamo",
        dynamic_axes={"rois": {0: "B"}, "deltas": {0: "B"}, "bboxes": {0: "B"}},
        input_hints={"rois": _hint_boxes(0.0, 1333.0, 800.0), "deltas": HINT_NORMAL},
        description="Same function as delta2bbox, exported by the torch.export-based (dynamo) exporter with "
        "symbolic batch B.",
        source="mmdet 2.x DeltaXYWHBBoxCoder.decode → delta2bbox (ONNX/dynamic_clip_for_onnx path)",
    ),
    Spec(
        name="yolo_decode_dynamo",
        make_module=det.YoloDecode,
        make_inputs=_yolo_inputs,
        cases=_yolo_cases(),
        output_names=("output",),
        opset=18,
        exporter="dynamo",
        dynamic_axes={**{f"x{i}": _LEVEL_AXES[f"x{i}"] for i in range(3)}, "output": {1: "A"}},
        input_hints={f"x{i}": HINT_NORMAL for i in range(3)},
        description="Same function as yolo_decode, exported by the dynamo exporter with symbolic H/W.",
        source="ultralytics yolov5 models/yolo.py Detect.forward + _make_grid (inplace=False, --dynamic)",
    ),
    Spec(
        name="distance2bbox_dynamo",
        make_module=det.Distance2BBox,
        make_inputs=_distance2bbox_inputs,
        cases=({"B": 8},),
        output_names=("bboxes",),
        opset=18,
        exporter="dynamo",
        input_hints={
            "points": {
                "kind": "grid_points",
                "range": [0.0, 640.0],
                "note": "cell centres of 80/40/20 grids",
            },
            "distance": {"kind": "uniform", "range": [0.0, 200.0]},
            "max_shape": {"kind": "uniform", "range": [480.0, 640.0], "note": "(h, w) per image"},
        },
        description="Same function as distance2bbox, exported by the dynamo exporter (static shapes).",
        source="mmdet distance2bbox (FCOS/GFL/YOLOv8 heads; tensor max_shape clip path)",
    ),
    # ------------------------------------------------------ EasyView hotspots at the paper's measured shapes
    # The seven MMDetection functions EasyView timed (V100, Parrots eager vs EasyView), each at the shape the
    # paper reports; the modules are the ones above. Static shapes, except valid_flags (static H/W fold it to a
    # constant). offset2bbox is `offset2bbox_inplace` itself: its N is symbolic, with the paper's 4000 a case.
    Spec(
        name="easyview_bbox2offset",
        make_module=det.BBox2Delta,
        make_inputs=lambda g, d: {
            "proposals": _boxes(g, (d["N"], 4), 0.0, 1333.0, 800.0),
            "gt": _boxes(g, (d["N"], 4), 0.0, 1333.0, 800.0),
        },
        cases=({"N": 3000},),
        output_names=("deltas",),
        opset=18,
        input_hints={"proposals": _hint_boxes(0.0, 1333.0, 800.0), "gt": _hint_boxes(0.0, 1333.0, 800.0)},
        description="EasyView bbox2offset hotspot (R-CNN box encoder) at the paper's 3000×4: proposals and gt "
        "(3000, 4) → normalised deltas (3000, 4). Same graph pattern as bbox2delta.",
        source="mmdet DeltaXYWHBBoxCoder.encode → bbox2delta (EasyView bbox2offset, 3000×4)",
    ),
    Spec(
        name="easyview_delta2bbox",
        make_module=det.Delta2BBox,
        make_inputs=lambda g, d: {
            "rois": _boxes(g, (d["N"], 4), 0.0, 1333.0, 800.0),
            "deltas": torch.randn(d["N"], 4, generator=g),
        },
        cases=({"N": 3000},),
        output_names=("bboxes",),
        input_hints={"rois": _hint_boxes(0.0, 1333.0, 800.0), "deltas": HINT_NORMAL},
        description="EasyView delta2bbox hotspot at the paper's 3000×4: unbatched rois and deltas (3000, 4), "
        "step-4 slices, expand_as, clamp(±log(1000/16)), exp, clip to (800, 1333), stack, view.",
        source="mmdet 2.x DeltaXYWHBBoxCoder.decode → delta2bbox (EasyView delta2bbox, 3000×4)",
    ),
    Spec(
        name="easyview_gen_base_anchors",
        make_module=det.GenBaseAnchorsSizeInput,
        make_inputs=lambda g, d: {
            "base_size": torch.tensor(4.0),
            "scales": torch.tensor([8.0] * d["S"]),
            "ratios": torch.tensor([0.5, 1.0, 2.0][: d["R"]]),
        },
        cases=({"S": 1, "R": 3},),
        output_names=("base_anchors",),
        input_hints={
            "base_size": {"kind": "const", "value": [4.0], "note": "0-d float: the level's base size (stride)"},
            "scales": {"kind": "const", "value": [8.0], "note": "positive"},
            "ratios": {"kind": "const", "value": [0.5, 1.0, 2.0], "note": "positive (sqrt)"},
        },
        description="EasyView gen_base_anchors hotspot at the paper's 3×1 (3 ratios × 1 scale, the Faster "
        "R-CNN RPN setting) → (3, 4), with base_size a 0-d float input: sqrt, reciprocal, outer products "
        "scaled by the scalar, view, stack.",
        source="mmdet AnchorGenerator.gen_single_level_base_anchors (EasyView gen_base_anchors, 3×1)",
    ),
    Spec(
        name="easyview_map_roi_levels",
        make_module=det.MapRoiLevels,
        make_inputs=lambda g, d: {
            "rois": torch.cat([torch.zeros(d["N"], 1), _boxes(g, (d["N"], 4), 0.0, 1333.0, 800.0)], dim=1)
        },
        cases=({"N": 20},),
        output_names=("target_lvls",),
        input_hints={"rois": {"kind": "rois", "note": "column 0 batch index, columns 1:5 boxes x1y1x2y2"}},
        description="EasyView map_roi_levels hotspot at the paper's 20×5: FPN level of 20 rois, column "
        "Gathers, sqrt of area, log2, floor, clamp, cast to int64.",
        source="mmdet SingleRoIExtractor.map_roi_levels (EasyView map_roi_levels, 20×5)",
    ),
    Spec(
        name="easyview_tblr2bbox",
        make_module=det.TBLR2BBox,
        make_inputs=lambda g, d: {
            "priors": _boxes(g, (d["N"], 4), 0.0, 1333.0, 800.0),
            "tblr": _uniform(g, (d["N"], 4), 0.0, 0.5),
            "max_shape": torch.tensor([800.0, 1333.0]),
        },
        cases=({"N": 128},),
        output_names=("bboxes",),
        opset=13,
        input_hints={
            "priors": _hint_boxes(0.0, 1333.0, 800.0),
            "tblr": {"kind": "uniform", "range": [0.0, 0.5]},
            "max_shape": {"kind": "const", "value": [800.0, 1333.0], "note": "(h, w)"},
        },
        description="EasyView tblr2bbox hotspot at the paper's 128×4: priors and tblr (128, 4), normalizer 4, "
        "split/cat per side (the slice-free form of the `*=` writes), Clip by a max_shape input.",
        source="mmdet TBLRBBoxCoder.decode → tblr2bboxes (EasyView tblr2bbox, 128×4)",
    ),
    Spec(
        name="easyview_valid_flags",
        make_module=lambda: det.ValidFlagsInplace(pad_shape=(1250, 930)),
        make_inputs=lambda g, d: {"feat": torch.randn(1, 8, d["H"], d["W"], generator=g)},
        cases=({"H": 160, "W": 120}, {"H": 168, "W": 128}),
        output_names=("valid",),
        writes=True,
        dynamic_axes={"feat": {2: "H", 3: "W"}, "valid": {0: "N"}},
        input_hints={"feat": {**HINT_SHAPE_ONLY, "min_shape": [1, 1, 157, 117]}},
        description="EasyView valid_flags hotspot at the paper's 160×120×3 (57,600 flags), H/W symbolic (with "
        "static shapes the exporter folds the whole graph to a constant): zeros(bool) with valid_x[:117] = 1, "
        "valid_y[:157] = 1 (pad_shape 1250×930 at stride 8), repeat-meshgrid, &, expand. H ≥ 157, W ≥ 117.",
        source="mmdet 2.x AnchorGenerator.single_level_valid_flags (EasyView valid_flags, 160×120×3)",
    ),
)
