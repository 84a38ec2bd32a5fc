"""Detection post-processing heads in the styles of four more code bases, for the corpus (issue #9).

mmdetection (its dense heads as mmdeploy exports them), mmyolo (its ``projects/easydeploy`` export path),
YOLOX and the DETR family (DETR, Deformable-DETR, RT-DETR). None of these packages is installed: each module
below is written from the public source named in its ``Head.follows``, with the same tensor operations in the
same order, so the exporters see the same op patterns (Range/meshgrid grids, slice assignment, Gather,
Reshape/Transpose, Exp, Sigmoid, Softmax, TopK). Every module takes the raw head outputs (what
``predict_by_feat`` or ``PostProcess`` receives) and returns decoded boxes and scores. No NMS: two entries end
in a top-k selection (mmdeploy's ``nms_pre`` and the Deformable-DETR / RT-DETR ``PostProcess``).

``models/corpus.py`` exports each head through both torch.onnx exporters at several opsets (see ``VARIANTS``)
and draws the inputs from ``Head.inputs`` (see ``TensorSpec.sample``). Nothing imports this module except it.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from corpus_head_modules import (  # noqa: E402  (sibling module: the heads' code; models/ is not a package)
    IMG,
    NUM_CLASSES,
    STRIDES3,
    STRIDES5,
    DeformableDETRPostProcess,
    DETRPostProcess,
    MMDetDenseHead,
    MMYOLOHead,
    RTDETRPostProcessor,
    YOLOXDecode,
)
from torch import nn


# ---------------------------------------------------------------------------------------------------------
# the input recipe
# ---------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class TensorSpec:
    """One head output fed to the module: batch-first shape, and the distribution it is drawn from."""

    name: str
    shape: tuple[int, ...]  # without the batch dim
    dist: str  # "normal" (a=loc, b=scale) | "uniform" (a=low, b=high) | "integers" (a=low, b=high, exclusive)
    a: float
    b: float
    note: str = ""

    def sample(self, rng: np.random.Generator, batch: int) -> np.ndarray:
        shape = (batch, *self.shape)
        if self.dist == "normal":
            return rng.normal(self.a, self.b, shape).astype(np.float32)
        if self.dist == "uniform":
            return rng.uniform(self.a, self.b, shape).astype(np.float32)
        if self.dist == "integers":
            return rng.integers(int(self.a), int(self.b), shape, dtype=np.int64)
        raise ValueError(f"unknown distribution {self.dist!r} for {self.name}")

    def record(self) -> dict[str, Any]:
        r: dict[str, Any] = {"name": self.name, "shape": ["batch", *self.shape], "distribution": self.dist,
                             "params": [self.a, self.b],
                             "dtype": "int64" if self.dist == "integers" else "float32"}
        if self.note:
            r["note"] = self.note
        return r


def sample_inputs(specs: tuple[TensorSpec, ...], seed: int, batch: int) -> dict[str, np.ndarray]:
    """All inputs of one head, drawn in order from one generator: the same arrays for export and check."""
    rng = np.random.default_rng(seed)
    return {s.name: s.sample(rng, batch) for s in specs}


SAMPLING = ("numpy.random.default_rng(seed); for each input in order: rng.normal(loc, scale, (batch, *shape)) | "
            "rng.uniform(low, high, ...) | rng.integers(low, high, ..., dtype=int64); floats cast to float32")


@dataclass(frozen=True)
class Head:
    """One post-processing module and where its code comes from."""

    name: str
    codebase: str  # "mmdetection" | "mmyolo" | "yolox" | "detr"
    follows: tuple[str, ...]  # URLs of the files (pinned commits where the stored copy had one)
    what: str
    make: Callable[[], nn.Module]
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[str, ...]
    notes: str = ""


def _levels(strides: tuple[int, ...]) -> list[tuple[int, int, int]]:
    return [(s, IMG // s, IMG // s) for s in strides]


def _per_level(prefix: str, strides: tuple[int, ...], channels: int, dist: str, a: float, b: float,
               note: str = "", stride_scaled: bool = False) -> list[TensorSpec]:
    """One input per level, (C, H, W); with ``stride_scaled`` the distribution's parameters are times the stride."""
    out = []
    for i, (s, h, w) in enumerate(_levels(strides)):
        k = s if stride_scaled else 1
        out.append(TensorSpec(f"{prefix}{i}", (channels, h, w), dist, a * k, b * k, note))
    return out


# ---------------------------------------------------------------------------------------------------------
# the heads
# ---------------------------------------------------------------------------------------------------------
GH = "https://github.com/"
MMDET = GH + "open-mmlab/mmdetection/blob/main/mmdet/"
MMDEPLOY = GH + "open-mmlab/mmdeploy/blob/0143c8d0a42b27b402993979bc819035d474b40c/mmdeploy/codebase/mmdet/"
MMYOLO = GH + "open-mmlab/mmyolo/blob/main/"
LOGIT = "logits ~ N(-2, 2): mostly background, a few confident cells"


