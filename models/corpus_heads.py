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
import torch.nn.functional as F
from torch import Tensor, nn

IMG = 640  # the input size all grids are sized for: strides 8/16/32 give 80/40/20, 64/128 give 10/5
STRIDES3 = (8, 16, 32)
STRIDES5 = (8, 16, 32, 64, 128)
NUM_CLASSES = 80


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
# mmdetection: prior generators and coders (mmdet 3.x), dense-head decode as mmdeploy rewrites it
# ---------------------------------------------------------------------------------------------------------
def _mmdet_meshgrid(x: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
    """AnchorGenerator._meshgrid, row major: repeat instead of torch.meshgrid."""
    xx = x.repeat(y.shape[0])
    yy = y.view(-1, 1).repeat(1, x.shape[0]).view(-1)
    return xx, yy


def _gen_base_anchors(base_size: float, scales: Tensor, ratios: Tensor, center: tuple[float, float]) -> Tensor:
    """AnchorGenerator.gen_single_level_base_anchors (scale_major=True), computed once at construction."""
    w = h = base_size
    x_center, y_center = center
    h_ratios = torch.sqrt(ratios)
    w_ratios = 1 / h_ratios
    ws = (w * w_ratios[:, None] * scales[None, :]).view(-1)
    hs = (h * h_ratios[:, None] * scales[None, :]).view(-1)
    base_anchors = [x_center - 0.5 * ws, y_center - 0.5 * hs, x_center + 0.5 * ws, y_center + 0.5 * hs]
    return torch.stack(base_anchors, dim=-1)


class AnchorGrid:
    """mmdet AnchorGenerator.single_level_grid_priors with its base anchors as constant tensors."""

    def __init__(self, strides: tuple[int, ...], base_anchors: list[Tensor]) -> None:
        self.strides = strides
        self.base_anchors = base_anchors

    def grid_priors(self, featmap_sizes: list[Any], dtype: torch.dtype) -> list[Tensor]:
        out = []
        for i, (feat_h, feat_w) in enumerate(featmap_sizes):
            base_anchors = self.base_anchors[i].to(dtype)
            stride = self.strides[i]
            # First create Range with the default dtype, then convert to the target dtype (mmdet's comment)
            shift_x = torch.arange(0, feat_w).to(dtype) * stride
            shift_y = torch.arange(0, feat_h).to(dtype) * stride
            shift_xx, shift_yy = _mmdet_meshgrid(shift_x, shift_y)
            shifts = torch.stack([shift_xx, shift_yy, shift_xx, shift_yy], dim=-1)
            all_anchors = base_anchors[None, :, :] + shifts[:, None, :]
            out.append(all_anchors.view(-1, 4))
        return out


def retinanet_anchors() -> AnchorGrid:
    """RetinaNet's AnchorGenerator: octave_base_scale=4, scales_per_octave=3, ratios 0.5/1/2, center offset 0."""
    scales = torch.tensor([4 * 2 ** (i / 3) for i in range(3)])
    ratios = torch.tensor([0.5, 1.0, 2.0])
    return AnchorGrid(STRIDES5, [_gen_base_anchors(s, scales, ratios, (0.0, 0.0)) for s in STRIDES5])


YOLO_BASE_SIZES = (((10, 13), (16, 30), (33, 23)), ((30, 61), (62, 45), (59, 119)),
                   ((116, 90), (156, 198), (373, 326)))


def yolo_anchors() -> AnchorGrid:
    """mmdet YOLOAnchorGenerator as mmyolo's YOLOv5 config uses it: base sizes in pixels, centred at stride/2."""
    base = []
    for sizes, s in zip(YOLO_BASE_SIZES, STRIDES3, strict=True):
        xc = yc = s / 2.0
        base.append(torch.tensor([[xc - 0.5 * w, yc - 0.5 * h, xc + 0.5 * w, yc + 0.5 * h] for w, h in sizes]))
    return AnchorGrid(STRIDES3, base)


def point_grid_priors(featmap_sizes: list[Any], strides: tuple[int, ...], offset: float,
                      dtype: torch.dtype) -> list[Tensor]:
    """mmdet MlvlPointGenerator.single_level_grid_priors (with_stride=False): torch.meshgrid + reshape."""
    out = []
    for (feat_h, feat_w), stride in zip(featmap_sizes, strides, strict=True):
        shift_x = (torch.arange(0, feat_w) + offset) * stride
        shift_x = shift_x.to(dtype)
        shift_y = (torch.arange(0, feat_h) + offset) * stride
        shift_y = shift_y.to(dtype)
        yy, xx = torch.meshgrid(shift_y, shift_x, indexing="ij")
        shift_xx, shift_yy = xx.reshape(-1), yy.reshape(-1)  # mmdet: ".flatten() would cause error in ONNX"
        out.append(torch.stack([shift_xx, shift_yy], dim=-1))
    return out


def onnx_delta2bbox(rois: Tensor, deltas: Tensor, means: tuple[float, ...], stds: tuple[float, ...],
                    max_shape: tuple[int, int], wh_ratio_clip: float = 16 / 1000) -> Tensor:
    """mmdet onnx_delta2bbox (batched DeltaXYWHBBoxCoder.decode), clip by torch.where on a constant max_shape."""
    means_t = deltas.new_tensor(means).view(1, -1).repeat(1, deltas.size(-1) // 4)
    stds_t = deltas.new_tensor(stds).view(1, -1).repeat(1, deltas.size(-1) // 4)
    denorm_deltas = deltas * stds_t + means_t
    dx = denorm_deltas[..., 0::4]
    dy = denorm_deltas[..., 1::4]
    dw = denorm_deltas[..., 2::4]
    dh = denorm_deltas[..., 3::4]
    x1, y1 = rois[..., 0], rois[..., 1]
    x2, y2 = rois[..., 2], rois[..., 3]
    px = ((x1 + x2) * 0.5).unsqueeze(-1).expand_as(dx)
    py = ((y1 + y2) * 0.5).unsqueeze(-1).expand_as(dy)
    pw = (x2 - x1).unsqueeze(-1).expand_as(dw)
    ph = (y2 - y1).unsqueeze(-1).expand_as(dh)
    dx_width = pw * dx
    dy_height = ph * dy
    max_ratio = np.abs(np.log(wh_ratio_clip))
    dw = dw.clamp(min=-max_ratio, max=max_ratio)
    dh = dh.clamp(min=-max_ratio, max=max_ratio)
    gw = pw * dw.exp()
    gh = ph * dh.exp()
    gx = px + dx_width
    gy = py + dy_height
    x1 = gx - gw * 0.5
    y1 = gy - gh * 0.5
    x2 = gx + gw * 0.5
    y2 = gy + gh * 0.5
    bboxes = torch.stack([x1, y1, x2, y2], dim=-1).view(deltas.size())
    max_shape_t = x1.new_tensor(max_shape)[..., :2].type_as(x1)
    min_xy = x1.new_tensor(0)
    max_xy = torch.cat([max_shape_t] * (deltas.size(-1) // 2), dim=-1).flip(-1).unsqueeze(-2)
    bboxes = torch.where(bboxes < min_xy, min_xy, bboxes)
    bboxes = torch.where(bboxes > max_xy, max_xy, bboxes)
    return bboxes


def distance2bbox(points: Tensor, distance: Tensor, max_shape: tuple[int, int] | None = None) -> Tensor:
    """mmdet structures/bbox/transforms.py distance2bbox, batched path (torch.where clip)."""
    x1 = points[..., 0] - distance[..., 0]
    y1 = points[..., 1] - distance[..., 1]
    x2 = points[..., 0] + distance[..., 2]
    y2 = points[..., 1] + distance[..., 3]
    bboxes = torch.stack([x1, y1, x2, y2], -1)
    if max_shape is not None:
        max_shape_t = x1.new_tensor(max_shape)[..., :2].type_as(x1)
        min_xy = x1.new_tensor(0)
        max_xy = torch.cat([max_shape_t, max_shape_t], dim=-1).flip(-1).unsqueeze(-2)
        bboxes = torch.where(bboxes < min_xy, min_xy, bboxes)
        bboxes = torch.where(bboxes > max_xy, max_xy, bboxes)
    return bboxes


def gather_topk(x: Tensor, inds: Tensor, batch_size: int, is_batched: bool = True) -> Tensor:
    """mmdeploy codebase/mmdet/deploy/utils.py gather_topk: advanced indexing with a batch index."""
    if is_batched:
        batch_inds = torch.arange(batch_size, device=inds.device).unsqueeze(-1)
        return x[batch_inds, inds, ...]
    prior_inds = inds.new_zeros((1, 1))
    return x[prior_inds, inds, ...]


class MMDetDenseHead(nn.Module):
    """mmdeploy's rewrite of BaseDenseHead.predict_by_feat (default backend), with_nms=False.

    RetinaNet (anchors + DeltaXYWHBBoxCoder, sigmoid) or FCOS (points + DistancePointBBoxCoder, sigmoid
    scores times sigmoid centerness). ``pre_topk`` > 0 is the ``nms_pre`` path: per level, TopK over the
    best class score and a batched gather (mmdeploy ``gather_topk``).
    """

    def __init__(self, kind: str, pre_topk: int = -1) -> None:
        super().__init__()
        self.kind = kind
        self.pre_topk = pre_topk
        self.cls_out_channels = NUM_CLASSES
        self.img_shape = (IMG, IMG)
        self.anchors = retinanet_anchors() if kind == "retinanet" else None

    def forward(self, *feats: Tensor) -> tuple[Tensor, Tensor]:
        n = len(STRIDES5)
        cls_scores, bbox_preds = list(feats[:n]), list(feats[n:2 * n])
        score_factors = list(feats[2 * n:]) if self.kind == "fcos" else [None] * n
        featmap_sizes = [featmap.size()[-2:] for featmap in cls_scores]
        if self.anchors is not None:
            mlvl_priors = self.anchors.grid_priors(featmap_sizes, dtype=bbox_preds[0].dtype)
        else:  # FCOS: MlvlPointGenerator(strides, offset=0.5)
            mlvl_priors = point_grid_priors(featmap_sizes, STRIDES5, 0.5, bbox_preds[0].dtype)
        mlvl_priors = [priors.unsqueeze(0) for priors in mlvl_priors]
        batch_size = cls_scores[0].shape[0]
        mlvl_bboxes, mlvl_scores, mlvl_priors_kept, mlvl_factors = [], [], [], []
        for cls_score, bbox_pred, score_factor, priors in zip(cls_scores, bbox_preds, score_factors, mlvl_priors,
                                                                strict=True):
            scores = cls_score.permute(0, 2, 3, 1).reshape(batch_size, -1, self.cls_out_channels)
            scores = scores.sigmoid()
            if score_factor is not None:
                score_factor = score_factor.permute(0, 2, 3, 1).reshape(batch_size, -1).sigmoid()
                score_factor = score_factor.unsqueeze(2)
            bbox_pred = bbox_pred.permute(0, 2, 3, 1).reshape(batch_size, -1, 4)
            if self.pre_topk > 0:
                nms_pre_score = scores if score_factor is None else scores * score_factor
                max_scores, _ = nms_pre_score.max(-1)
                _, topk_inds = max_scores.topk(min(self.pre_topk, max_scores.shape[1]))
                bbox_pred = gather_topk(bbox_pred, topk_inds, batch_size)
                scores = gather_topk(scores, topk_inds, batch_size)
                if score_factor is not None:
                    score_factor = gather_topk(score_factor, topk_inds, batch_size)
                priors = gather_topk(priors, topk_inds, batch_size, is_batched=False)
            mlvl_bboxes.append(bbox_pred)
            mlvl_scores.append(scores)
            mlvl_priors_kept.append(priors)
            if score_factor is not None:
                mlvl_factors.append(score_factor)
        batch_bbox_preds = torch.cat(mlvl_bboxes, dim=1)
        batch_scores = torch.cat(mlvl_scores, dim=1)
        batch_priors = torch.cat(mlvl_priors_kept, dim=1)
        if self.anchors is not None:  # RetinaNet: target_means 0, target_stds 1
            batch_bboxes = onnx_delta2bbox(batch_priors, batch_bbox_preds, (0.0, 0.0, 0.0, 0.0),
                                           (1.0, 1.0, 1.0, 1.0), self.img_shape)
        else:
            batch_bboxes = distance2bbox(batch_priors, batch_bbox_preds, self.img_shape)
        if mlvl_factors:
            batch_scores = batch_scores * torch.cat(mlvl_factors, dim=1)
        return batch_bboxes, batch_scores


# ---------------------------------------------------------------------------------------------------------
# mmyolo: YOLOv5Head.predict_by_feat's batched part as projects/easydeploy DeployModel.pred_by_feat does it
# ---------------------------------------------------------------------------------------------------------
def yolov5_bbox_decoder(priors: Tensor, bbox_preds: Tensor, stride: Tensor) -> Tensor:
    """easydeploy bbox_code/bbox_coder.py: sigmoid, YOLOv5 centre/size decode, cxcywh out (box_coding=1)."""
    bbox_preds = bbox_preds.sigmoid()
    x_center = (priors[..., 0] + priors[..., 2]) * 0.5
    y_center = (priors[..., 1] + priors[..., 3]) * 0.5
    w = priors[..., 2] - priors[..., 0]
    h = priors[..., 3] - priors[..., 1]
    x_center_pred = (bbox_preds[..., 0] - 0.5) * 2 * stride + x_center
    y_center_pred = (bbox_preds[..., 1] - 0.5) * 2 * stride + y_center
    w_pred = (bbox_preds[..., 2] * 2) ** 2 * w
    h_pred = (bbox_preds[..., 3] * 2) ** 2 * h
    return torch.stack([x_center_pred, y_center_pred, w_pred, h_pred], dim=-1)


def rtmdet_bbox_decoder(priors: Tensor, bbox_preds: Tensor, stride: Tensor) -> Tensor:
    """easydeploy rtmdet_bbox_decoder: distances (already in pixels) around the points."""
    tl_x = priors[..., 0] - bbox_preds[..., 0]
    tl_y = priors[..., 1] - bbox_preds[..., 1]
    br_x = priors[..., 0] + bbox_preds[..., 2]
    br_y = priors[..., 1] + bbox_preds[..., 3]
    return torch.stack([tl_x, tl_y, br_x, br_y], -1)


def distance_point_decoder(priors: Tensor, bbox_preds: Tensor, stride: Tensor) -> Tensor:
    """mmyolo DistancePointBBoxCoder.decode (YOLOv8): distances in stride units times the stride."""
    bbox_preds = bbox_preds * stride[None, :, None]
    return distance2bbox(priors, bbox_preds, None)


class MMYOLOHead(nn.Module):
    """easydeploy DeployModel.pred_by_feat up to the NMS call: priors, flatten, sigmoid, decode.

    ``yolov5``: YOLOAnchorGenerator, 3 anchors per cell, objectness; ``rtmdet``: points offset 0, pixel
    distances; ``yolov8``: points offset 0.5, and YOLOv8HeadModule.forward_single's DFL (softmax over 16 bins,
    matmul with arange(16)) on the raw regression map before it.
    """

    def __init__(self, kind: str) -> None:
        super().__init__()
        self.kind = kind
        self.num_classes = NUM_CLASSES
        self.featmap_strides = STRIDES3
        self.num_base_priors = 3 if kind == "yolov5" else 1
        self.anchors = yolo_anchors() if kind == "yolov5" else None
        self.reg_max = 16
        self.register_buffer("proj", torch.arange(self.reg_max, dtype=torch.float), persistent=False)

    def _dfl(self, bbox_dist_preds: Tensor) -> Tensor:
        b, _, h, w = bbox_dist_preds.shape
        bbox_dist_preds = bbox_dist_preds.reshape([-1, 4, self.reg_max, h * w]).permute(0, 3, 1, 2)
        bbox_preds = bbox_dist_preds.softmax(3).matmul(self.proj.view([-1, 1])).squeeze(-1)
        return bbox_preds.transpose(1, 2).reshape(b, -1, h, w)

    def forward(self, *feats: Tensor) -> tuple[Tensor, Tensor]:
        n = len(self.featmap_strides)
        cls_scores, bbox_preds = list(feats[:n]), list(feats[n:2 * n])
        objectnesses = list(feats[2 * n:]) if self.kind == "yolov5" else None
        if self.kind == "yolov8":
            bbox_preds = [self._dfl(p) for p in bbox_preds]
        dtype = cls_scores[0].dtype
        num_imgs = cls_scores[0].shape[0]
        featmap_sizes = [cls_score.shape[2:] for cls_score in cls_scores]
        if self.anchors is not None:
            mlvl_priors = self.anchors.grid_priors(featmap_sizes, dtype=dtype)
        else:
            offset = 0.5 if self.kind == "yolov8" else 0.0
            mlvl_priors = point_grid_priors(featmap_sizes, self.featmap_strides, offset, dtype)
        flatten_priors = torch.cat(mlvl_priors)
        mlvl_strides = [flatten_priors.new_full((featmap_size[0] * featmap_size[1] * self.num_base_priors,), stride)
                        for featmap_size, stride in zip(featmap_sizes, self.featmap_strides, strict=True)]
        flatten_stride = torch.cat(mlvl_strides)
        flatten_cls_scores = [cls_score.permute(0, 2, 3, 1).reshape(num_imgs, -1, self.num_classes)
                              for cls_score in cls_scores]
        scores = torch.cat(flatten_cls_scores, dim=1).sigmoid()
        flatten_bbox_preds = torch.cat([bbox_pred.permute(0, 2, 3, 1).reshape(num_imgs, -1, 4)
                                        for bbox_pred in bbox_preds], dim=1)
        if objectnesses is not None:
            flatten_objectness = torch.cat([objectness.permute(0, 2, 3, 1).reshape(num_imgs, -1)
                                            for objectness in objectnesses], dim=1).sigmoid()
            scores = scores * (flatten_objectness.unsqueeze(-1))
        decoder = {"yolov5": yolov5_bbox_decoder, "rtmdet": rtmdet_bbox_decoder,
                   "yolov8": distance_point_decoder}[self.kind]
        bboxes = decoder(flatten_priors[None], flatten_bbox_preds, flatten_stride)
        return bboxes, scores


# ---------------------------------------------------------------------------------------------------------
# YOLOX: YOLOXHead.forward (eval, decode_in_inference=True) and decode_outputs
# ---------------------------------------------------------------------------------------------------------
class YOLOXDecode(nn.Module):
    """YOLOXHead eval tail: cat([reg, obj.sigmoid(), cls.sigmoid()]), flatten, cat, permute, decode_outputs.

    ``inplace=True`` is decode_outputs of YOLOX 0.3.0 and earlier (``outputs[..., :2] = ...`` slice
    assignment); ``inplace=False`` the torch.cat form since commit e80063b (2022-11-29, "Optimize
    decode_outputs for OpenVINO").
    """

    def __init__(self, inplace: bool) -> None:
        super().__init__()
        self.inplace = inplace
        self.strides = STRIDES3

    def forward(self, *feats: Tensor) -> Tensor:
        n = len(self.strides)
        regs, objs, clss = feats[:n], feats[n:2 * n], feats[2 * n:]
        outputs = [torch.cat([reg_output, obj_output.sigmoid(), cls_output.sigmoid()], 1)
                   for reg_output, obj_output, cls_output in zip(regs, objs, clss, strict=True)]
        self.hw = [x.shape[-2:] for x in outputs]
        out = torch.cat([x.flatten(start_dim=2) for x in outputs], dim=2).permute(0, 2, 1)
        return self.decode_outputs(out, dtype=feats[0].type())

    def decode_outputs(self, outputs: Tensor, dtype: str) -> Tensor:
        grids = []
        strides = []
        for (hsize, wsize), stride in zip(self.hw, self.strides, strict=True):
            yv, xv = torch.meshgrid([torch.arange(hsize), torch.arange(wsize)], indexing="ij")
            grid = torch.stack((xv, yv), 2).view(1, -1, 2)
            grids.append(grid)
            shape = grid.shape[:2]
            strides.append(torch.full((*shape, 1), stride))
        grid_t = torch.cat(grids, dim=1).type(dtype)
        stride_t = torch.cat(strides, dim=1).type(dtype)
        if self.inplace:
            outputs[..., :2] = (outputs[..., :2] + grid_t) * stride_t
            outputs[..., 2:4] = torch.exp(outputs[..., 2:4]) * stride_t
            return outputs
        return torch.cat([(outputs[..., 0:2] + grid_t) * stride_t, torch.exp(outputs[..., 2:4]) * stride_t,
                          outputs[..., 4:]], dim=-1)


# ---------------------------------------------------------------------------------------------------------
# the DETR family: PostProcess of DETR (softmax), Deformable-DETR (sigmoid + top-k), RT-DETR (deploy mode)
# ---------------------------------------------------------------------------------------------------------
def box_cxcywh_to_xyxy(x: Tensor) -> Tensor:
    """detr util/box_ops.py box_cxcywh_to_xyxy (also Deformable-DETR's)."""
    x_c, y_c, w, h = x.unbind(-1)
    b = [(x_c - 0.5 * w), (y_c - 0.5 * h), (x_c + 0.5 * w), (y_c + 0.5 * h)]
    return torch.stack(b, dim=-1)


def tv_box_cxcywh_to_xyxy(boxes: Tensor) -> Tensor:
    """torchvision ops/_box_convert.py _box_cxcywh_to_xyxy, which RT-DETR reaches through box_convert."""
    cx, cy, w, h = boxes.unbind(-1)
    x1 = cx - 0.5 * w
    y1 = cy - 0.5 * h
    x2 = cx + 0.5 * w
    y2 = cy + 0.5 * h
    return torch.stack((x1, y1, x2, y2), dim=-1)


class DETRPostProcess(nn.Module):
    """detr models/detr.py PostProcess, returning the tensors instead of the per-image dicts."""

    def forward(self, pred_logits: Tensor, pred_boxes: Tensor, target_sizes: Tensor) -> tuple[Tensor, ...]:
        prob = F.softmax(pred_logits, -1)
        scores, labels = prob[..., :-1].max(-1)
        boxes = box_cxcywh_to_xyxy(pred_boxes)
        img_h, img_w = target_sizes.unbind(1)
        scale_fct = torch.stack([img_w, img_h, img_w, img_h], dim=1)
        boxes = boxes * scale_fct[:, None, :]
        return scores, labels, boxes


class DeformableDETRPostProcess(nn.Module):
    """Deformable-DETR models/deformable_detr.py PostProcess: sigmoid, top-100 over queries x classes."""

    def __init__(self, topk: int = 100) -> None:
        super().__init__()
        self.topk = topk

    def forward(self, pred_logits: Tensor, pred_boxes: Tensor, target_sizes: Tensor) -> tuple[Tensor, ...]:
        prob = pred_logits.sigmoid()
        topk_values, topk_indexes = torch.topk(prob.view(pred_logits.shape[0], -1), self.topk, dim=1)
        scores = topk_values
        topk_boxes = topk_indexes // pred_logits.shape[2]
        labels = topk_indexes % pred_logits.shape[2]
        boxes = box_cxcywh_to_xyxy(pred_boxes)
        boxes = torch.gather(boxes, 1, topk_boxes.unsqueeze(-1).repeat(1, 1, 4))
        img_h, img_w = target_sizes.unbind(1)
        scale_fct = torch.stack([img_w, img_h, img_w, img_h], dim=1)
        boxes = boxes * scale_fct[:, None, :]
        return scores, labels, boxes


def _mod(a: Tensor, b: int) -> Tensor:
    """RT-DETR's ``mod`` ("for older tensorrt"): a - a // b * b."""
    return a - a // b * b


class RTDETRPostProcessor(nn.Module):
    """RT-DETRv2 RTDETRPostProcessor, deploy mode, use_focal_loss=True: (labels, boxes, scores)."""

    def __init__(self, num_classes: int = NUM_CLASSES, num_top_queries: int = 300) -> None:
        super().__init__()
        self.num_classes = num_classes
        self.num_top_queries = num_top_queries

    def forward(self, pred_logits: Tensor, pred_boxes: Tensor, orig_target_sizes: Tensor) -> tuple[Tensor, ...]:
        bbox_pred = tv_box_cxcywh_to_xyxy(pred_boxes)
        bbox_pred *= orig_target_sizes.repeat(1, 2).unsqueeze(1)
        scores = F.sigmoid(pred_logits)
        scores, index = torch.topk(scores.flatten(1), self.num_top_queries, dim=-1)
        labels = _mod(index, self.num_classes)
        index = index // self.num_classes
        boxes = bbox_pred.gather(dim=1, index=index.unsqueeze(-1).repeat(1, 1, bbox_pred.shape[-1]))
        return labels, boxes, scores


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
