"""Realistic inputs for the shipped models, built from `models/manifest.json` `input_hints`.

Plain numpy, no evonnx import, so tests and benchmarks can share it:

    from benchmarks.inputs import load_manifest, largest_case, make_inputs
    entry = load_manifest()["delta2bbox"]
    shapes = entry["checked_cases"][largest_case(entry)]
    feeds = make_inputs(entry, shapes, seed=0)

Hint kinds (models/README.md): `boxes` (x1y1x2y2, x1/y1 uniform, w/h log-uniform in `wh_range`), `normal`,
`uniform`, `const`, `grid_points` (cell centres of stride-8/16/32 grids), `rois` (batch index 0, then a box),
`shape_only` (values unused; standard normal like the export script). An unknown kind raises ValueError.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parent.parent
MANIFEST = REPO / "models" / "manifest.json"

# Defaults of the export script's generators (models/export.py) for hints that carry no ranges.
_ROI_BOX = {"x1_range": [0.0, 1333.0], "y1_range": [0.0, 800.0], "wh_range": [4.0, 512.0]}
_GRID_STRIDES = (8, 16, 32)


def load_manifest(path: str | Path = MANIFEST) -> dict[str, dict[str, Any]]:
    """Manifest entries by model name, in the manifest's order."""
    data = json.loads(Path(path).read_text())
    return {e["name"]: e for e in data["models"]}


def case_elements(case: Mapping[str, Sequence[int]]) -> int:
    return sum(math.prod(s) for s in case.values())


def largest_case(entry: Mapping[str, Any]) -> int:
    """Index of the checked case with the most input elements (the first one on ties)."""
    cases = entry["checked_cases"]
    return max(range(len(cases)), key=lambda i: (case_elements(cases[i]), -i))


def _boxes(rng: np.random.Generator, shape: Sequence[int], hint: Mapping[str, Any]) -> np.ndarray:
    if not shape or shape[-1] != 4:
        raise ValueError(f"boxes need a last axis of 4, got shape {list(shape)}")
    lead = tuple(shape[:-1])
    x1 = rng.uniform(*hint["x1_range"], size=lead)
    y1 = rng.uniform(*hint["y1_range"], size=lead)
    lo, hi = (math.log(v) for v in hint["wh_range"])
    w = np.exp(rng.uniform(lo, hi, size=lead))
    h = np.exp(rng.uniform(lo, hi, size=lead))
    return np.stack([x1, y1, x1 + w, y1 + h], axis=-1)


def grid_points(n: int) -> np.ndarray:
    """(n, 2) cell centres (x, y) of the stride-8/16/32 grids of a square image whose point count is n."""
    for side in range(32, 8193, 32):
        sizes = [side // s for s in _GRID_STRIDES]
        if sum(k * k for k in sizes) == n:
            pts = []
            for k, s in zip(sizes, _GRID_STRIDES, strict=True):
                ys, xs = np.meshgrid(np.arange(k), np.arange(k), indexing="ij")
                pts.append(np.stack([(xs.reshape(-1) + 0.5) * s, (ys.reshape(-1) + 0.5) * s], axis=-1))
            return np.concatenate(pts)
    raise ValueError(f"grid_points: {n} is not the point count of a square image at strides {_GRID_STRIDES}")


def make_input(rng: np.random.Generator, hint: Mapping[str, Any], shape: Sequence[int], dtype: str) -> np.ndarray:
    """One input array of `shape` and `dtype` following `hint`."""
    kind = hint["kind"]
    shape = tuple(int(d) for d in shape)
    if kind == "boxes":
        arr = _boxes(rng, shape, hint)
    elif kind == "rois":
        if len(shape) != 2 or shape[1] != 5:
            raise ValueError(f"rois need shape (N, 5), got {list(shape)}")
        arr = np.concatenate([np.zeros((shape[0], 1)), _boxes(rng, (shape[0], 4), {**_ROI_BOX, **hint})], axis=1)
    elif kind == "normal":
        arr = rng.normal(hint.get("mean", 0.0), hint.get("std", 1.0), size=shape)
    elif kind == "uniform":
        arr = rng.uniform(*hint["range"], size=shape)
    elif kind == "const":
        value = np.asarray(hint["value"])
        if value.size != math.prod(shape):
            raise ValueError(f"const value of {value.size} elements for shape {list(shape)}")
        arr = value.reshape(shape)
    elif kind == "grid_points":
        if len(shape) != 2 or shape[1] != 2:
            raise ValueError(f"grid_points need shape (N, 2), got {list(shape)}")
        arr = grid_points(shape[0])
    elif kind == "shape_only":
        arr = rng.standard_normal(shape)
    else:
        raise ValueError(f"unknown input hint kind {kind!r}")
    out = np.array(arr, dtype=np.dtype(dtype), order="C")  # ascontiguousarray would make a 0-d array 1-d
    if out.shape != shape:
        raise ValueError(f"{kind}: built shape {list(out.shape)}, wanted {list(shape)}")
    return out


def make_inputs(entry: Mapping[str, Any], shapes: Mapping[str, Sequence[int]], seed: int = 0) -> dict[str, np.ndarray]:
    """Feeds for every input of a manifest entry at `shapes` (e.g. one of its `checked_cases`).

    Deterministic in `seed`; each input draws from its own stream, so adding an input changes no other one.
    """
    feeds: dict[str, np.ndarray] = {}
    for k, spec in enumerate(entry["inputs"]):
        name = spec["name"]
        if name not in shapes:
            raise ValueError(f"{entry['name']}: no shape given for input {name!r}")
        rng = np.random.default_rng([seed, k])
        hint = entry["input_hints"].get(name, {"kind": "normal"})
        feeds[name] = make_input(rng, hint, shapes[name], spec["dtype"])
    return feeds


def half_feeds(feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The inputs of a float16 version of a manifest model (models/fp16.py): float32 ones cast to float16."""
    return {k: v.astype(np.float16) if v.dtype == np.float32 else v for k, v in feeds.items()}