def _detr_inputs(queries: int, classes: int) -> tuple[TensorSpec, ...]:
    return (TensorSpec("pred_logits", (queries, classes), "normal", 0.0, 2.0, "class logits ~ N(0, 2)"),
            TensorSpec("pred_boxes", (queries, 4), "uniform", 0.05, 0.95, "normalized cxcywh in (0, 1), the "
                       "sigmoid output of the box MLP"),
            TensorSpec("target_sizes", (2,), "integers", 320, 1334, "int64 (h, w) of the original images"))


# The raw outputs of YOLOX's head (both decode forms read the same)
_YOLOX_INPUTS = (*_per_level("reg_output", STRIDES3, 4, "normal", 0.0, 0.5, "xy offsets / log wh ~ N(0, 0.5)"),
                 *_per_level("obj_output", STRIDES3, 1, "normal", -2.0, 2.0, "objectness logits ~ N(-2, 2)"),
                 *_per_level("cls_output", STRIDES3, NUM_CLASSES, "normal", -2.0, 2.0, LOGIT))

HEADS: tuple[Head, ...] = (
    Head("mmdet_retinanet", "mmdetection",
         (MMDEPLOY + "models/dense_heads/base_dense_head.py",
          MMDET + "models/task_modules/prior_generators/anchor_generator.py",
          MMDET + "models/task_modules/coders/delta_xywh_bbox_coder.py"),
         "mmdet RetinaNet head decode as mmdeploy exports it (with_nms=False): 9 anchors x 5 levels, sigmoid, "
         "onnx_delta2bbox clipped to 640x640; (B,76725,4) boxes, (B,76725,80) scores",
         lambda: MMDetDenseHead("retinanet"),
         (*_per_level("cls_score", STRIDES5, 9 * NUM_CLASSES, "normal", -2.0, 2.0, LOGIT),
          *_per_level("bbox_pred", STRIDES5, 9 * 4, "normal", 0.0, 0.5, "deltas ~ N(0, 0.5), stds 1")),
         ("bboxes", "scores")),
    Head("mmdet_retinanet_topk", "mmdetection",
         (MMDEPLOY + "models/dense_heads/base_dense_head.py", MMDEPLOY + "deploy/utils.py",
          MMDET + "models/task_modules/prior_generators/anchor_generator.py",
          MMDET + "models/task_modules/coders/delta_xywh_bbox_coder.py"),
         "as mmdet_retinanet with RetinaNet's test_cfg nms_pre=1000: per level TopK of the best class score and "
         "batched gather_topk (the 10x10 and 5x5 levels keep all 900 and 225); (B,4125,4), (B,4125,80)",
         lambda: MMDetDenseHead("retinanet", pre_topk=1000),
         (*_per_level("cls_score", STRIDES5, 9 * NUM_CLASSES, "normal", -2.0, 2.0, LOGIT),
          *_per_level("bbox_pred", STRIDES5, 9 * 4, "normal", 0.0, 0.5, "deltas ~ N(0, 0.5), stds 1")),
         ("bboxes", "scores"),
         "k = min(1000, anchors of the level) is a Python int at export time (mmdeploy's own topk rewrite makes "
         "k a tensor, which torch.export cannot take)"),
    Head("mmdet_fcos", "mmdetection",
         (MMDEPLOY + "models/dense_heads/base_dense_head.py",
          MMDET + "models/task_modules/prior_generators/point_generator.py",
          MMDET + "models/task_modules/coders/distance_point_bbox_coder.py",
          MMDET + "structures/bbox/transforms.py"),
         "mmdet FCOS head decode as mmdeploy exports it (with_nms=False): points offset 0.5 x 5 levels, "
         "distance2bbox clipped to 640x640, sigmoid scores times sigmoid centerness; (B,8525,4), (B,8525,80)",
         lambda: MMDetDenseHead("fcos"),
         (*_per_level("cls_score", STRIDES5, NUM_CLASSES, "normal", -2.0, 2.0, LOGIT),
          *_per_level("bbox_pred", STRIDES5, 4, "uniform", 0.0, 8.0, "ltrb distances in pixels, U(0, 8 x stride) "
                      "(FCOS forward: relu(x) * stride)", stride_scaled=True),
          *_per_level("centerness", STRIDES5, 1, "normal", 0.0, 2.0, "centerness logits ~ N(0, 2)")),
         ("bboxes", "scores")),
    Head("mmyolo_yolov5", "mmyolo",
         (MMYOLO + "projects/easydeploy/model/model.py", MMYOLO + "projects/easydeploy/bbox_code/bbox_coder.py",
          MMYOLO + "mmyolo/models/dense_heads/yolov5_head.py",
          MMDET + "models/task_modules/prior_generators/anchor_generator.py"),
         "mmyolo YOLOv5 head, easydeploy pred_by_feat without NMS: YOLOAnchorGenerator priors, sigmoid decode, "
         "cls x obj; (B,25200,4) cxcywh, (B,25200,80)",
         lambda: MMYOLOHead("yolov5"),
         (*_per_level("cls_score", STRIDES3, 3 * NUM_CLASSES, "normal", -2.0, 2.0, LOGIT),
          *_per_level("bbox_pred", STRIDES3, 3 * 4, "normal", 0.0, 1.0, "box logits ~ N(0, 1) (sigmoided)"),
          *_per_level("objectness", STRIDES3, 3, "normal", -2.0, 2.0, "objectness logits ~ N(-2, 2)")),
         ("bboxes", "scores")),
    Head("mmyolo_yolov8", "mmyolo",
         (MMYOLO + "projects/easydeploy/model/model.py", MMYOLO + "mmyolo/models/dense_heads/yolov8_head.py",
          MMYOLO + "mmyolo/models/task_modules/coders/distance_point_bbox_coder.py",
          MMDET + "models/task_modules/prior_generators/point_generator.py"),
         "mmyolo YOLOv8 head: YOLOv8HeadModule DFL (softmax over 16 bins, matmul arange) + easydeploy pred_by_feat "
         "without NMS (points offset 0.5, distance x stride); (B,8400,4), (B,8400,80)",
         lambda: MMYOLOHead("yolov8"),
         (*_per_level("cls_score", STRIDES3, NUM_CLASSES, "normal", -2.0, 2.0, LOGIT),
          *_per_level("bbox_dist", STRIDES3, 4 * 16, "normal", 0.0, 2.0, "DFL bin logits ~ N(0, 2), 4 x 16 bins")),
         ("bboxes", "scores")),
    Head("mmyolo_rtmdet", "mmyolo",
         (MMYOLO + "projects/easydeploy/model/model.py", MMYOLO + "projects/easydeploy/bbox_code/bbox_coder.py",
          MMYOLO + "mmyolo/models/dense_heads/rtmdet_head.py"),
         "mmyolo RTMDet head, easydeploy pred_by_feat without NMS: points offset 0, rtmdet_bbox_decoder; "
         "(B,8400,4), (B,8400,80)",
         lambda: MMYOLOHead("rtmdet"),
         (*_per_level("cls_score", STRIDES3, NUM_CLASSES, "normal", -2.0, 2.0, LOGIT),
          *_per_level("bbox_pred", STRIDES3, 4, "uniform", 0.0, 8.0, "ltrb distances in pixels, U(0, 8 x stride) "
                      "(the head module multiplies by the stride)", stride_scaled=True)),
         ("bboxes", "scores")),
    Head("yolox_decode", "yolox",
         (GH + "Megvii-BaseDetection/YOLOX/blob/6ddff4824372906469a7fae2dc3206c7aa4bbaee/yolox/models/yolo_head.py",),
         "YOLOX head eval tail with decode_in_inference=True (export_onnx.py --decode_in_inference), torch.cat "
         "decode_outputs (current YOLOX); (B,8400,85)",
         lambda: YOLOXDecode(inplace=False),
         _YOLOX_INPUTS,
         ("output",)),
    Head("yolox_decode_inplace", "yolox",
         (GH + "Megvii-BaseDetection/YOLOX/blob/419778480ab6ec0590e5d3831b3afb3b46ab2aa3/yolox/models/yolo_head.py",),
         "YOLOX 0.3.0 head eval tail, decode_outputs with slice assignment outputs[..., :2] = ..., "
         "outputs[..., 2:4] = exp(...) * strides; (B,8400,85)",
         lambda: YOLOXDecode(inplace=True),
         _YOLOX_INPUTS,
         ("output",)),
    Head("detr_postprocess", "detr",
         (GH + "facebookresearch/detr/blob/0217b40fb8064f6118aa9a92ae29c1ce87b0798f/models/detr.py",
          GH + "facebookresearch/detr/blob/main/util/box_ops.py"),
         "DETR PostProcess: softmax over 92 logits, drop no-object, max; cxcywh to xyxy scaled by (w, h, w, h); "
         "100 queries",
         lambda: DETRPostProcess(), _detr_inputs(100, 92), ("scores", "labels", "boxes")),
    Head("deformable_detr_postprocess", "detr",
         (GH + "fundamentalvision/Deformable-DETR/blob/1212c970d85a11132bd77a4785e903c961037d01/models/"
          "deformable_detr.py",),
         "Deformable-DETR PostProcess: sigmoid, top-100 over 300 queries x 91 classes, // and % for query and "
         "label, gather of the xyxy boxes, scale",
         lambda: DeformableDETRPostProcess(100), _detr_inputs(300, 91), ("scores", "labels", "boxes")),
    Head("rtdetr_postprocessor", "detr",
         (GH + "lyuwenyu/RT-DETR/blob/0aa14ccc9192bf3cb296422ab9514f9626591179/rtdetrv2_pytorch/src/zoo/rtdetr/"
          "rtdetr_postprocessor.py", GH + "pytorch/vision/blob/main/torchvision/ops/_box_convert.py"),
         "RT-DETRv2 RTDETRPostProcessor deploy mode: box_convert, in-place bbox_pred *= sizes, sigmoid, top-300 "
         "over 300 x 80, mod and //, gather",
         lambda: RTDETRPostProcessor(), _detr_inputs(300, NUM_CLASSES), ("labels", "boxes", "scores"),
         "orig_target_sizes is (w, h) in RT-DETR; the recipe draws both from the same range"),
)
HEADS_BY_NAME = {h.name: h for h in HEADS}

