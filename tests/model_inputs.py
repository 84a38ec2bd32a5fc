"""Realistic inputs for the shipped models, built from the manifest's `input_hints` (see models/README.md)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

MODELS_DIR = Path(__file__).resolve().parents[1] / "models"
MANIFEST = json.loads((MODELS_DIR / "manifest.json").read_text())
ENTRIES: dict[str, dict[str, Any]] = {m["name"]: m for m in MANIFEST["models"]}


def _boxes(rng: np.random.Generator, shape: Sequence[int], hint: Mapping[str, Any]) -> np.ndarray:
    lead = tuple(shape[:-1])
    assert shape[-1] == 4
    x1 = rng.uniform(*hint.get("x1_range", (0.0, 1333.0)), size=lead)
    y1 = rng.uniform(*hint.get("y1_range", (0.0, 800.0)), size=lead)
    lo, hi = np.log(hint.get("wh_range", (4.0, 512.0)))
    w, h = np.exp(rng.uniform(lo, hi, size=lead)), np.exp(rng.uniform(lo, hi, size=lead))
    return np.stack([x1, y1, x1 + w, y1 + h], axis=-1)


def _grid_points(shape: Sequence[int]) -> np.ndarray:
    """Cell centres of the 80/40/20 grids at strides 8/16/32 (a 640x640 input), repeated to the wanted count."""
    parts = []
    for stride in (8, 16, 32):
        n = 640 // stride
        ys, xs = np.meshgrid(np.arange(n), np.arange(n), indexing="ij")
        parts.append(np.stack([(xs.ravel() + 0.5) * stride, (ys.ravel() + 0.5) * stride], axis=-1))
    pts = np.concatenate(parts)
    reps = -(-shape[0] // len(pts))
    return np.tile(pts, (reps, 1))[: shape[0]]


def make_inputs(entry: Mapping[str, Any], case: Mapping[str, Sequence[int]], seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    feeds = {}
    for inp in entry["inputs"]:
        name, dtype, shape = inp["name"], np.dtype(inp["dtype"]), list(case[inp["name"]])
        hint = entry["input_hints"].get(name, {"kind": "normal", "mean": 0.0, "std": 1.0})
        kind = hint["kind"]
        if kind == "boxes":
            arr = _boxes(rng, shape, hint)
        elif kind == "normal":
            arr = rng.normal(hint["mean"], hint["std"], size=shape)
        elif kind == "uniform":
            arr = rng.uniform(*hint["range"], size=shape)
        elif kind == "const":
            arr = np.array(hint["value"]).reshape(shape)
        elif kind == "grid_points":
            arr = _grid_points(shape)
        elif kind == "rois":
            arr = np.concatenate([rng.integers(0, 2, size=(shape[0], 1)), _boxes(rng, [shape[0], 4], {})], axis=1)
        elif kind == "shape_only":
            arr = rng.normal(size=shape)
        else:
            raise AssertionError(f"{entry['name']}: unknown input hint kind '{kind}'")
        feeds[name] = np.array(arr, dtype=dtype, order="C")  # ascontiguousarray would make a 0-d array 1-d
    return feeds
