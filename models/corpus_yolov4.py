"""YOLOv4 as Tianxiaomo/pytorch-YOLOv4 writes and exports it, for the corpus (issue #9).

That repository (https://github.com/Tianxiaomo/pytorch-YOLOv4, read at commit a65d219) is not installed nor
imported: the modules below are written from its source, with the same tensor operations in the same order, so
the exporters see the same op patterns:

- ``models.py`` lines 8-14 (``Mish``: ``x * tanh(softplus(x))``, no fused Mish op), 17-36 (``Upsample``: with
  ``inference=True`` a view/expand/view nearest upsample, not Resize), 39-66 (``Conv_Bn_Activation``), 69-95
  (``ResBlock``), 98-236 (``DownSample1`` .. ``DownSample5``: CSPDarknet53; 2-5 share one layout, written here
  as ``DownSample`` with the channel and block counts of each), 239-320 (``Neck``: SPP with max-pools 5/9/13,
  then the PANet top-down path), 323-406 (``Yolov4Head``: the bottom-up path and three YOLO layers, anchors and
  masks as there), 409-449 (``Yolov4``).
- ``tool/yolo_layer.py`` lines 148-288 (``yolo_forward_dynamic``: per-anchor channel slices, sigmoid/exp, grids
  from numpy baked in as constants, boxes normalized to [0, 1] as x1y1x2y2) and 290-321 (``YoloLayer``, eval
  branch); ``tool/torch_utils.py`` lines 48-64 (``get_region_boxes``: concatenation of the three levels).
- ``demo_pytorch2onnx.py`` lines 15-62: ``Yolov4(n_classes=80, inference=True)`` exported by the TorchScript
  exporter at opset 11, ``input_names=["input"]``, ``output_names=["boxes", "confs"]``, ``do_constant_folding``,
  the dynamic variant with ``{0: "batch_size"}`` on every input and output.

Outputs: ``boxes`` (B, N, 1, 4) and ``confs`` (B, N, 80), N = 3 * (52^2 + 26^2 + 13^2) = 10647 at 416x416.
No NMS (the repository runs it in numpy after onnxruntime). ``models/corpus.py`` builds, exports and checks the
models; nothing else imports this module.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F  # noqa: N812  (the source's spelling)
from torch import Tensor, nn

SRC = "https://github.com/Tianxiaomo/pytorch-YOLOv4/blob/a65d219/"
NUM_CLASSES = 80
IMAGE = (416, 416)  # (H, W): the repository's default size, a multiple of 32
ANCHORS = [12, 16, 19, 36, 40, 28, 36, 75, 76, 55, 72, 146, 142, 110, 192, 243, 459, 401]
INPUTS = ("input",)
OUTPUTS = ("boxes", "confs")


# ---------------------------------------------------------------------------------------------------------
# layers (models.py lines 8-95)
# ---------------------------------------------------------------------------------------------------------
class Mish(nn.Module):
    """``x * tanh(softplus(x))``, as models.py writes it (ONNX: Softplus, Tanh, Mul; no Mish op)."""

    def forward(self, x: Tensor) -> Tensor:
        return x * torch.tanh(F.softplus(x))


class Upsample(nn.Module):
    """Nearest upsample to ``target_size``; in inference mode as view/expand/view (what the export traces)."""

    def forward(self, x: Tensor, target_size: Any, inference: bool = False) -> Tensor:
        if inference:
            return x.view(x.size(0), x.size(1), x.size(2), 1, x.size(3), 1).expand(
                x.size(0), x.size(1), x.size(2), target_size[2] // x.size(2), x.size(3),
                target_size[3] // x.size(3)).contiguous().view(x.size(0), x.size(1), target_size[2], target_size[3])
        return F.interpolate(x, size=(target_size[2], target_size[3]), mode="nearest")


class ConvBnAct(nn.Module):
    """``Conv_Bn_Activation``: Conv2d (pad k//2), optional BatchNorm, then mish | relu | leaky (0.1) | linear."""

    def __init__(self, cin: int, cout: int, k: int, s: int, act: str, bn: bool = True, bias: bool = False) -> None:
        super().__init__()
        self.conv = nn.ModuleList([nn.Conv2d(cin, cout, k, s, (k - 1) // 2, bias=bias)])
        if bn:
            self.conv.append(nn.BatchNorm2d(cout))
        if act == "mish":
            self.conv.append(Mish())
        elif act == "relu":
            self.conv.append(nn.ReLU(inplace=True))
        elif act == "leaky":
            self.conv.append(nn.LeakyReLU(0.1, inplace=True))
        elif act != "linear":
            raise ValueError(f"unknown activation {act!r}")

    def forward(self, x: Tensor) -> Tensor:
        for layer in self.conv:
            x = layer(x)
        return x


class ResBlock(nn.Module):
    """``nblocks`` residual pairs (1x1 then 3x3, Mish), each added to its input."""

    def __init__(self, ch: int, nblocks: int = 1, shortcut: bool = True) -> None:
        super().__init__()
        self.shortcut = shortcut
        self.module_list = nn.ModuleList(
            nn.ModuleList([ConvBnAct(ch, ch, 1, 1, "mish"), ConvBnAct(ch, ch, 3, 1, "mish")]) for _ in range(nblocks))

    def forward(self, x: Tensor) -> Tensor:
        for module in self.module_list:
            h = x
            for res in module:
                h = res(h)
            x = x + h if self.shortcut else h
        return x


# ---------------------------------------------------------------------------------------------------------
# CSPDarknet53 (models.py lines 98-236)
# ---------------------------------------------------------------------------------------------------------
class DownSample1(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = ConvBnAct(3, 32, 3, 1, "mish")
        self.conv2 = ConvBnAct(32, 64, 3, 2, "mish")
        self.conv3 = ConvBnAct(64, 64, 1, 1, "mish")
        self.conv4 = ConvBnAct(64, 64, 1, 1, "mish")  # route -2
        self.conv5 = ConvBnAct(64, 32, 1, 1, "mish")
        self.conv6 = ConvBnAct(32, 64, 3, 1, "mish")  # shortcut -3
        self.conv7 = ConvBnAct(64, 64, 1, 1, "mish")
        self.conv8 = ConvBnAct(128, 64, 1, 1, "mish")  # route -1, -7

    def forward(self, x: Tensor) -> Tensor:
        x1 = self.conv1(x)
        x2 = self.conv2(x1)
        x3 = self.conv3(x2)
        x4 = self.conv4(x2)
        x6 = self.conv6(self.conv5(x4)) + x4
        x7 = torch.cat([self.conv7(x6), x3], dim=1)
        return self.conv8(x7)


class DownSample(nn.Module):
    """``DownSample2`` .. ``DownSample5``: a stride-2 conv, a CSP split (two 1x1 halves), ``nblocks`` residual
    pairs on one half, a 1x1, concatenation with the other half, a 1x1."""

    def __init__(self, cin: int, cout: int, nblocks: int) -> None:
        super().__init__()
        half = cout // 2
        self.conv1 = ConvBnAct(cin, cout, 3, 2, "mish")
        self.conv2 = ConvBnAct(cout, half, 1, 1, "mish")
        self.conv3 = ConvBnAct(cout, half, 1, 1, "mish")
        self.resblock = ResBlock(ch=half, nblocks=nblocks)
        self.conv4 = ConvBnAct(half, half, 1, 1, "mish")
        self.conv5 = ConvBnAct(cout, cout, 1, 1, "mish")

    def forward(self, x: Tensor) -> Tensor:
        x1 = self.conv1(x)
        x2 = self.conv2(x1)
        x3 = self.conv3(x1)
        x4 = self.conv4(self.resblock(x3))
        return self.conv5(torch.cat([x4, x2], dim=1))


# ---------------------------------------------------------------------------------------------------------
# SPP + PANet (models.py lines 239-320) and head (lines 323-406)
# ---------------------------------------------------------------------------------------------------------
def _leaky(*spec: tuple[int, int, int]) -> list[ConvBnAct]:
    return [ConvBnAct(cin, cout, k, 1, "leaky") for cin, cout, k in spec]


class Neck(nn.Module):
    def __init__(self, inference: bool = False) -> None:
        super().__init__()
        self.inference = inference
        self.conv1, self.conv2, self.conv3 = _leaky((1024, 512, 1), (512, 1024, 3), (1024, 512, 1))
        self.maxpool1 = nn.MaxPool2d(kernel_size=5, stride=1, padding=5 // 2)
        self.maxpool2 = nn.MaxPool2d(kernel_size=9, stride=1, padding=9 // 2)
        self.maxpool3 = nn.MaxPool2d(kernel_size=13, stride=1, padding=13 // 2)
        self.conv4, self.conv5, self.conv6, self.conv7 = _leaky((2048, 512, 1), (512, 1024, 3), (1024, 512, 1),
                                                                (512, 256, 1))
        self.upsample1 = Upsample()
        self.conv8, self.conv9, self.conv10, self.conv11, self.conv12, self.conv13, self.conv14 = _leaky(
            (512, 256, 1), (512, 256, 1), (256, 512, 3), (512, 256, 1), (256, 512, 3), (512, 256, 1), (256, 128, 1))
        self.upsample2 = Upsample()
        self.conv15, self.conv16, self.conv17, self.conv18, self.conv19, self.conv20 = _leaky(
            (256, 128, 1), (256, 128, 1), (128, 256, 3), (256, 128, 1), (128, 256, 3), (256, 128, 1))

    def forward(self, x: Tensor, downsample4: Tensor, downsample3: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        x3 = self.conv3(self.conv2(self.conv1(x)))
        spp = torch.cat([self.maxpool3(x3), self.maxpool2(x3), self.maxpool1(x3), x3], dim=1)
        x6 = self.conv6(self.conv5(self.conv4(spp)))
        up = self.upsample1(self.conv7(x6), downsample4.size(), self.inference)
        x8 = torch.cat([self.conv8(downsample4), up], dim=1)
        x13 = self.conv13(self.conv12(self.conv11(self.conv10(self.conv9(x8)))))
        up = self.upsample2(self.conv14(x13), downsample3.size(), self.inference)
        x15 = torch.cat([self.conv15(downsample3), up], dim=1)
        x20 = self.conv20(self.conv19(self.conv18(self.conv17(self.conv16(x15)))))
        return x20, x13, x6


def yolo_forward_dynamic(output: Tensor, num_classes: int, anchors: list[float], num_anchors: int,
                         scale_x_y: float) -> tuple[Tensor, Tensor]:
    """tool/yolo_layer.py ``yolo_forward_dynamic``: boxes (B, A*H*W, 1, 4) x1y1x2y2 in [0, 1] of the image,
    confs (B, A*H*W, num_classes) = sigmoid(class) * sigmoid(objectness)."""
    bxy_list, bwh_list, det_list, cls_list = [], [], [], []
    for i in range(num_anchors):
        begin, end = i * (5 + num_classes), (i + 1) * (5 + num_classes)
        bxy_list.append(output[:, begin:begin + 2])
        bwh_list.append(output[:, begin + 2:begin + 4])
        det_list.append(output[:, begin + 4:begin + 5])
        cls_list.append(output[:, begin + 5:end])
    bxy = torch.cat(bxy_list, dim=1)
    bwh = torch.cat(bwh_list, dim=1)
    det_confs = torch.cat(det_list, dim=1)
    det_confs = det_confs.view(output.size(0), num_anchors * output.size(2) * output.size(3))
    cls_confs = torch.cat(cls_list, dim=1)
    cls_confs = cls_confs.view(output.size(0), num_anchors, num_classes, output.size(2) * output.size(3))
    cls_confs = cls_confs.permute(0, 1, 3, 2).reshape(
        output.size(0), num_anchors * output.size(2) * output.size(3), num_classes)

    bxy = torch.sigmoid(bxy) * scale_x_y - 0.5 * (scale_x_y - 1)
    bwh = torch.exp(bwh)
    det_confs = torch.sigmoid(det_confs)
    cls_confs = torch.sigmoid(cls_confs)

    # the grids are numpy arrays of the traced H and W: constants in the graph, as in the source
    h, w = output.size(2), output.size(3)
    grid_x = np.expand_dims(np.expand_dims(np.expand_dims(np.linspace(0, w - 1, w), axis=0).repeat(h, 0), axis=0),
                            axis=0)
    grid_y = np.expand_dims(np.expand_dims(np.expand_dims(np.linspace(0, h - 1, h), axis=1).repeat(w, 1), axis=0),
                            axis=0)
    anchor_w = [anchors[i * 2] for i in range(num_anchors)]
    anchor_h = [anchors[i * 2 + 1] for i in range(num_anchors)]

    bx_list, by_list, bw_list, bh_list = [], [], [], []
    for i in range(num_anchors):
        ii = i * 2
        bx_list.append(bxy[:, ii:ii + 1] + torch.tensor(grid_x, dtype=torch.float32))
        by_list.append(bxy[:, ii + 1:ii + 2] + torch.tensor(grid_y, dtype=torch.float32))
        bw_list.append(bwh[:, ii:ii + 1] * anchor_w[i])
        bh_list.append(bwh[:, ii + 1:ii + 2] * anchor_h[i])
    bx = torch.cat(bx_list, dim=1)
    by = torch.cat(by_list, dim=1)
    bw = torch.cat(bw_list, dim=1)
    bh = torch.cat(bh_list, dim=1)
    bx_bw = torch.cat((bx, bw), dim=1)
    by_bh = torch.cat((by, bh), dim=1)
    bx_bw /= output.size(3)  # in place, as the source: normalize to [0, 1]
    by_bh /= output.size(2)

    n = num_anchors * output.size(2) * output.size(3)
    bx = bx_bw[:, :num_anchors].view(output.size(0), n, 1)
    by = by_bh[:, :num_anchors].view(output.size(0), n, 1)
    bw = bx_bw[:, num_anchors:].view(output.size(0), n, 1)
    bh = by_bh[:, num_anchors:].view(output.size(0), n, 1)
    bx1 = bx - bw * 0.5
    by1 = by - bh * 0.5
    bx2 = bx1 + bw
    by2 = by1 + bh
    boxes = torch.cat((bx1, by1, bx2, by2), dim=2).view(output.size(0), n, 1, 4)
    det_confs = det_confs.view(output.size(0), n, 1)
    return boxes, cls_confs * det_confs


class YoloLayer(nn.Module):
    """Eval branch of tool/yolo_layer.py ``YoloLayer``: the masked anchors in grid units, then the decode."""

    def __init__(self, anchor_mask: list[int], num_classes: int, anchors: list[int], num_anchors: int,
                 stride: int) -> None:
        super().__init__()
        self.anchor_mask = anchor_mask
        self.num_classes = num_classes
        self.anchors = anchors
        self.anchor_step = len(anchors) // num_anchors
        self.stride = stride
        self.scale_x_y = 1

    def forward(self, output: Tensor) -> tuple[Tensor, Tensor] | Tensor:
        if self.training:
            return output
        masked: list[float] = []
        for m in self.anchor_mask:
            masked += self.anchors[m * self.anchor_step:(m + 1) * self.anchor_step]
        masked = [a / self.stride for a in masked]
        return yolo_forward_dynamic(output, self.num_classes, masked, len(self.anchor_mask), self.scale_x_y)


def get_region_boxes(boxes_and_confs: list[Any]) -> list[Tensor]:
    """tool/torch_utils.py: concatenate the levels' boxes and confs along the box axis."""
    return [torch.cat([b for b, _ in boxes_and_confs], dim=1), torch.cat([c for _, c in boxes_and_confs], dim=1)]


class Yolov4Head(nn.Module):
    def __init__(self, output_ch: int, n_classes: int, inference: bool = False) -> None:
        super().__init__()
        self.inference = inference

        def yolo(mask: list[int], stride: int) -> YoloLayer:
            return YoloLayer(mask, n_classes, ANCHORS, 9, stride)

        def out(cin: int) -> ConvBnAct:
            return ConvBnAct(cin, output_ch, 1, 1, "linear", bn=False, bias=True)

        self.conv1 = ConvBnAct(128, 256, 3, 1, "leaky")
        self.conv2 = out(256)
        self.yolo1 = yolo([0, 1, 2], 8)
        self.conv3 = ConvBnAct(128, 256, 3, 2, "leaky")
        self.conv4, self.conv5, self.conv6, self.conv7, self.conv8, self.conv9 = _leaky(
            (512, 256, 1), (256, 512, 3), (512, 256, 1), (256, 512, 3), (512, 256, 1), (256, 512, 3))
        self.conv10 = out(512)
        self.yolo2 = yolo([3, 4, 5], 16)
        self.conv11 = ConvBnAct(256, 512, 3, 2, "leaky")
        self.conv12, self.conv13, self.conv14, self.conv15, self.conv16, self.conv17 = _leaky(
            (1024, 512, 1), (512, 1024, 3), (1024, 512, 1), (512, 1024, 3), (1024, 512, 1), (512, 1024, 3))
        self.conv18 = out(1024)
        self.yolo3 = yolo([6, 7, 8], 32)

    def forward(self, input1: Tensor, input2: Tensor, input3: Tensor) -> list[Tensor]:
        x2 = self.conv2(self.conv1(input1))
        x3 = torch.cat([self.conv3(input1), input2], dim=1)
        x8 = self.conv8(self.conv7(self.conv6(self.conv5(self.conv4(x3)))))
        x10 = self.conv10(self.conv9(x8))
        x11 = torch.cat([self.conv11(x8), input3], dim=1)
        x16 = self.conv16(self.conv15(self.conv14(self.conv13(self.conv12(x11)))))
        x18 = self.conv18(self.conv17(x16))
        if self.inference:
            return get_region_boxes([self.yolo1(x2), self.yolo2(x10), self.yolo3(x18)])
        return [x2, x10, x18]


class Yolov4(nn.Module):
    """models.py ``Yolov4``: CSPDarknet53 (Mish), SPP + PANet (LeakyReLU), three YOLO heads."""

    def __init__(self, n_classes: int = NUM_CLASSES, inference: bool = False) -> None:
        super().__init__()
        output_ch = (4 + 1 + n_classes) * 3
        self.down1 = DownSample1()
        self.down2 = DownSample(64, 128, 2)
        self.down3 = DownSample(128, 256, 8)
        self.down4 = DownSample(256, 512, 8)
        self.down5 = DownSample(512, 1024, 4)
        self.neck = Neck(inference)
        self.head = Yolov4Head(output_ch, n_classes, inference)

    def forward(self, x: Tensor) -> list[Tensor]:
        d3 = self.down3(self.down2(self.down1(x)))
        d4 = self.down4(d3)
        d5 = self.down5(d4)
        x20, x13, x6 = self.neck(d5, d4, d3)
        return self.head(x20, x13, x6)


# ---------------------------------------------------------------------------------------------------------
# the corpus models and their export
# ---------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class V4Model:
    """One model of this code base: how to build it and what the manifest says about it."""

    name: str  # the corpus entries are named <name>_<ts|dynamo><opset>[_dynamic]
    make: Callable[[], nn.Module]
    make_code: str  # the same, as recorded in the manifest
    follows: tuple[str, ...]
    what: str


MODELS: tuple[V4Model, ...] = (
    V4Model("yolov4", lambda: Yolov4(n_classes=NUM_CLASSES, inference=True),
            f"Yolov4(n_classes={NUM_CLASSES}, inference=True)",
            (SRC + "models.py", SRC + "tool/yolo_layer.py", SRC + "demo_pytorch2onnx.py"),
            "YOLOv4 (Tianxiaomo/pytorch-YOLOv4): CSPDarknet53 with Mish as x*tanh(softplus(x)), SPP, PANet, three "
            "YOLO layers decoded by yolo_forward_dynamic; boxes (B,10647,1,4), confs (B,10647,80), no NMS"),
)
MODELS_BY_NAME = {m.name: m for m in MODELS}


def example_input(batch: int, seed: int) -> np.ndarray:
    """The recipe (models/corpus.py's "image" kind): uniform [0, 1) from ``numpy.random.default_rng(seed)``."""
    return np.random.default_rng(seed).random((batch, 3, *IMAGE), dtype=np.float32)


def export(m: V4Model, exporter: str, opset: int, dynamic: bool, path: str, seed: int) -> dict[str, Any]:
    """Export one model to ``path`` as demo_pytorch2onnx.py does; return the source record for the manifest."""
    torch.manual_seed(seed)
    model = m.make().eval()
    x = torch.from_numpy(example_input(1, seed))
    kw: dict[str, Any] = {"opset_version": opset, "input_names": list(INPUTS), "output_names": list(OUTPUTS)}
    if exporter == "torchscript":
        kw |= {"dynamo": False, "export_params": True, "do_constant_folding": True}
        if dynamic:
            kw["dynamic_axes"] = {n: {0: "batch_size"} for n in (*INPUTS, *OUTPUTS)}
    else:
        if dynamic:
            raise ValueError("no dynamic-batch dynamo entry: the numpy grids are traced as constants")
        kw |= {"dynamo": True, "external_data": False}
    with torch.no_grad():
        torch.onnx.export(model, (x,), path, **kw)
    shown = {k: v for k, v in kw.items() if k not in ("input_names", "output_names")}
    if "dynamic_axes" in shown:
        shown["dynamic_axes"] = "{name: {0: 'batch_size'} for every input and output}"
    call = (f"torch.manual_seed({seed}); model = models/corpus_yolov4.py {m.make_code}.eval(); "
            f"x = torch.from_numpy(numpy.random.default_rng({seed}).random((1, 3, {IMAGE[0]}, {IMAGE[1]}), "
            f"dtype=numpy.float32)); torch.onnx.export(model, (x,), f, input_names={list(INPUTS)}, "
            f"output_names={list(OUTPUTS)}, " + ", ".join(f"{k}={v!s}" for k, v in shown.items()) + ")")
    return {"codebase": "yolov4", "version": "written from source (not installed), Tianxiaomo/pytorch-YOLOv4 a65d219",
            "call": call, "follows": list(m.follows),
            "notes": "random weights (no darknet/.pth weights loaded); the repository's demo exports with "
                     "torch.randn input and requires_grad=True, here the recipe image under torch.no_grad() (same "
                     "graph); node metadata_props and doc strings stripped"}
