"""Detectors exported from their own repositories at pinned commits, for the corpus (issue #9).

Five code bases are cloned at the commits pinned in ``REPOS`` and one is a package (``effdet``, pinned in
corpus_requirements.txt). Each model is built from the repository's own config with random weights
(``torch.manual_seed(0)``, no checkpoint, no download) and exported the way the repository's own export script
does it: the script and what it does are named with each code base below. Nothing here is imported from those
code bases at module level; ``models/corpus.py`` lists the variants (``VARIANTS``) and exports each in a child
process (``python corpus_repos.py --child ...``), because yolov5, yolov7 and YOLOv6 each bring a top-level
``models`` or ``utils`` package of their own.

Sources: ``<sources>/<folder>`` for each code base (``corpus.py --sources``, default ``<out>/src``). A missing
folder is cloned from GitHub and checked out at the pinned commit; a git checkout at another commit is refused;
a plain tree (no ``.git``) is taken as given, and its record says the commit was not verified.

- ultralytics/yolov5 ``export.py``: ``attempt_load(fuse=True)``, ``Detect.inplace`` (``--inplace``),
  ``Detect.dynamic`` (``--dynamic``: batch, height, width), ``Detect.export = True``, two dry runs, opset 12 (its
  default) and 17; metadata ``stride`` and ``names`` added as export.py adds them.
- WongKinYiu/yolov7 ``export.py``: ``Model(cfg/deploy/...)`` fused; its Hardswish/SiLU export modules;
  ``--grid`` (the decode in the graph, ``Detect.concat``), ``--end2end`` with onnxruntime's NonMaxSuppression
  (``End2End``, max_wh 640, top-k 100, IoU 0.45, conf 0 so random weights reach the NMS), ``--dynamic-batch``.
- Megvii-BaseDetection/YOLOX ``tools/export_onnx.py``: ``exp.get_model()``, SiLU replaced by its export SiLU,
  ``head.decode_in_inference`` on (``--decode_in_inference``) or off, opset 11 (its default) and 13, dynamic
  batch; YOLOX takes 0-255 pixels.
- meituan/YOLOv6 ``deploy/ONNX/export_onnx.py``: ``fuse_model`` and RepVGG ``switch_to_deploy``, export SiLU,
  opset 13 (its default), ``--dynamic-batch``, ``--end2end --ort`` (onnxruntime NMS, top-k 100, IoU 0.65, conf 0).
- RangiLyu/nanodet ``tools/export_onnx.py``: ``build_model(cfg.model)`` (backbone ``pretrain=False``),
  ``keep_initializers_as_inputs=True`` (every initializer also a graph input), opset 11; the training-only
  imports (pytorch_lightning, pycocotools, termcolor) are stubbed, the model graph does not use them.
- effdet 0.4.1 (rwightman/efficientdet-pytorch): ``create_model(pretrained=False, pretrained_backbone=False)``
  raw (class and box outputs per level) and with ``bench_task="predict"`` (anchor decode, batched NMS and top-k
  in the graph; its ``@torch.jit.script`` ``_batch_detection`` fails the TorchScript exporter, so one variant
  re-creates it unscripted, as a user would to export it).

Every code base is also exported by torch.onnx's dynamo exporter at opset 18 (``dynamo=True``): some succeed, the
data-dependent NMS of effdet's predict does not; a failure is an ``export_failed`` entry in the manifest.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import traceback
import types
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


@dataclass(frozen=True)
class Repo:
    url: str
    commit: str
    folder: str  # under the sources folder


REPOS: dict[str, Repo] = {
    "ultralytics/yolov5": Repo("https://github.com/ultralytics/yolov5", "5081342f04fb287fc2e5f2b5a4e06752b7937b1c",
                               "yolov5"),
    "WongKinYiu/yolov7": Repo("https://github.com/WongKinYiu/yolov7", "a207844b1ce82d204ab36d87d496728d3d2348e7",
                              "yolov7"),
    "Megvii-BaseDetection/YOLOX": Repo("https://github.com/Megvii-BaseDetection/YOLOX",
                                       "6ddff4824372906469a7fae2dc3206c7aa4bbaee", "YOLOX"),
    "meituan/YOLOv6": Repo("https://github.com/meituan/YOLOv6", "e86a483f3f6bded25d45970b56831345a99744a4",
                           "YOLOv6"),
    "RangiLyu/nanodet": Repo("https://github.com/RangiLyu/nanodet", "be9b4a9001d7f9b6fc89c2df31ae8d428e35b4f0",
                             "nanodet"),
}
EFFDET = "effdet"  # a package, no repository to clone


@dataclass(frozen=True)
class Variant:
    """One export of one code base: what corpus.py turns into an Entry."""

    name: str
    codebase: str  # a REPOS key or EFFDET
    arch: str  # the code base's config: yolov5n, training/yolov7-tiny, yolox_nano, yolov6n, nanodet-plus-m_320 ...
    tag: str  # the export form, read by the child: static, inplace, dynbatch, dynbhw, grid, nogrid, e2e, dec,
    #           nodec, raw, predict, predict_unscripted
    exporter: str  # "torchscript" | "dynamo"
    opset: int
    image: tuple[int, int, int, int]  # NCHW of the recipe
    what: str
    nms: bool = False
    scale: float = 1.0  # the recipe's pixel range is [0, scale]

    @property
    def dynamic(self) -> str:
        """"" (static), "batch" or "bhw" (batch, height and width)."""
        return {"dynbatch": "batch", "dyndec": "batch", "dynbhw": "bhw"}.get(self.tag, "")

    @property
    def check_shapes(self) -> tuple[tuple[int, ...], ...]:
        n, c, h, w = self.image
        return {"batch": ((2, c, h, w),), "bhw": ((2, c, 480, 640),)}.get(self.dynamic, ())


def _v(name: str, codebase: str, arch: str, tag: str, opset: int, side: int, what: str, **kw: Any) -> Variant:
    """A square `side` x `side` export; opset 18 means the dynamo exporter (its lowest), below it TorchScript."""
    return Variant(name, codebase, arch, tag, "dynamo" if opset >= 18 else "torchscript", opset, (1, 3, side, side),
                   what, **kw)


Y5, Y7, YX, Y6, ND = "ultralytics/yolov5", "WongKinYiu/yolov7", "Megvii-BaseDetection/YOLOX", "meituan/YOLOv6", \
    "RangiLyu/nanodet"
VARIANTS: tuple[Variant, ...] = (
    _v("yolov5_v5n_static12", Y5, "yolov5n", "static", 12, 640, "yolov5n (original repo, anchors), export.py defaults"),
    _v("yolov5_v5n_static17", Y5, "yolov5n", "static", 17, 640, "yolov5n, opset 17"),
    _v("yolov5_v5n_dynbatch17", Y5, "yolov5n", "dynbatch", 17, 640, "yolov5n"),
    _v("yolov5_v5n_dynbhw17", Y5, "yolov5n", "dynbhw", 17, 640, "yolov5n, export.py --dynamic"),
    _v("yolov5_v5n_inplace17", Y5, "yolov5n", "inplace", 17, 640, "yolov5n, --inplace (decode through slice writes)"),
    _v("yolov5_v5n_dynamo18", Y5, "yolov5n", "static", 18, 640, "yolov5n, dynamo exporter"),
    _v("yolov5_v5n_seg_static17", Y5, "yolov5n-seg", "static", 17, 640,
       "yolov5n-seg: boxes, mask coefficients, protos"),
    _v("yolov5_v5n_seg_dynbhw17", Y5, "yolov5n-seg", "dynbhw", 17, 640, "yolov5n-seg, export.py --dynamic"),
    _v("yolov5_v5s_static17", Y5, "yolov5s", "static", 17, 640, "yolov5s"),
    _v("yolov7_tiny_nogrid12", Y7, "yolov7-tiny", "nogrid", 12, 640, "yolov7-tiny, raw per-level outputs"),
    _v("yolov7_tiny_grid12", Y7, "yolov7-tiny", "grid", 12, 640, "yolov7-tiny, --grid (decode in the graph)"),
    _v("yolov7_tiny_e2e12", Y7, "yolov7-tiny", "e2e", 12, 640, "yolov7-tiny, --grid --end2end with onnxruntime NMS",
       nms=True),
    _v("yolov7_tiny_dynbatch_grid12", Y7, "yolov7-tiny", "dynbatch", 12, 640, "yolov7-tiny, --grid --dynamic-batch"),
    _v("yolov7_tiny_dynamo_nogrid18", Y7, "yolov7-tiny", "nogrid", 18, 640, "yolov7-tiny raw, dynamo exporter"),
    _v("yolov7_tiny_dynamo_grid18", Y7, "yolov7-tiny", "grid", 18, 640, "yolov7-tiny --grid, dynamo exporter"),
    _v("yolov7_training_tiny_grid12", Y7, "training/yolov7-tiny", "grid", 12, 640,
       "yolov7-tiny training config (IDetect head, implicit add/mul), --grid"),
    _v("yolox_nano_dec11", YX, "yolox_nano", "dec", 11, 416, "YOLOX-nano, decode in inference", scale=255.0),
    _v("yolox_nano_nodec11", YX, "yolox_nano", "nodec", 11, 416, "YOLOX-nano, raw head", scale=255.0),
    _v("yolox_nano_dyndec13", YX, "yolox_nano", "dyndec", 13, 416, "YOLOX-nano, decode, --dynamic", scale=255.0),
    _v("yolox_nano_dynamo_dec18", YX, "yolox_nano", "dec", 18, 416, "YOLOX-nano, decode, dynamo exporter",
       scale=255.0),
    _v("yolox_s_dec13", YX, "yolox_s", "dec", 13, 640, "YOLOX-s, decode in inference", scale=255.0),
    _v("yolov6_n_plain13", Y6, "yolov6n", "static", 13, 640, "YOLOv6n, RepVGG deployed"),
    _v("yolov6_n_dynbatch13", Y6, "yolov6n", "dynbatch", 13, 640, "YOLOv6n, --dynamic-batch"),
    _v("yolov6_n_e2e13", Y6, "yolov6n", "e2e", 13, 640, "YOLOv6n, --end2end --ort (onnxruntime NMS)", nms=True),
    _v("yolov6_n_dynamo18", Y6, "yolov6n", "static", 18, 640, "YOLOv6n, dynamo exporter"),
    _v("yolov6_lite_s_plain13", Y6, "yolov6_lite/yolov6_lite_s", "static", 13, 640, "YOLOv6-lite-s"),
    _v("nanodet_plus_m_320_op11", ND, "nanodet-plus-m_320", "static", 11, 320,
       "NanoDet-Plus-m 320, every initializer also a graph input"),
    _v("nanodet_plus_m_416_op11", ND, "nanodet-plus-m_416", "static", 11, 416, "NanoDet-Plus-m 416"),
    _v("nanodet_plus_m_320_dynamo18", ND, "nanodet-plus-m_320", "static", 18, 320, "NanoDet-Plus-m 320, dynamo"),
    _v("effdet_tf_d0_raw13", EFFDET, "tf_efficientdet_d0", "raw", 13, 512, "EfficientDet-D0 (TF port), raw outputs"),
    _v("effdet_d0_raw13", EFFDET, "efficientdet_d0", "raw", 13, 512, "EfficientDet-D0 (PyTorch), raw outputs"),
    _v("effdet_tf_d0_dynamo_raw18", EFFDET, "tf_efficientdet_d0", "raw", 18, 512, "EfficientDet-D0, raw, dynamo"),
    _v("effdet_tf_d0_predict13", EFFDET, "tf_efficientdet_d0", "predict", 13, 512,
       "EfficientDet-D0 with its decode, NMS and top-k (DetBenchPredict)", nms=True),
    _v("effdet_tf_d0_predict_unscripted13", EFFDET, "tf_efficientdet_d0", "predict_unscripted", 13, 512,
       "EfficientDet-D0 predict, _batch_detection unscripted so the exporter traces it", nms=True),
    _v("effdet_tf_d0_dynamo_predict18", EFFDET, "tf_efficientdet_d0", "predict", 18, 512,
       "EfficientDet-D0 predict, dynamo exporter", nms=True),
)


def one_line(exc: BaseException) -> str:
    """The innermost cause's first line, plus the user frame torch.export names, as one short line."""
    chain = [exc]
    while chain[-1].__cause__ is not None and len(chain) < 8:
        chain.append(chain[-1].__cause__)
    root = chain[-1]
    text = str(root).strip()
    first = re.sub(r"\s+", " ", text.splitlines()[0] if text else "")
    if len(first) > 240:
        first = first[:237] + "..."
    where = re.search(r"Caused by: \(([^)]*)\)", "\n".join(str(c) for c in chain))
    return f"{type(root).__name__}: {first}" + (f" [at {where.group(1)}]" if where else "")