# (exporter, opset, dynamic batch) for every head. 20 is the newest opset both exporters take in torch 2.14
# (torch.onnx._constants.ONNX_TORCHSCRIPT_EXPORTER_MAX_OPSET); 18 is the dynamo exporter's default and its
# lowest: asked for 13 (or 17) it warns, exports at 18 and hands the model to the version converter, which
# failed on every head here ("No Adapter From Version $16 for Identity", "No Previous Version of CastLike
# exists", ...) and left a file byte-identical to the opset-18 one. So opset 13 is TorchScript only.
VARIANTS: tuple[tuple[str, int, bool], ...] = (
    ("torchscript", 13, False), ("torchscript", 17, False), ("torchscript", 17, True), ("torchscript", 20, True),
    ("dynamo", 18, False), ("dynamo", 18, True), ("dynamo", 20, True),
)


def export(head: Head, exporter: str, opset: int, dynamic: bool, path: str, seed: int) -> dict[str, Any]:
    """Export one head to ``path``; return the exporter call as recorded in the manifest."""
    torch.manual_seed(seed)
    model = head.make().eval()
    # torch.export specializes a size-1 dim that the code broadcasts or writes into ("your code specialized it
    # to be a constant (1)"), so a dynamic batch is traced at 2, as its docs advise; everything else at 1
    example_batch = 2 if exporter == "dynamo" and dynamic else 1
    arrays = sample_inputs(head.inputs, seed, example_batch)
    args = tuple(torch.from_numpy(a) for a in arrays.values())
    names = [s.name for s in head.inputs]
    varargs = any(p.kind is p.VAR_POSITIONAL for p in inspect.signature(model.forward).parameters.values())
    kw: dict[str, Any] = {"opset_version": opset, "input_names": names, "output_names": list(head.outputs)}
    if exporter == "torchscript":
        kw["dynamo"] = False
        if dynamic:
            kw["dynamic_axes"] = {n: {0: "batch"} for n in [*names, *head.outputs]}
    else:
        kw["dynamo"] = True
        kw["external_data"] = False
        if dynamic:
            batch = torch.export.Dim("batch")
            per_input = tuple({0: batch} for _ in names)
            # torch.export matches dynamic_shapes to the parameters: ``*feats`` is one parameter holding a tuple
            kw["dynamic_shapes"] = (per_input,) if varargs else per_input
    with torch.no_grad():
        torch.onnx.export(model, args, path, **kw)
    shown = {k: v for k, v in kw.items() if k not in ("input_names", "output_names")}
    if "dynamic_shapes" in shown:
        per = f"({{0: torch.export.Dim('batch')}},) * {len(names)}"
        shown["dynamic_shapes"] = f"({per},)" if varargs else per
    if "dynamic_axes" in shown:
        shown["dynamic_axes"] = "{name: {0: 'batch'} for every input and output}"
    call = (f"torch.manual_seed({seed}); model = models/corpus_heads.py HEADS_BY_NAME[{head.name!r}].make().eval(); "
            f"torch.onnx.export(model, inputs (recipe at batch {example_batch}), f, input_names=[...], output_names="
            f"{list(head.outputs)}, " + ", ".join(f"{k}={v!s}" for k, v in shown.items()) + ")")
    return {"codebase": head.codebase, "version": "written from source (not installed)", "call": call,
            "follows": list(head.follows), "notes": "node metadata_props and doc strings stripped"
            + (f"; {head.notes}" if head.notes else "")}
