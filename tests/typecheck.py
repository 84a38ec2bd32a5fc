"""Strict mypy over the installed package as it is laid out in the checkout: evonnx/ is `evonnx`, passes/ is
`evonnx.passes` and kernels/ is `evonnx.kernels` (pyproject's package-dir). mypy's own search cannot follow that
mapping, so the sources are handed to it with their module names."""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path

from mypy import build
from mypy.config_parser import parse_config_file
from mypy.errors import CompileError
from mypy.modulefinder import BuildSource
from mypy.options import Options

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = {pkg: ROOT / folder for pkg, folder in
            tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"].items()}


def sources() -> list[BuildSource]:
    out = []
    for pkg, folder in PACKAGES.items():
        for f in sorted(folder.glob("*.py")):
            mod = pkg if f.stem == "__init__" else f"{pkg}.{f.stem}"
            out.append(BuildSource(str(f), mod))
    return out


def main() -> int:
    options = Options()
    parse_config_file(options, lambda: None, str(ROOT / "pyproject.toml"), sys.stdout, sys.stderr)
    srcs = sources()
    try:
        res = build.build(srcs, options)
    except CompileError as e:
        print("\n".join(e.messages))
        return 1
    for line in res.errors:
        print(line)
    if res.errors:
        print(f"Found {sum(': error:' in e for e in res.errors)} errors in {len(srcs)} source files")
        return 1
    print(f"Success: no issues found in {len(srcs)} source files")
    return 0


if __name__ == "__main__":
    sys.exit(main())