# ---------------------------------------------------------------------------------------------------------
# sources
# ---------------------------------------------------------------------------------------------------------
def ensure_source(codebase: str, sources: Path) -> tuple[Path, str]:
    """The source tree of ``codebase`` under ``sources``, cloned at its commit if missing; and a note saying how
    its commit was verified. Raises RuntimeError for a checkout at another commit or a failed clone."""
    repo = REPOS[codebase]
    tree = sources / repo.folder
    if not tree.exists():
        sources.mkdir(parents=True, exist_ok=True)
        tmp = sources / f".clone-{repo.folder}"
        shutil.rmtree(tmp, ignore_errors=True)
        for cmd in (["git", "clone", "--quiet", "--no-checkout", repo.url, str(tmp)],
                    ["git", "-C", str(tmp), "checkout", "--quiet", "--detach", repo.commit]):
            r = subprocess.run(cmd, capture_output=True, text=True)
            if r.returncode:
                shutil.rmtree(tmp, ignore_errors=True)
                last = (r.stderr.strip().splitlines() or [f"exit {r.returncode}"])[-1]
                raise RuntimeError(f"{' '.join(cmd[:3])} {repo.url} at {repo.commit[:7]} failed: {last}")
        tmp.rename(tree)
    if (tree / ".git").exists():
        head = subprocess.run(["git", "-C", str(tree), "rev-parse", "HEAD"], capture_output=True,
                              text=True).stdout.strip()
        if head != repo.commit:
            raise RuntimeError(f"{tree} is at {head or 'no commit'}, the corpus pins {repo.commit}")
        return tree, f"git checkout at {repo.commit}"
    return tree, f"source tree given as a folder (not a git checkout): commit {repo.commit} not verified"


