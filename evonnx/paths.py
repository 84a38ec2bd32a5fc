"""Where evonnx keeps per-user state (built runtime objects, fetched headers, the calibrated cost model)."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """The per-user cache: `$EVONNX_CACHE_DIR`, else `$XDG_CACHE_HOME/evonnx`, else `~/.cache/evonnx`."""
    explicit = os.environ.get("EVONNX_CACHE_DIR")
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "evonnx"
