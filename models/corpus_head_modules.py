"""The post-processing modules of `corpus_heads.py`, written from the public code of mmdetection, mmyolo, YOLOX and
the DETR family (none of them installed): anchors and point priors, box coders, the dense heads' decode, and the
DETR post-processors. `corpus_heads.HEADS` names, configures and exports them."""

from __future__ import annotations

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