def export_in_child(v: Variant, sources: Path, dst: Path, timeout: float = 1800.0) -> dict[str, Any]:
    """Export ``v`` into ``dst`` in a child process; its source record. Raises RuntimeError(one line) when the
    exporter refused the model, with the child's last line as the reason."""
    tree, verified = (ensure_source(v.codebase, sources) if v.codebase in REPOS else (None, ""))
    record = dst.with_suffix(".json")
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", v.name, str(tree or ""), str(dst), str(record)]
    r = subprocess.run(cmd, timeout=timeout, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    sys.stdout.write(r.stdout)
    if r.returncode or not record.exists():
        last = [ln for ln in r.stdout.strip().splitlines() if ln.strip()][-1:] or [f"exit {r.returncode}"]
        raise RuntimeError(last[0][:300])
    source = json.loads(record.read_text())
    record.unlink()
    if verified:
        source["notes"] += f"; {verified}"
    return source


# ---------------------------------------------------------------------------------------------------------
# the child: one export, the repository first on sys.path
# ---------------------------------------------------------------------------------------------------------
def _enter(tree: str) -> None:
    sys.path[:] = [tree] + [p for p in sys.path if Path(p or ".").resolve() != HERE]
    os.chdir(tree)


def _stub_modules(names: list[str], **attrs: dict[str, Any]) -> None:
    for n in names:
        if n not in sys.modules:
            sys.modules[n] = types.ModuleType(n)
    for n, values in attrs.items():
        sys.modules[n.replace("__", ".")].__dict__.update(values)


def _yolov5(v: Variant, torch: Any) -> tuple[Any, dict[str, Any], str]:
    from models.yolo import Detect, Model, SegmentationModel  # the repository's own package

    seg = v.arch.endswith("-seg")
    cfg = f"models/{'segment/' if seg else ''}{v.arch}.yaml"
    model = (SegmentationModel if seg else Model)(cfg, ch=3, nc=80).float()
    with torch.no_grad():
        model = model.fuse().eval()
    for m in model.modules():
        if isinstance(m, Detect):
            m.inplace, m.dynamic, m.export = v.tag == "inplace", v.dynamic != "" and v.exporter != "dynamo", True
    im = torch.zeros(v.image)
    for _ in range(2):
        model(im)
    outs = ["output0", "output1"] if seg else ["output0"]
    axes = None
    if v.dynamic == "batch":
        axes = {"images": {0: "batch"}} | {o: {0: "batch"} for o in outs}
    elif v.dynamic == "bhw":
        axes = {"images": {0: "batch", 2: "height", 3: "width"}, "output0": {0: "batch", 1: "anchors"}}
        if seg:
            axes["output1"] = {0: "batch", 2: "mask_height", 3: "mask_width"}
    meta = {"stride": str(int(max(model.stride))), "names": str(model.names)}
    return model, {"input_names": ["images"], "output_names": outs, "dynamic_axes": axes, "metadata": meta}, \
        f"Model('{cfg}', ch=3, nc=80).fuse().eval(); Detect.inplace={v.tag == 'inplace'}, export=True"


def _yolov7(v: Variant, torch: Any) -> tuple[Any, dict[str, Any], str]:
    from models.common import Conv  # the repository's own packages
    from models.experimental import End2End
    from models.yolo import Model
    from torch import nn
    from utils.activations import Hardswish, SiLU

    cfg = f"cfg/{v.arch}.yaml" if "/" in v.arch else f"cfg/deploy/{v.arch}.yaml"
    grid = v.tag in ("grid", "e2e", "dynbatch")
    model = Model(cfg, ch=3, nc=80).float()
    with torch.no_grad():
        model = model.fuse().eval()
    for m in model.modules():  # attempt_load's compatibility updates
        if type(m) in (nn.Hardswish, nn.LeakyReLU, nn.ReLU, nn.ReLU6, nn.SiLU):
            m.inplace = True
        elif type(m) is nn.Upsample:
            m.recompute_scale_factor = None
    for m in model.modules():  # export.py
        m._non_persistent_buffers_set = set()
        if isinstance(m, Conv):
            m.act = Hardswish() if isinstance(m.act, nn.Hardswish) else SiLU() if isinstance(m.act, nn.SiLU) else m.act
    model.model[-1].export = not grid
    model(torch.zeros(v.image))
    if v.tag == "e2e":
        model = End2End(model, 100, 0.45, 0.0, 640, torch.device("cpu"), 80)
    elif grid:
        model.model[-1].concat = True
    axes = {"images": {0: "batch"}, "output": {0: "batch"}} if v.dynamic else None
    outs = ["output"] if grid or v.exporter == "torchscript" else None
    return model, {"input_names": ["images"], "output_names": outs, "dynamic_axes": axes}, \
        f"Model('{cfg}', ch=3, nc=80).fuse().eval(); Detect.export={not grid}" + (
            "; End2End(model, 100, 0.45, 0.0, 640, cpu, 80)" if v.tag == "e2e" else "")


def _yolox(v: Variant, torch: Any) -> tuple[Any, dict[str, Any], str]:
    from torch import nn
    from yolox.exp import get_exp
    from yolox.models.network_blocks import SiLU
    from yolox.utils import replace_module

    exp = get_exp(f"exps/default/{v.arch}.py", None)
    model = replace_module(exp.get_model().eval(), nn.SiLU, SiLU)
    model.head.decode_in_inference = v.tag != "nodec"
    axes = {"images": {0: "batch"}, "output": {0: "batch"}} if v.dynamic else None
    return model, {"input_names": ["images"], "output_names": ["output"], "dynamic_axes": axes}, \
        f"get_exp('exps/default/{v.arch}.py').get_model().eval(); SiLU -> export SiLU; " \
        f"head.decode_in_inference={v.tag != 'nodec'}"


def _yolov6(v: Variant, torch: Any) -> tuple[Any, dict[str, Any], str]:
    import packaging.version
    from torch import nn

    # setuptools >= 81 dropped pkg_resources; yolov6.utils.general uses only its parse_version
    _stub_modules(["pkg_resources"], pkg_resources={"parse_version": packaging.version.parse})
    from yolov6.layers.common import ConvModule, RepVGGBlock, SiLU
    from yolov6.models.effidehead import Detect
    from yolov6.models.yolo import build_model
    from yolov6.utils.config import Config
    from yolov6.utils.torch_utils import fuse_model

    cfg = Config.fromfile(f"configs/{v.arch}.py")
    if not hasattr(cfg, "training_mode"):
        cfg.training_mode = "repvgg"  # as tools/train.py
    if "YOLOv6-lite" in cfg.model.type:  # as yolov6/core/engine.py
        from yolov6.models.yolo_lite import build_model as build_lite
        model = build_lite(cfg, 80, torch.device("cpu")).float()
    else:
        model = build_model(cfg, 80, torch.device("cpu")).float()
    with torch.no_grad():
        model = fuse_model(model).eval()
        for layer in model.modules():
            if isinstance(layer, RepVGGBlock):
                layer.switch_to_deploy()
            elif isinstance(layer, nn.Upsample) and not hasattr(layer, "recompute_scale_factor"):
                layer.recompute_scale_factor = None
    for m in model.modules():
        if isinstance(m, ConvModule) and isinstance(getattr(m, "act", None), nn.SiLU):
            m.act = SiLU()
        elif isinstance(m, Detect):
            m.inplace = False
    if v.exporter == "dynamo":
        model.export = True  # is_in_onnx_export() is False under torch.export: the export-mode output by hand
    outs = ["outputs"]
    if v.tag == "e2e":
        from yolov6.models.end2end import End2End
        model = End2End(model, max_obj=100, iou_thres=0.65, score_thres=0.0, device=torch.device("cpu"), ort=True)
        outs = ["num_dets", "det_boxes", "det_scores", "det_classes"]
    with torch.no_grad():
        model(torch.zeros(v.image))
    axes = {"images": {0: "batch"}, "outputs": {0: "batch"}} if v.dynamic else None
    return model, {"input_names": ["images"], "output_names": outs, "dynamic_axes": axes,
                   "training": torch.onnx.TrainingMode.EVAL, "do_constant_folding": True}, \
        f"build_model(Config.fromfile('configs/{v.arch}.py'), 80); fuse_model; RepVGGBlock.switch_to_deploy()" + (
            "; End2End(max_obj=100, iou_thres=0.65, score_thres=0.0, ort=True)" if v.tag == "e2e" else "")


def _nanodet(v: Variant, torch: Any) -> tuple[Any, dict[str, Any], str]:
    def ident(f: Any = None, *a: Any, **k: Any) -> Any:
        return f

    class Base:  # pytorch_lightning's Logger / LightningModule, as far as the model code touches them
        def __init__(self, *a: Any, **k: Any) -> None:
            pass

    _stub_modules(["pytorch_lightning", "pytorch_lightning.loggers", "pytorch_lightning.loggers.logger",
                   "pytorch_lightning.utilities", "lightning_fabric", "lightning_fabric.utilities",
                   "lightning_fabric.utilities.cloud_io", "pycocotools", "pycocotools.mask", "termcolor"],
                  pytorch_lightning={"LightningModule": Base}, pytorch_lightning__loggers={"Logger": Base},
                  pytorch_lightning__loggers__logger={"rank_zero_experiment": ident},
                  pytorch_lightning__utilities={"rank_zero_only": ident},
                  lightning_fabric__utilities__cloud_io={"get_filesystem": lambda *a, **k: None},
                  termcolor={"colored": lambda s, *a, **k: s})
    from nanodet.model.arch import build_model
    from nanodet.util import cfg, load_config

    load_config(cfg, f"config/{v.arch}.yml")
    cfg.defrost()
    cfg.model.arch.backbone.pretrain = False  # random weights: no ImageNet download
    torch.manual_seed(0)
    model = build_model(cfg.model)
    kw: dict[str, Any] = {"input_names": ["data"], "output_names": ["output"]}
    if v.exporter == "dynamo":
        model.eval()
    else:  # tools/export_onnx.py leaves the model in train() mode; the exporter's default TrainingMode.EVAL
        kw["keep_initializers_as_inputs"] = True
    return model, kw, f"build_model(cfg.model) of config/{v.arch}.yml, backbone.pretrain=False"


def _effdet(v: Variant, torch: Any) -> tuple[Any, dict[str, Any], str]:
    import effdet

    if v.tag == "predict_unscripted":
        # bench._batch_detection is @torch.jit.script, which the TorchScript exporter fails on (torchvision's
        # nms inside a scripted If); the same source without the decorator is traced instead
        import effdet.bench as bench
        source = Path(bench.__file__).read_text().replace("@torch.jit.script\n", "").replace("from .", "from effdet.")
        plain = types.ModuleType("effdet_bench_unscripted")
        exec(compile(source, bench.__file__, "exec"), plain.__dict__)  # effdet's own source, as installed
        bench._batch_detection = plain._batch_detection  # type: ignore[attr-defined]
    predict = v.tag.startswith("predict")
    model = effdet.create_model(v.arch, bench_task="predict" if predict else "", pretrained=False,
                                pretrained_backbone=False, num_classes=90).eval()
    with torch.no_grad():
        y = model(torch.zeros(v.image))
    outs = ["detections"] if predict else [f"class_out_{i}" for i in range(len(y[0]))] + [
        f"box_out_{i}" for i in range(len(y[1]))]
    return model, {"input_names": ["images"], "output_names": outs}, \
        f"effdet.create_model('{v.arch}', bench_task={'predict' if predict else ''!r}, pretrained=False, " \
        f"pretrained_backbone=False, num_classes=90).eval()" + ("; _batch_detection unscripted" if
                                                                 v.tag == "predict_unscripted" else "")


BUILDERS: dict[str, Callable[[Variant, Any], tuple[Any, dict[str, Any], str]]] = {
    Y5: _yolov5, Y7: _yolov7, YX: _yolox, Y6: _yolov6, ND: _nanodet, EFFDET: _effdet}


def child(name: str, tree: str, dst: str, record: str) -> int:
    v = next(x for x in VARIANTS if x.name == name)
    if tree:
        _enter(tree)
    import torch

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model, kw, call = BUILDERS[v.codebase](v, torch)
    meta = kw.pop("metadata", {})
    # the export scripts' example input: torch.randn for YOLOX, nanodet and effdet, torch.zeros for the others
    image = (torch.randn if v.codebase in (YX, ND, EFFDET) else torch.zeros)(v.image)
    if v.exporter == "dynamo":
        kw = {k: kw[k] for k in ("input_names", "output_names") if kw.get(k)} | {"external_data": False}
    kw = {k: val for k, val in kw.items() if val is not None}
    try:
        torch.onnx.export(model, (image,), dst, dynamo=v.exporter == "dynamo", opset_version=v.opset, **kw)
    except Exception as exc:  # the exporter's refusal is the entry's recorded result
        traceback.print_exc()
        print(one_line(exc))  # the parent's reason: the last line
        return 1
    if meta:
        import onnx
        m = onnx.load(dst)
        for k, val in meta.items():
            p = m.metadata_props.add()
            p.key, p.value = k, val
        onnx.save(m, dst)
    version = REPOS[v.codebase].commit if v.codebase in REPOS else _effdet_version()
    args = ", ".join(f"{k}={val!r}" for k, val in kw.items())
    Path(record).write_text(json.dumps({
        "codebase": v.codebase, "version": f"{version}; torch {torch.__version__}",
        "call": f"torch.manual_seed(0); {call}; torch.onnx.export(model, (example {v.image},), f, "
                f"dynamo={v.exporter == 'dynamo'}, opset_version={v.opset}, {args})",
        "notes": f"{v.what}; random weights" + (f"; metadata {sorted(meta)} added as the export script adds them"
                                                if meta else "")}))
    return 0


def _effdet_version() -> str:
    from importlib import metadata
    return f"effdet {metadata.version('effdet')}, timm {metadata.version('timm')}"


if __name__ == "__main__":
    if len(sys.argv) == 6 and sys.argv[1] == "--child":
        sys.exit(child(*sys.argv[2:]))
    sys.exit("corpus_repos: run through models/corpus.py (--codebase NAME); this file's own entry is --child")
