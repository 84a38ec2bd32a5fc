"""Writing what `optimize` writes: its output paths refused before any work (`check_paths`), and the outputs staged
in hidden folders until they are renamed into place together (`Staging`)."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path

from evonnx.errors import UsageError


def same_file(a: Path, b: Path) -> bool:
    """Whether `a` and `b` name one file: the same path once resolved, or a hard or symbolic link to it."""
    try:
        return a.resolve() == b.resolve() or (a.exists() and b.exists() and os.path.samefile(a, b))
    except (OSError, RuntimeError):  # RuntimeError: a symbolic link loop (Python < 3.13)
        return False


DUMP_FILES = ("kernels.c", "kernels.cu", "plan.txt", "optimized.onnx")


def check_paths(src: Path, outputs: Mapping[str, Path], dump_dir: Path | None) -> None:
    """Refuse, before any work, outputs that cannot be written or would overwrite the input or one another.

    Whether the folders are writable is found when `Staging` creates its folders in them, also before any work.
    """
    seen: list[tuple[str, Path]] = []
    for what, p in outputs.items():
        if not p.parent.is_dir():
            raise UsageError(f"{p.parent}: {what} folder does not exist")
        if p.is_dir():
            raise UsageError(f"{p}: the {what} path is a folder; name a file")
        if same_file(p, src):
            raise UsageError(f"{p}: writing the {what} would overwrite the input {src}")
        for other, q in seen:
            if same_file(p, q):
                raise UsageError(f"{p}: the {what} and the {other} would be the same file")
        seen.append((what, p))
    if dump_dir is not None:
        if dump_dir.exists() and not dump_dir.is_dir():
            raise UsageError(f"{dump_dir}: the dump folder is a file")
        for name in DUMP_FILES:
            if any(same_file(dump_dir / name, p) for p in (src, *outputs.values())):
                raise UsageError(f"{dump_dir / name}: the dump would overwrite the input or an output")


class Staging:
    """Hidden folders (`.evonnx-*`), one in each folder an output goes to, holding the outputs until `commit`
    renames them into place. Leaving the `with` block removes them on every path: errors, bugs, Ctrl-C.

    Creating them, before any work, is also the check that those folders are writable. Renames within a folder
    are atomic; `commit` renames the model last, so a model on disk always comes with its library and report.
    """

    def __init__(self, targets: Mapping[str, Path]):
        self.targets = dict(targets)  # what -> path, the model first
        self._dirs: dict[Path, Path] = {}

    def __enter__(self) -> Staging:
        try:
            for what, t in self.targets.items():
                if t.parent.resolve() not in self._dirs:
                    try:
                        made = tempfile.mkdtemp(prefix=".evonnx-", dir=t.parent)
                    except OSError as e:
                        raise UsageError(f"{t.parent}: cannot write to the {what} folder ({e.strerror})") from e
                    self._dirs[t.parent.resolve()] = Path(made)
        except BaseException:
            self._remove()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self._remove()

    def path(self, target: Path) -> Path:
        """Where `target` is written until `commit`."""
        return self._dirs[target.parent.resolve()] / target.name

    def commit(self) -> None:
        for t in reversed(self.targets.values()):
            try:
                os.replace(self.path(t), t)
            except OSError as e:
                raise UsageError(f"{t}: cannot write it ({e.strerror})") from e

    def _remove(self) -> None:
        for d in self._dirs.values():
            shutil.rmtree(d, ignore_errors=True)
