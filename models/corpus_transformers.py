"""Hugging Face transformers detectors for the corpus (issue #9): the model and its post-processing in one graph.

Users export a transformers detector by wrapping ``model(pixel_values)`` and the image processor's
``post_process_object_detection(outputs, threshold=..., target_sizes=...)`` in one ``nn.Module``. That method
ends in a Python loop that keeps ``score > threshold`` per image (a list of dicts of data-dependent length), so
the wrappers below (``Detect``) run its tensor math up to that loop, as written in transformers for each family,
and return every candidate with fixed shapes: no thresholding, which the user applies to the outputs. Box
conversion calls ``transformers.image_transforms.center_to_corners_format`` itself (traceable).

Every model is built from a config in code, with random weights: no download, no timm (``backbone_config`` a
transformers ``ResNetConfig`` / ``RTDetrResNetConfig``, ``use_pretrained_backbone`` off). The configs follow the
small published checkpoints named in ``HFModel.follows`` (ResNet-18-sized backbones, the transformer sizes of
the checkpoint). ``models/corpus.py`` builds, exports and checks them; nothing else imports this module.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

# post-processing kinds, as the families' image processors (transformers 5.24) compute them:
# "softmax_max": DETR, YOLOS: softmax, drop the no-object class, max over classes (every query kept)
# "sigmoid_topk": Conditional / Deformable DETR: sigmoid, top-k (k=100) over queries x classes, // and %, gather
# "rtdetr": RT-DETR (v1 and v2, use_focal_loss=True): boxes scaled first, sigmoid, top-(num_queries), % and //
POST = ("softmax_max", "sigmoid_topk", "rtdetr")
HF = "https://huggingface.co/"
SRC = "https://github.com/huggingface/transformers/blob/v5.24.0/src/transformers/models/"


@dataclass(frozen=True)
class HFModel:
    """One transformers detector: how to configure it, which post-processing follows, the input it expects."""

    name: str  # the corpus entries are named hf_<name>_<exporter><opset>[_dynamic]
    model_class: str  # a transformers class, e.g. "DetrForObjectDetection"
    config: Callable[[], Any]  # builds the transformers config (no hub access)
    config_code: str  # the same, as recorded in the manifest
    post: str  # one of POST
    image: tuple[int, int]  # (H, W) of pixel_values
    follows: tuple[str, ...]  # the checkpoint whose config is followed, and the processor source
    what: str
    top_k: int = 100  # "sigmoid_topk" only


def _resnet18(out_features: list[str]) -> Any:
    from transformers import ResNetConfig

    return ResNetConfig(layer_type="basic", depths=[2, 2, 2, 2], hidden_sizes=[64, 128, 256, 512],
                        out_features=out_features)


R18 = 'ResNetConfig(layer_type="basic", depths=[2, 2, 2, 2], hidden_sizes=[64, 128, 256, 512], out_features={})'


def _detr() -> Any:
    from transformers import DetrConfig

    return DetrConfig(backbone_config=_resnet18(["stage4"]), use_timm_backbone=False, use_pretrained_backbone=False)


def _conditional_detr() -> Any:
    from transformers import ConditionalDetrConfig

    return ConditionalDetrConfig(backbone_config=_resnet18(["stage4"]), use_timm_backbone=False,
                                 use_pretrained_backbone=False)


def _deformable_detr() -> Any:
    from transformers import DeformableDetrConfig

    return DeformableDetrConfig(backbone_config=_resnet18(["stage2", "stage3", "stage4"]), use_timm_backbone=False,
                                use_pretrained_backbone=False, disable_custom_kernels=True)


def _rtdetr_backbone() -> Any:
    from transformers import RTDetrResNetConfig

    return RTDetrResNetConfig(layer_type="basic", depths=[2, 2, 2, 2], hidden_sizes=[64, 128, 256, 512],
                              downsample_in_bottleneck=True, out_features=["stage2", "stage3", "stage4"])


RTDETR_R18 = ("backbone_config=RTDetrResNetConfig(layer_type='basic', depths=[2, 2, 2, 2], hidden_sizes=[64, 128, "
              "256, 512], downsample_in_bottleneck=True, out_features=['stage2', 'stage3', 'stage4']), "
              "encoder_in_channels=[128, 256, 512], encoder_ffn_dim=1024, hidden_expansion=0.5, decoder_layers=3, "
              "use_pretrained_backbone=False")


def _rtdetr() -> Any:
    from transformers import RTDetrConfig

    return RTDetrConfig(backbone_config=_rtdetr_backbone(), encoder_in_channels=[128, 256, 512],
                        encoder_ffn_dim=1024, hidden_expansion=0.5, decoder_layers=3, use_pretrained_backbone=False)


def _rtdetr_v2() -> Any:
    from transformers import RTDetrV2Config

    return RTDetrV2Config(backbone_config=_rtdetr_backbone(), encoder_in_channels=[128, 256, 512],
                          encoder_ffn_dim=1024, hidden_expansion=0.5, decoder_layers=3,
                          use_pretrained_backbone=False)


def _yolos() -> Any:
    from transformers import YolosConfig

    return YolosConfig(hidden_size=192, num_hidden_layers=12, num_attention_heads=3, intermediate_size=768,
                       image_size=[800, 1333], use_mid_position_embeddings=False)


MODELS: tuple[HFModel, ...] = (
    HFModel("detr", "DetrForObjectDetection", _detr,
            "DetrConfig(backbone_config=" + R18.format("['stage4']") + ", use_timm_backbone=False, "
            "use_pretrained_backbone=False)", "softmax_max", (640, 640),
            (HF + "facebook/detr-resnet-50", SRC + "detr/image_processing_detr.py"),
            "DETR (ResNet-18-sized backbone, 6+6 layers, 100 queries, 92 logits), then DetrImageProcessor's "
            "post_process_object_detection math: softmax, drop no-object, max, cxcywh->xyxy x (w, h, w, h)"),
    HFModel("conditional_detr", "ConditionalDetrForObjectDetection", _conditional_detr,
            "ConditionalDetrConfig(backbone_config=" + R18.format("['stage4']") + ", use_timm_backbone=False, "
            "use_pretrained_backbone=False)", "sigmoid_topk", (640, 640),
            (HF + "microsoft/conditional-detr-resnet-50",
             SRC + "conditional_detr/image_processing_conditional_detr.py"),
            "Conditional DETR (ResNet-18-sized backbone, 6+6 layers, 300 queries), then its processor's math: "
            "sigmoid, top-100 over queries x classes, // and %, gather of xyxy boxes, scale"),
    HFModel("deformable_detr", "DeformableDetrForObjectDetection", _deformable_detr,
            "DeformableDetrConfig(backbone_config=" + R18.format("['stage2', 'stage3', 'stage4']") + ", "
            "use_timm_backbone=False, use_pretrained_backbone=False, disable_custom_kernels=True)", "sigmoid_topk",
            (640, 640),
            (HF + "SenseTime/deformable-detr", SRC + "deformable_detr/image_processing_deformable_detr.py"),
            "Deformable DETR (ResNet-18-sized backbone, 4 levels, 6+6 layers, 300 queries; multi-scale deformable "
            "attention in its PyTorch form, grid_sample), then its processor's math: sigmoid, top-100, gather, scale"),
    HFModel("rtdetr", "RTDetrForObjectDetection", _rtdetr, "RTDetrConfig(" + RTDETR_R18 + ")", "rtdetr",
            (640, 640), (HF + "PekingU/rtdetr_r18vd", SRC + "rt_detr/image_processing_rt_detr.py"),
            "RT-DETR r18vd-sized (hybrid encoder, 3 decoder layers, 300 queries, 80 classes), then "
            "RTDetrImageProcessor's math (use_focal_loss=True): xyxy scaled, sigmoid, top-300, % and //, gather"),
    HFModel("rtdetr_v2", "RTDetrV2ForObjectDetection", _rtdetr_v2, "RTDetrV2Config(" + RTDETR_R18 + ")", "rtdetr",
            (640, 640), (HF + "PekingU/rtdetr_v2_r18vd", SRC + "rt_detr/image_processing_rt_detr.py"),
            "RT-DETRv2 r18vd-sized (deformable attention with per-level sampling points), then RTDetrImageProcessor's "
            "math (use_focal_loss=True): xyxy scaled, sigmoid, top-300, % and //, gather"),
    HFModel("yolos", "YolosForObjectDetection", _yolos,
            "YolosConfig(hidden_size=192, num_hidden_layers=12, num_attention_heads=3, intermediate_size=768, "
            "image_size=[800, 1333], use_mid_position_embeddings=False)", "softmax_max", (512, 512),
            (HF + "hustvl/yolos-tiny", SRC + "yolos/image_processing_yolos.py"),
            "YOLOS-tiny-sized ViT (192 wide, 12 layers, 100 detection tokens; position embeddings interpolated "
            "from 800x1333 to the 512x512 input in the graph), then YolosImageProcessor's math: softmax, max, scale"),
)
MODELS_BY_NAME = {m.name: m for m in MODELS}


class Detect(nn.Module):
    """``model(pixel_values)`` then ``post_process_object_detection``'s tensor math, without its threshold loop.

    Outputs, batch-first and fixed-size: ``scores`` (B, K) float, ``labels`` (B, K) int64, ``boxes`` (B, K, 4) xyxy
    in pixels of ``target_sizes`` ((h, w) per image, int64). K is the number of queries ("softmax_max"), ``top_k``
    ("sigmoid_topk") or the number of queries ("rtdetr", whose processor takes the top num_queries).
    """

    def __init__(self, model: nn.Module, post: str, top_k: int = 100) -> None:
        super().__init__()
        if post not in POST:
            raise ValueError(f"unknown post-processing {post!r}")
        self.model = model
        self.post = post
        self.top_k = top_k

    def forward(self, pixel_values: Tensor, target_sizes: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        from transformers.image_transforms import center_to_corners_format

        out = self.model(pixel_values=pixel_values)
        out_logits, out_bbox = out.logits, out.pred_boxes
        img_h, img_w = target_sizes.unbind(1)
        scale_fct = torch.stack([img_w, img_h, img_w, img_h], dim=1).to(out_bbox.device)
        if self.post == "softmax_max":  # DetrImageProcessor / YolosImageProcessor
            prob = nn.functional.softmax(out_logits, -1)
            scores, labels = prob[..., :-1].max(-1)
            boxes = center_to_corners_format(out_bbox)
            boxes = boxes * scale_fct[:, None, :]
            return scores, labels, boxes
        if self.post == "sigmoid_topk":  # ConditionalDetrImageProcessor / DeformableDetrImageProcessor
            prob = out_logits.sigmoid()
            prob = prob.view(out_logits.shape[0], -1)
            k_value = min(self.top_k, prob.size(1))
            scores, topk_indexes = torch.topk(prob, k_value, dim=1)
            topk_boxes = torch.div(topk_indexes, out_logits.shape[2], rounding_mode="floor")
            labels = topk_indexes % out_logits.shape[2]
            boxes = center_to_corners_format(out_bbox)
            boxes = torch.gather(boxes, 1, topk_boxes.unsqueeze(-1).repeat(1, 1, 4))
            boxes = boxes * scale_fct[:, None, :]
            return scores, labels, boxes
        # RTDetrImageProcessor, use_focal_loss=True (its default): scale first, then top num_queries
        boxes = center_to_corners_format(out_bbox)
        boxes = boxes * scale_fct[:, None, :]
        num_top_queries = out_logits.shape[1]
        num_classes = out_logits.shape[2]
        scores = torch.nn.functional.sigmoid(out_logits)
        scores, index = torch.topk(scores.flatten(1), num_top_queries, dim=-1)
        labels = index % num_classes
        index = index // num_classes
        boxes = boxes.gather(dim=1, index=index.unsqueeze(-1).repeat(1, 1, boxes.shape[-1]))
        return scores, labels, boxes


INPUTS = ("pixel_values", "target_sizes")
OUTPUTS = ("scores", "labels", "boxes")
TARGET_SIZES = (480, 640)  # (h, w) of the original image every recipe image stands for


def build(m: HFModel, seed: int) -> nn.Module:
    """The wrapped model in eval mode, built from its config after ``torch.manual_seed(seed)``."""
    import transformers

    torch.manual_seed(seed)
    model = getattr(transformers, m.model_class)(m.config()).eval()
    return Detect(model, m.post, m.top_k).eval()


def example_inputs(m: HFModel, batch: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """The recipe: pixel_values uniform in [0, 1) from ``numpy.random.default_rng(seed)``, target_sizes TARGET_SIZES
    (int64 (h, w)) for every image. The same arrays trace the export and feed the onnxruntime check."""
    image = np.random.default_rng(seed).random((batch, 3, *m.image), dtype=np.float32)
    return image, np.array([TARGET_SIZES] * batch, dtype=np.int64)


def export(m: HFModel, exporter: str, opset: int, dynamic: bool, path: str, seed: int) -> dict[str, Any]:
    """Export one wrapped model to ``path``; return the source record (call, version, notes) for the manifest."""
    import transformers

    model = build(m, seed)
    # torch.export specializes a size-1 dim the code broadcasts ("specialized it to be a constant (1)"), so a
    # dynamic dynamo batch is traced at 2, as in corpus_heads.export; everything else at 1
    batch = 2 if exporter == "dynamo" and dynamic else 1
    args = tuple(torch.from_numpy(a) for a in example_inputs(m, batch, seed))
    kw: dict[str, Any] = {"opset_version": opset, "input_names": list(INPUTS), "output_names": list(OUTPUTS)}
    if exporter == "torchscript":
        kw["dynamo"] = False
        if dynamic:
            kw["dynamic_axes"] = {n: {0: "batch"} for n in (*INPUTS, *OUTPUTS)}
    else:
        kw["dynamo"] = True
        kw["external_data"] = False
        if dynamic:
            b = torch.export.Dim("batch")
            kw["dynamic_shapes"] = ({0: b}, {0: b})
    with torch.no_grad():
        torch.onnx.export(model, args, path, **kw)
    shown = {k: v for k, v in kw.items() if k not in ("input_names", "output_names")}
    if "dynamic_axes" in shown:
        shown["dynamic_axes"] = "{name: {0: 'batch'} for every input and output}"
    if "dynamic_shapes" in shown:
        shown["dynamic_shapes"] = "({0: torch.export.Dim('batch')},) * 2"
    call = (f"torch.manual_seed({seed}); model = Detect(transformers.{m.model_class}({m.config_code}).eval(), "
            f"{m.post!r}); pixel_values = torch.from_numpy(numpy.random.default_rng({seed}).random(({batch}, 3, "
            f"{m.image[0]}, {m.image[1]}), dtype=numpy.float32)); target_sizes = torch.tensor([{list(TARGET_SIZES)}]"
            f" * {batch}); "
            f"torch.onnx.export(model, (pixel_values, target_sizes), f, input_names={list(INPUTS)}, "
            f"output_names={list(OUTPUTS)}, " + ", ".join(f"{k}={v!s}" for k, v in shown.items()) + ")")
    return {"codebase": "transformers", "version": transformers.__version__, "call": call,
            "follows": list(m.follows),
            "notes": "random weights from the config (no download, no timm); Detect (models/corpus_transformers.py) "
                     "is the processor's post_process_object_detection math without its per-image threshold loop: "
                     "every candidate is returned, fixed shapes; node metadata_props and doc strings stripped"}
