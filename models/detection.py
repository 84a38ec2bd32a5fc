"""Detection post-processing functions, written the way mmdetection / torchvision / ultralytics wrote them.

Each ``nn.Module`` here mirrors one real function closely enough that the ONNX exporters emit the same op
patterns the deployed models carry (step-4 Slices, Shape→Gather→Range chains, stack/cat, ScatterND from
slice assignment). The sizes live in ``export.py``; nothing here is imported by evonnx.

Foundation set: no in-place writes (what mmdeploy's rewrites and modern exporters produce).
Slice-assignment set (class names end in ``Inplace``): the older code that writes into views, which the
TorchScript exporter lowers to ScatterND.
"""

from __future__ import annotations

import math

import torch
from torch import nn

# mmdet: wh_ratio_clip=16 / 1000, max_ratio = |log(wh_ratio_clip)|
MAX_RATIO = abs(math.log(16 / 1000))


def _meshgrid_repeat(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """mmdet 2.x ``AnchorGenerator._meshgrid`` (row major, built from repeat)."""
    xx = x.repeat(y.shape[0])
    yy = y.view(-1, 1).repeat(1, x.shape[0]).view(-1)
    return xx, yy


def _meshgrid_torch(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """mmdet 3.x ``AnchorGenerator._meshgrid`` (row major, built from torch.meshgrid)."""
    yy, xx = torch.meshgrid(y, x, indexing="ij")
    return xx.reshape(-1), yy.reshape(-1)


# ---------------------------------------------------------------------------------------------------------
# 1. anchor_grid: mmdet AnchorGenerator.gen_base_anchors + grid_priors (RetinaNet P3-P5 settings)
# ---------------------------------------------------------------------------------------------------------
class AnchorGrid(nn.Module):
    """mmdet ``AnchorGenerator.grid_priors`` over three levels, feature-map sizes read from the inputs.

    RetinaNet settings: octave_base_scale=4, scales_per_octave=3, ratios (0.5, 1, 2) → 9 base anchors per
    location; strides 8, 16, 32. Base anchors are computed in ``forward`` from small buffers (the exporter
    folds them to a 9×4 constant per level); shifts come from ``arange(feat_w) * stride`` where ``feat_w``
    is a run-time shape.
    """

    scales: torch.Tensor
    ratios: torch.Tensor

    def __init__(self, strides: tuple[int, ...] = (8, 16, 32)) -> None:
        super().__init__()
        self.strides = strides
        octave_scales = [2 ** (i / 3) for i in range(3)]
        self.register_buffer("scales", torch.tensor(octave_scales) * 4.0, persistent=False)
        self.register_buffer("ratios", torch.tensor([0.5, 1.0, 2.0]), persistent=False)
        self.center_offset = 0.0

    def gen_single_level_base_anchors(self, base_size: int) -> torch.Tensor:
        w = h = float(base_size)
        x_center = self.center_offset * w
        y_center = self.center_offset * h
        h_ratios = torch.sqrt(self.ratios)
        w_ratios = 1 / h_ratios
        ws = (w * w_ratios[:, None] * self.scales[None, :]).view(-1)
        hs = (h * h_ratios[:, None] * self.scales[None, :]).view(-1)
        base_anchors = [x_center - 0.5 * ws, y_center - 0.5 * hs, x_center + 0.5 * ws, y_center + 0.5 * hs]
        return torch.stack(base_anchors, dim=-1)

    def single_level_grid_priors(self, feat: torch.Tensor, stride: int) -> torch.Tensor:
        base_anchors = self.gen_single_level_base_anchors(stride)
        feat_h, feat_w = feat.shape[-2:]
        shift_x = torch.arange(0, feat_w, device=feat.device).to(feat.dtype) * stride
        shift_y = torch.arange(0, feat_h, device=feat.device).to(feat.dtype) * stride
        shift_xx, shift_yy = _meshgrid_torch(shift_x, shift_y)
        shifts = torch.stack([shift_xx, shift_yy, shift_xx, shift_yy], dim=-1)
        all_anchors = base_anchors[None, :, :] + shifts[:, None, :]
        return all_anchors.view(-1, 4)

    def forward(self, feat0: torch.Tensor, feat1: torch.Tensor, feat2: torch.Tensor) -> torch.Tensor:
        feats = (feat0, feat1, feat2)
        priors = [self.single_level_grid_priors(f, s) for f, s in zip(feats, self.strides, strict=True)]
        return torch.cat(priors, dim=0)


# ---------------------------------------------------------------------------------------------------------
# 2. valid_flags: mmdet AnchorGenerator.single_level_valid_flags + anchor_inside_flags (no writes)
# ---------------------------------------------------------------------------------------------------------
class ValidFlags(nn.Module):
    """mmdet ``single_level_valid_flags`` then ``anchor_inside_flags``, written without slice assignment.

    ``valid_x = arange(feat_w) < valid_w`` replaces ``valid_x[:valid_w] = 1``; the valid sizes are
    ``min(ceil(pad / stride), feat)`` computed at run time from the ``pad_shape`` input.
    """

    def __init__(self, stride: int = 8, num_base_anchors: int = 3, allowed_border: float = 0.0) -> None:
        super().__init__()
        self.stride = stride
        self.num_base_anchors = num_base_anchors
        self.allowed_border = allowed_border

    def forward(
        self, feat: torch.Tensor, anchors: torch.Tensor, pad_shape: torch.Tensor, img_shape: torch.Tensor
    ) -> torch.Tensor:
        feat_h, feat_w = feat.shape[-2:]
        valid_hw = torch.ceil(pad_shape.to(torch.float32) / self.stride).to(torch.int64)
        valid_h = torch.minimum(valid_hw[0], torch.as_tensor(feat_h))
        valid_w = torch.minimum(valid_hw[1], torch.as_tensor(feat_w))
        valid_x = torch.arange(feat_w, device=feat.device) < valid_w
        valid_y = torch.arange(feat_h, device=feat.device) < valid_h
        valid_xx, valid_yy = _meshgrid_repeat(valid_x, valid_y)
        valid = valid_xx & valid_yy
        valid = valid[:, None].expand(valid.size(0), self.num_base_anchors).contiguous().view(-1)
        # anchor_inside_flags(flat_anchors, valid_flags, img_shape, allowed_border)
        img_h, img_w = img_shape[0], img_shape[1]
        ab = self.allowed_border
        inside_flags = (
            valid
            & (anchors[:, 0] >= -ab)
            & (anchors[:, 1] >= -ab)
            & (anchors[:, 2] < img_w + ab)
            & (anchors[:, 3] < img_h + ab)
        )
        return inside_flags


# ---------------------------------------------------------------------------------------------------------
# 3. delta2bbox: mmdet 2.x DeltaXYWHBBoxCoder.decode → delta2bbox (batched, ONNX path)
# ---------------------------------------------------------------------------------------------------------
class Delta2BBox(nn.Module):
    """mmdet 2.x ``delta2bbox`` for batched rois/deltas (B, N, 4), the path mmdeploy exports.

    Step-4 slices of the denormalised deltas, ``expand_as`` of the roi centres/sizes, clamp of dw/dh by
    ``max_ratio``, exp, and the ONNX-friendly clip (``dynamic_clip_for_onnx``) before the final stack.
    """

    def __init__(
        self,
        means: tuple[float, ...] = (0.0, 0.0, 0.0, 0.0),
        stds: tuple[float, ...] = (0.1, 0.1, 0.2, 0.2),
        max_shape: tuple[int, int] = (800, 1333),
    ) -> None:
        super().__init__()
        self.means = means
        self.stds = stds
        self.max_shape = max_shape

    def forward(self, rois: torch.Tensor, deltas: torch.Tensor) -> torch.Tensor:
        means = deltas.new_tensor(self.means).view(1, -1).repeat(1, deltas.size(-1) // 4)
        stds = deltas.new_tensor(self.stds).view(1, -1).repeat(1, deltas.size(-1) // 4)
        denorm_deltas = deltas * stds + means
        dx = denorm_deltas[..., 0::4]
        dy = denorm_deltas[..., 1::4]
        dw = denorm_deltas[..., 2::4]
        dh = denorm_deltas[..., 3::4]
        x1, y1 = rois[..., 0], rois[..., 1]
        x2, y2 = rois[..., 2], rois[..., 3]
        # Compute center of each roi
        px = ((x1 + x2) * 0.5).unsqueeze(-1).expand_as(dx)
        py = ((y1 + y2) * 0.5).unsqueeze(-1).expand_as(dy)
        # Compute width/height of each roi
        pw = (x2 - x1).unsqueeze(-1).expand_as(dw)
        ph = (y2 - y1).unsqueeze(-1).expand_as(dh)
        dw = dw.clamp(min=-MAX_RATIO, max=MAX_RATIO)
        dh = dh.clamp(min=-MAX_RATIO, max=MAX_RATIO)
        # Use exp(network energy) to enlarge/shrink each roi
        gw = pw * dw.exp()
        gh = ph * dh.exp()
        # Use network energy to shift the center of each roi
        gx = px + pw * dx
        gy = py + ph * dy
        # Convert center-xy/width/height to top-left, bottom-right
        x1 = gx - gw * 0.5
        y1 = gy - gh * 0.5
        x2 = gx + gw * 0.5
        y2 = gy + gh * 0.5
        # mmdet.core.export.dynamic_clip_for_onnx
        x1 = x1.clamp(min=0, max=self.max_shape[1])
        y1 = y1.clamp(min=0, max=self.max_shape[0])
        x2 = x2.clamp(min=0, max=self.max_shape[1])
        y2 = y2.clamp(min=0, max=self.max_shape[0])
        return torch.stack([x1, y1, x2, y2], dim=-1).view(deltas.size())


# ---------------------------------------------------------------------------------------------------------
# 4. bbox2delta: mmdet DeltaXYWHBBoxCoder.encode → bbox2delta
# ---------------------------------------------------------------------------------------------------------
class BBox2Delta(nn.Module):
    """mmdet ``bbox2delta``: proposals and ground truth (N, 4) → normalised deltas (N, 4)."""

    def __init__(
        self, means: tuple[float, ...] = (0.0, 0.0, 0.0, 0.0), stds: tuple[float, ...] = (0.1, 0.1, 0.2, 0.2)
    ) -> None:
        super().__init__()
        self.means = means
        self.stds = stds

    def forward(self, proposals: torch.Tensor, gt: torch.Tensor) -> torch.Tensor:
        proposals = proposals.float()
        gt = gt.float()
        px = (proposals[..., 0] + proposals[..., 2]) * 0.5
        py = (proposals[..., 1] + proposals[..., 3]) * 0.5
        pw = proposals[..., 2] - proposals[..., 0]
        ph = proposals[..., 3] - proposals[..., 1]

        gx = (gt[..., 0] + gt[..., 2]) * 0.5
        gy = (gt[..., 1] + gt[..., 3]) * 0.5
        gw = gt[..., 2] - gt[..., 0]
        gh = gt[..., 3] - gt[..., 1]

        dx = (gx - px) / pw
        dy = (gy - py) / ph
        dw = torch.log(gw / pw)
        dh = torch.log(gh / ph)
        deltas = torch.stack([dx, dy, dw, dh], dim=-1)

        means = deltas.new_tensor(self.means).unsqueeze(0)
        stds = deltas.new_tensor(self.stds).unsqueeze(0)
        return (deltas - means) / stds


# ---------------------------------------------------------------------------------------------------------
# 5. distance2bbox: mmdet distance2bbox (FCOS / GFL / YOLOv8-style heads), ONNX clip path
# ---------------------------------------------------------------------------------------------------------
class Distance2BBox(nn.Module):
    """mmdet ``distance2bbox(points, distance, max_shape)`` with a per-image ``max_shape`` tensor (B, 2).

    The clip follows mmdet's tensor path: ``max_xy = cat([max_shape, max_shape]).flip(-1).unsqueeze(-2)``
    and two ``torch.where``.
    """

    def forward(self, points: torch.Tensor, distance: torch.Tensor, max_shape: torch.Tensor) -> torch.Tensor:
        x1 = points[..., 0] - distance[..., 0]
        y1 = points[..., 1] - distance[..., 1]
        x2 = points[..., 0] + distance[..., 2]
        y2 = points[..., 1] + distance[..., 3]
        bboxes = torch.stack([x1, y1, x2, y2], -1)
        max_shape = max_shape[..., :2].type_as(x1)
        min_xy = x1.new_tensor(0)
        max_xy = torch.cat([max_shape, max_shape], dim=-1).flip(-1).unsqueeze(-2)
        bboxes = torch.where(bboxes < min_xy, min_xy, bboxes)
        bboxes = torch.where(bboxes > max_xy, max_xy, bboxes)
        return bboxes


# ---------------------------------------------------------------------------------------------------------
# 6. yolo_decode: ultralytics YOLOv5 (v6.x/v7.0) Detect.forward, inference branch, inplace=False
# ---------------------------------------------------------------------------------------------------------
YOLOV5_ANCHORS = (
    (10, 13, 16, 30, 33, 23),  # P3/8
    (30, 61, 62, 45, 59, 119),  # P4/16
    (116, 90, 156, 198, 373, 326),  # P5/32
)


class YoloDecode(nn.Module):
    """ultralytics YOLOv5 ``Detect`` (export path, ``inplace=False``), minus the 1×1 convs.

    Inputs are the three head outputs (bs, na*no, ny, nx); grids come from ``_make_grid`` traced with
    run-time sizes (``export.py --dynamic``), so they are Range/meshgrid/Expand subgraphs, not constants.
    """

    stride: torch.Tensor
    anchors: torch.Tensor

    def __init__(self, nc: int = 80, strides: tuple[int, ...] = (8, 16, 32)) -> None:
        super().__init__()
        self.nc = nc
        self.no = nc + 5
        self.nl = len(YOLOV5_ANCHORS)
        self.na = len(YOLOV5_ANCHORS[0]) // 2
        self.register_buffer("stride", torch.tensor(strides, dtype=torch.float32), persistent=False)
        anchors = torch.tensor(YOLOV5_ANCHORS, dtype=torch.float32).view(self.nl, -1, 2)
        # Detect stores anchors in grid units: anchors /= stride.view(-1, 1, 1)
        self.register_buffer("anchors", anchors / self.stride.view(-1, 1, 1), persistent=False)

    def _make_grid(self, nx: int, ny: int, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        d = self.anchors[i].device
        t = self.anchors[i].dtype
        shape = 1, self.na, ny, nx, 2  # grid shape
        y, x = torch.arange(ny, device=d, dtype=t), torch.arange(nx, device=d, dtype=t)
        yv, xv = torch.meshgrid(y, x, indexing="ij")
        grid = torch.stack((xv, yv), 2).expand(shape) - 0.5  # add grid offset, i.e. y = 2.0 * x - 0.5
        anchor_grid = (self.anchors[i] * self.stride[i]).view((1, self.na, 1, 1, 2)).expand(shape)
        return grid, anchor_grid

    def forward(self, x0: torch.Tensor, x1: torch.Tensor, x2: torch.Tensor) -> torch.Tensor:
        x = [x0, x1, x2]
        z = []
        for i in range(self.nl):
            bs, _, ny, nx = x[i].shape  # x(bs,255,20,20) to x(bs,3,20,20,85)
            x[i] = x[i].view(bs, self.na, self.no, ny, nx).permute(0, 1, 3, 4, 2).contiguous()
            grid, anchor_grid = self._make_grid(nx, ny, i)
            xy, wh, conf = x[i].sigmoid().split((2, 2, self.nc + 1), 4)
            xy = (xy * 2 + grid) * self.stride[i]  # xy
            wh = (wh * 2) ** 2 * anchor_grid  # wh
            y = torch.cat((xy, wh, conf), 4)
            z.append(y.view(bs, self.na * nx * ny, self.no))
        return torch.cat(z, 1)


# ---------------------------------------------------------------------------------------------------------
# 7. tblr2bbox: mmdet TBLRBBoxCoder.decode → tblr2bboxes (ONNX path)
# ---------------------------------------------------------------------------------------------------------
class TBLR2BBox(nn.Module):
    """mmdet ``tblr2bboxes(priors, tblr, normalizer=4.0, normalize_by_wh=True, max_shape)``.

    Uses the slice-free form mmdet adopted for ONNX ("Inplace operation with slice would fail for exporting
    to ONNX") and ``dynamic_clip_for_onnx`` with ``max_shape`` (2,) = (h, w) as a graph input.
    """

    def __init__(self, normalizer: float = 4.0) -> None:
        super().__init__()
        self.normalizer = normalizer

    def forward(self, priors: torch.Tensor, tblr: torch.Tensor, max_shape: torch.Tensor) -> torch.Tensor:
        loc_decode = tblr * self.normalizer
        prior_centers = (priors[..., 0:2] + priors[..., 2:4]) / 2
        wh = priors[..., 2:4] - priors[..., 0:2]
        w, h = torch.split(wh, 1, dim=-1)
        # Inplace operation with slice would fail for exporting to ONNX
        th = h * loc_decode[..., :1]  # tb
        bh = h * loc_decode[..., 1:2]  # tb
        tw = w * loc_decode[..., 2:3]  # lr
        bw = w * loc_decode[..., 3:4]  # lr
        loc_decode = torch.cat([th, bh, tw, bw], dim=-1)
        top, bottom, left, right = loc_decode.split((1, 1, 1, 1), dim=-1)
        xmin = prior_centers[..., 0].unsqueeze(-1) - left
        xmax = prior_centers[..., 0].unsqueeze(-1) + right
        ymin = prior_centers[..., 1].unsqueeze(-1) - top
        ymax = prior_centers[..., 1].unsqueeze(-1) + bottom
        # mmdet.core.export.dynamic_clip_for_onnx
        max_shape = max_shape.to(xmin.dtype)
        zero = max_shape.new_zeros(())
        xmin = torch.clamp(xmin, zero, max_shape[1])
        ymin = torch.clamp(ymin, zero, max_shape[0])
        xmax = torch.clamp(xmax, zero, max_shape[1])
        ymax = torch.clamp(ymax, zero, max_shape[0])
        return torch.cat([xmin, ymin, xmax, ymax], dim=-1)


# ---------------------------------------------------------------------------------------------------------
# EasyView hotspots without writes: gen_base_anchors, map_roi_levels
# ---------------------------------------------------------------------------------------------------------
class GenBaseAnchors(nn.Module):
    """mmdet ``AnchorGenerator.gen_single_level_base_anchors`` with scales and ratios as inputs."""

    def __init__(self, base_size: int = 8, center_offset: float = 0.0) -> None:
        super().__init__()
        self.base_size = base_size
        self.center_offset = center_offset

    def forward(self, scales: torch.Tensor, ratios: torch.Tensor) -> torch.Tensor:
        w = h = float(self.base_size)
        return self._base_anchors(w, h, scales, ratios)

    def _base_anchors(
        self, w: float | torch.Tensor, h: float | torch.Tensor, scales: torch.Tensor, ratios: torch.Tensor
    ) -> torch.Tensor:
        x_center = self.center_offset * w
        y_center = self.center_offset * h
        h_ratios = torch.sqrt(ratios)
        w_ratios = 1 / h_ratios
        ws = (w * w_ratios[:, None] * scales[None, :]).view(-1)
        hs = (h * h_ratios[:, None] * scales[None, :]).view(-1)
        # use float anchor and the anchor's center is aligned with the pixel center
        base_anchors = [x_center - 0.5 * ws, y_center - 0.5 * hs, x_center + 0.5 * ws, y_center + 0.5 * hs]
        return torch.stack(base_anchors, dim=-1)


class GenBaseAnchorsSizeInput(GenBaseAnchors):
    """``gen_single_level_base_anchors(base_size, scales, ratios)`` with ``base_size`` a 0-d tensor input.

    ``gen_base_anchors`` calls it once per level with that level's base size (mmdet: ``int | float``; a 0-d
    tensor when ``base_sizes`` is a tensor, as in benchmark harnesses that loop over ``torch.from_numpy``).
    """

    def forward(  # type: ignore[override]
        self, base_size: torch.Tensor, scales: torch.Tensor, ratios: torch.Tensor
    ) -> torch.Tensor:
        w = h = base_size
        return self._base_anchors(w, h, scales, ratios)


class MapRoiLevels(nn.Module):
    """mmdet ``SingleRoIExtractor.map_roi_levels``: FPN level of each roi (N, 5) by its scale."""

    def __init__(self, finest_scale: int = 56, num_levels: int = 4) -> None:
        super().__init__()
        self.finest_scale = finest_scale
        self.num_levels = num_levels

    def forward(self, rois: torch.Tensor) -> torch.Tensor:
        scale = torch.sqrt((rois[:, 3] - rois[:, 1]) * (rois[:, 4] - rois[:, 2]))
        target_lvls = torch.floor(torch.log2(scale / self.finest_scale + 1e-6))
        target_lvls = target_lvls.clamp(min=0, max=self.num_levels - 1).long()
        return target_lvls


class ScoreFilter(nn.Module):
    """YOLOv5 ``utils/general.py non_max_suppression`` before NMS: class confidence = obj × cls, best class per
    candidate (max + argmax), xywh → xyxy, ``cat((box, conf, j.float()), 1)``, zeroed below the confidence
    threshold (the export-friendly form of the boolean-mask indexing)."""

    def __init__(self, conf_thres: float = 0.25) -> None:
        super().__init__()
        self.conf_thres = conf_thres

    def forward(self, prediction: torch.Tensor) -> torch.Tensor:
        box = prediction[..., :4]
        obj = prediction[..., 4:5]
        scores = prediction[..., 5:] * obj
        conf, j = scores.max(-1, keepdim=True)
        xy, wh = box[..., :2], box[..., 2:4] / 2
        out = torch.cat((xy - wh, xy + wh, conf, j.float()), -1)
        keep = (conf > self.conf_thres) & (obj > self.conf_thres)
        return out * keep


class EmbeddingNormalize(nn.Module):
    """JDE (Towards Real-Time MOT) ``YOLOLayer`` at inference: the identity-embedding map of one level,
    channels-last, L2-normalised per location (``F.normalize(p_emb.permute(0, 2, 3, 1), dim=-1)``)."""

    def forward(self, emb: torch.Tensor) -> torch.Tensor:
        return nn.functional.normalize(emb.permute(0, 2, 3, 1).contiguous(), dim=-1)


class DetrPostProcess(nn.Module):
    """facebookresearch/detr ``models/detr.py PostProcess``: softmax over classes, best non-background class per
    query (max + argmax), boxes cxcywh → xyxy scaled to each image's size."""

    def forward(self, pred_logits: torch.Tensor, pred_boxes: torch.Tensor, target_sizes: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        prob = torch.softmax(pred_logits, -1)
        scores, labels = prob[..., :-1].max(-1)
        cx, cy, w, h = pred_boxes.unbind(-1)
        boxes = torch.stack([cx - 0.5 * w, cy - 0.5 * h, cx + 0.5 * w, cy + 0.5 * h], dim=-1)
        img_h, img_w = target_sizes.unbind(1)
        scale_fct = torch.stack([img_w, img_h, img_w, img_h], dim=1)
        return scores, labels, boxes * scale_fct[:, None, :]


# =========================================================================================================
# Slice-assignment set: in-place writes into views (TorchScript exporter → ScatterND)
# =========================================================================================================
class Offset2BBoxInplace(nn.Module):
    """Point + offset decoder that writes the even and odd box columns of a ``new_zeros`` tensor.

    The EasyView ``offset2bbox`` hotspot (4000×4): ``boxes[:, 0::2] = ...; boxes[:, 1::2] = ...``.
    """

    def __init__(self, stride: float = 8.0) -> None:
        super().__init__()
        self.stride = stride

    def forward(self, points: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        boxes = offsets.new_zeros(offsets.shape)
        boxes[:, 0::2] = offsets[:, 0::2] * self.stride + points[:, 0:1]
        boxes[:, 1::2] = offsets[:, 1::2] * self.stride + points[:, 1:2]
        return boxes


class ValidFlagsInplace(nn.Module):
    """mmdet 2.x ``AnchorGenerator.single_level_valid_flags`` exactly as written (``valid_x[:valid_w] = 1``).

    ``valid_h``/``valid_w`` come from ``pad_shape`` in the image metas, so they are Python ints at export
    time (here 1300×1550 at stride 8 → 163×194); the feature-map size is a run-time shape.
    """

    def __init__(self, stride: int = 8, num_base_anchors: int = 3, pad_shape: tuple[int, int] = (1300, 1550)):
        super().__init__()
        self.stride = stride
        self.num_base_anchors = num_base_anchors
        self.pad_shape = pad_shape

    def forward(self, feat: torch.Tensor) -> torch.Tensor:
        feat_h, feat_w = feat.shape[-2:]
        h, w = self.pad_shape
        valid_h = math.ceil(h / self.stride)
        valid_w = math.ceil(w / self.stride)
        valid_x = torch.zeros(feat_w, dtype=torch.bool, device=feat.device)
        valid_y = torch.zeros(feat_h, dtype=torch.bool, device=feat.device)
        valid_x[:valid_w] = 1
        valid_y[:valid_h] = 1
        valid_xx, valid_yy = _meshgrid_repeat(valid_x, valid_y)
        valid = valid_xx & valid_yy
        valid = valid[:, None].expand(valid.size(0), self.num_base_anchors).contiguous().view(-1)
        return valid


class ClampInplace(nn.Module):
    """torchvision ``clip_boxes_to_image`` / mmdet ``bbox_clip`` in the slice-assignment form."""

    def __init__(self, img_shape: tuple[int, int] = (800, 1333)) -> None:
        super().__init__()
        self.img_shape = img_shape

    def forward(self, boxes: torch.Tensor) -> torch.Tensor:
        height, width = self.img_shape
        boxes = boxes.clone()
        boxes[:, 0::2] = boxes[:, 0::2].clamp(min=0, max=width)
        boxes[:, 1::2] = boxes[:, 1::2].clamp(min=0, max=height)
        return boxes


class Yolov5InplaceDecode(YoloDecode):
    """ultralytics YOLOv5 ``Detect`` with ``inplace=True``: ``y[..., 0:2] = ...; y[..., 2:4] = ...``."""

    def forward(self, x0: torch.Tensor, x1: torch.Tensor, x2: torch.Tensor) -> torch.Tensor:
        x = [x0, x1, x2]
        z = []
        for i in range(self.nl):
            bs, _, ny, nx = x[i].shape
            x[i] = x[i].view(bs, self.na, self.no, ny, nx).permute(0, 1, 3, 4, 2).contiguous()
            grid, anchor_grid = self._make_grid(nx, ny, i)
            y = x[i].sigmoid()
            y[..., 0:2] = (y[..., 0:2] * 2 + grid) * self.stride[i]  # xy
            y[..., 2:4] = (y[..., 2:4] * 2) ** 2 * anchor_grid  # wh
            z.append(y.view(bs, -1, self.no))
        return torch.cat(z, 1)


class BoxCoderDecodeInplace(nn.Module):
    """maskrcnn-benchmark ``BoxCoder.decode``: four step-4 writes into ``torch.zeros_like(rel_codes)``.

    The eager ``delta2bbox`` that EasyView measured (R-CNN box head, class-specific deltas (N, 4*C)).
    """

    def __init__(self, weights: tuple[float, ...] = (10.0, 10.0, 5.0, 5.0)) -> None:
        super().__init__()
        self.weights = weights
        self.bbox_xform_clip = math.log(1000.0 / 16)

    def forward(self, rel_codes: torch.Tensor, boxes: torch.Tensor) -> torch.Tensor:
        boxes = boxes.to(rel_codes.dtype)
        to_remove = 1  # TO_REMOVE
        widths = boxes[:, 2] - boxes[:, 0] + to_remove
        heights = boxes[:, 3] - boxes[:, 1] + to_remove
        ctr_x = boxes[:, 0] + 0.5 * widths
        ctr_y = boxes[:, 1] + 0.5 * heights

        wx, wy, ww, wh = self.weights
        dx = rel_codes[:, 0::4] / wx
        dy = rel_codes[:, 1::4] / wy
        dw = rel_codes[:, 2::4] / ww
        dh = rel_codes[:, 3::4] / wh
        # Prevent sending too large values into torch.exp()
        dw = torch.clamp(dw, max=self.bbox_xform_clip)
        dh = torch.clamp(dh, max=self.bbox_xform_clip)

        pred_ctr_x = dx * widths[:, None] + ctr_x[:, None]
        pred_ctr_y = dy * heights[:, None] + ctr_y[:, None]
        pred_w = torch.exp(dw) * widths[:, None]
        pred_h = torch.exp(dh) * heights[:, None]

        pred_boxes = torch.zeros_like(rel_codes)
        pred_boxes[:, 0::4] = pred_ctr_x - 0.5 * pred_w  # x1
        pred_boxes[:, 1::4] = pred_ctr_y - 0.5 * pred_h  # y1
        pred_boxes[:, 2::4] = pred_ctr_x + 0.5 * pred_w - 1  # x2 (note: "- 1" is correct; don't be fooled)
        pred_boxes[:, 3::4] = pred_ctr_y + 0.5 * pred_h - 1  # y2
        return pred_boxes
