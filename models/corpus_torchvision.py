"""torchvision detectors beyond corpus.py's four: the rest of its detection zoo and slim variants (issue #9).

``MORE`` lists them for ``models/corpus.py``; ``build`` makes each one. Stock models are torchvision's own
builders with ``weights=None, weights_backbone=None`` at ``min_size = max_size = 320`` (SSD300 at its fixed 300)
and a score threshold of 0, so random weights still give detections through the whole post-processing. The
slim variants keep torchvision's model classes, transform and post-processing (RPN, MultiScaleRoIAlign, batched
NMS, mask paste, keypoint heatmap decode, P6/P7 levels) with a ResNet-18 body cut after layer3, FPN width 64 and
narrow heads, so a file is 14-17 MB instead of 150-240 MB; each mirrors the structure of the stock model named
beside it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial
from typing import Any

from torch import nn

C = 64  # the slim FPN's width
SMALL = {"min_size": 320, "max_size": 320}


@dataclass(frozen=True)
class More:
    arch: str  # a torchvision.models.detection builder, or a SLIM name
    shape: tuple[int, int, int]  # CHW of the recipe image
    what: str
    kwargs: dict[str, Any] = field(default_factory=dict)  # given to the stock builder
    dynamo: bool = False  # also exported by the dynamo exporter


MORE: tuple[More, ...] = (
    More("maskrcnn_resnet50_fpn", (3, 320, 320), "torchvision Mask R-CNN ResNet-50 FPN (masks pasted in the graph)",
         SMALL | {"box_score_thresh": 0.0}),
    More("keypointrcnn_resnet50_fpn", (3, 320, 320), "torchvision Keypoint R-CNN ResNet-50 FPN (17 keypoints)",
         SMALL | {"box_score_thresh": 0.0}),
    More("fasterrcnn_resnet50_fpn_v2", (3, 320, 320), "torchvision Faster R-CNN ResNet-50 FPN v2",
         SMALL | {"box_score_thresh": 0.0}),
    More("retinanet_resnet50_fpn_v2", (3, 320, 320), "torchvision RetinaNet ResNet-50 FPN v2 (GroupNorm head, GIoU)",
         SMALL | {"score_thresh": 0.0}),
    More("ssd300_vgg16", (3, 300, 300), "torchvision SSD300 VGG16", {"score_thresh": 0.0}),
    More("maskrcnn_slim", (3, 320, 320), "Mask R-CNN as maskrcnn_resnet50_fpn, slim backbone and heads",
         dynamo=True),
    More("keypointrcnn_slim", (3, 320, 320), "Keypoint R-CNN as keypointrcnn_resnet50_fpn, slim"),
    More("fasterrcnn_v2_slim", (3, 320, 320), "Faster R-CNN as fasterrcnn_resnet50_fpn_v2 (BatchNorm FPN, two-conv "
         "RPN, conv+FC box head), slim"),
    More("retinanet_v2_slim", (3, 320, 320), "RetinaNet as retinanet_resnet50_fpn_v2 (P6/P7, GroupNorm head, GIoU), "
         "slim", dynamo=True),
    More("fcos_slim", (3, 320, 320), "FCOS as fcos_resnet50_fpn, slim"),
)
MORE_BY_ARCH = {m.arch: m for m in MORE}


def _backbone(extra: nn.Module | None = None, norm: Any = None) -> nn.Module:
    from torchvision.models import resnet18
    from torchvision.models.detection.backbone_utils import BackboneWithFPN
    from torchvision.ops.feature_pyramid_network import LastLevelMaxPool

    returned = (1, 2, 3)
    return BackboneWithFPN(resnet18(weights=None), {f"layer{k}": str(i) for i, k in enumerate(returned)},
                           [64 * 2 ** (k - 1) for k in returned], C, extra_blocks=extra or LastLevelMaxPool(),
                           norm_layer=norm)


def _slim(arch: str) -> nn.Module:
    from torchvision.models.detection import FCOS, FasterRCNN, KeypointRCNN, MaskRCNN, RetinaNet, retinanet
    from torchvision.models.detection.anchor_utils import AnchorGenerator
    from torchvision.models.detection.faster_rcnn import FastRCNNConvFCHead, FastRCNNPredictor, TwoMLPHead
    from torchvision.models.detection.keypoint_rcnn import KeypointRCNNHeads, KeypointRCNNPredictor
    from torchvision.models.detection.mask_rcnn import MaskRCNNHeads, MaskRCNNPredictor
    from torchvision.models.detection.retinanet import RetinaNetHead
    from torchvision.models.detection.rpn import RPNHead
    from torchvision.ops import MultiScaleRoIAlign
    from torchvision.ops.feature_pyramid_network import LastLevelP6P7

    def anchors() -> AnchorGenerator:
        return AnchorGenerator(sizes=((32,), (64,), (128,), (256,)), aspect_ratios=((0.5, 1.0, 2.0),) * 4)

    def roi(n: int) -> MultiScaleRoIAlign:
        return MultiScaleRoIAlign(featmap_names=["0", "1", "2"], output_size=n, sampling_ratio=2)

    if arch == "fasterrcnn_v2_slim":
        return FasterRCNN(_backbone(norm=nn.BatchNorm2d), num_classes=None, rpn_anchor_generator=anchors(),
                          rpn_head=RPNHead(C, 3, conv_depth=2), box_roi_pool=roi(7),
                          box_head=FastRCNNConvFCHead((C, 7, 7), [C] * 4, [256], norm_layer=nn.BatchNorm2d),
                          box_predictor=FastRCNNPredictor(256, 91), box_score_thresh=0.0, **SMALL)
    if arch == "maskrcnn_slim":
        return MaskRCNN(_backbone(), num_classes=None, rpn_anchor_generator=anchors(), rpn_head=RPNHead(C, 3),
                        box_roi_pool=roi(7), box_head=TwoMLPHead(C * 49, 256), box_predictor=FastRCNNPredictor(256, 91),
                        mask_roi_pool=roi(14), mask_head=MaskRCNNHeads(C, (C,) * 4, 1),
                        mask_predictor=MaskRCNNPredictor(C, C, 91), box_score_thresh=0.0, **SMALL)
    if arch == "keypointrcnn_slim":
        return KeypointRCNN(_backbone(), num_classes=None, rpn_anchor_generator=anchors(), rpn_head=RPNHead(C, 3),
                            box_roi_pool=roi(7), box_head=TwoMLPHead(C * 49, 256),
                            box_predictor=FastRCNNPredictor(256, 2), keypoint_roi_pool=roi(14),
                            keypoint_head=KeypointRCNNHeads(C, (C,) * 8),
                            keypoint_predictor=KeypointRCNNPredictor(C, 17),
                            box_score_thresh=0.0, **SMALL)
    if arch == "retinanet_v2_slim":
        body = _backbone(extra=LastLevelP6P7(256, C))  # built first: the order draws the same random weights
        ag = retinanet._default_anchorgen()
        head = RetinaNetHead(C, ag.num_anchors_per_location()[0], 91, norm_layer=partial(nn.GroupNorm, 32))
        head.regression_head._loss_type = "giou"
        return RetinaNet(body, 91, anchor_generator=ag, head=head, score_thresh=0.0, **SMALL)
    if arch == "fcos_slim":
        ag = AnchorGenerator(sizes=((8,), (16,), (32,), (64,), (128,)), aspect_ratios=((1.0,),) * 5)
        return FCOS(_backbone(extra=LastLevelP6P7(C, C)), 91, anchor_generator=ag, score_thresh=0.0, **SMALL)
    raise KeyError(arch)


def build(arch: str, kwargs: dict[str, Any]) -> tuple[nn.Module, str]:
    """The model (eval mode) and the Python that builds it, for the manifest."""
    from torchvision.models import detection

    if arch.endswith("_slim"):
        return _slim(arch).eval(), f"models/corpus_torchvision.py _slim({arch!r}).eval()"
    args = "".join(f", {k}={v!r}" for k, v in kwargs.items())
    model = getattr(detection, arch)(weights=None, weights_backbone=None, **kwargs).eval()
    return model, f"torchvision.models.detection.{arch}(weights=None, weights_backbone=None{args}).eval()"

