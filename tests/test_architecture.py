"""The house rules of issue 13 that no other test states: one-way imports between the layers, no function-local
imports of evonnx modules outside the command line's lazy loading, no module over 600 lines, no symbolic links."""

from __future__ import annotations

import ast
import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PACKAGES = {"evonnx": REPO / "evonnx", "evonnx.passes": REPO / "passes", "evonnx.kernels": REPO / "kernels"}
MAX_LINES = 600

# Each layer may import only from itself and the layers before it. passes and kernels are siblings: neither
# imports the other (both work on the IR; the driver joins them).
FOUNDATION = {"errors", "paths", "toolchain", "isolate", "model", "references", "outputs"}
IR = {"index", "expr", "view", "records"}
DRIVER = {"api", "verify", "explain", "report", "inputs", "sizes", "measure", "bench", "compare", "excuses", "guard",
          "blame"}
CLI = {"cli", "__main__", ""}  # "" is the package itself: its lazy `optimize` attribute is the API's facade
LAYER = {**{m: 0 for m in FOUNDATION}, **{m: 1 for m in IR}, "passes": 2, "kernels": 2,
         **{m: 3 for m in DRIVER}, **{m: 4 for m in CLI}}
# imports inside functions: the command line loads a subcommand's modules when it runs, so `evonnx --help` and
# Ctrl-C handling come before onnx and numpy are imported
LAZY_ALLOWED = {"evonnx.cli", "evonnx"}


def _modules() -> dict[str, Path]:
    out = {}
    for pkg, folder in PACKAGES.items():
        for f in sorted(folder.glob("*.py")):
            out[pkg if f.stem == "__init__" else f"{pkg}.{f.stem}"] = f
    return out


def _unit(module: str) -> str:
    """The layer key of an evonnx module: "passes"/"kernels" for their packages, else the top-level name."""
    parts = module.split(".")[1:]
    if parts and parts[0] in ("passes", "kernels"):
        return parts[0]
    return parts[0] if parts else ""


def _imports(path: Path) -> list[tuple[str, bool]]:
    """(imported evonnx module, inside a function) for every import of `path`; `from evonnx import x` imports
    evonnx.x (a submodule) where x is one."""
    tree = ast.parse(path.read_text())
    local: set[int] = set()
    for fn in ast.walk(tree):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            local.update(id(n) for n in ast.walk(fn) if isinstance(n, (ast.Import, ast.ImportFrom)))
    known = _modules()
    out = []
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            subs = [f"{node.module}.{a.name}" for a in node.names if f"{node.module}.{a.name}" in known]
            names = subs or [node.module]
        out.extend((n, id(node) in local) for n in names if n == "evonnx" or n.startswith("evonnx."))
    return out


def test_every_module_has_a_layer() -> None:
    missing = sorted(m for m in _modules() if _unit(m) not in LAYER)
    assert not missing, f"give these modules a layer in tests/test_architecture.py: {missing}"


@pytest.mark.parametrize("module", sorted(_modules()))
def test_imports_go_one_way(module: str) -> None:
    mine = _unit(module)
    upward = []
    for imported, inside in _imports(_modules()[module]):
        theirs = _unit(imported)
        if inside and module not in LAZY_ALLOWED:
            upward.append(f"{imported} (imported inside a function)")
        elif theirs == mine or theirs not in LAYER or mine not in LAYER:
            continue
        elif LAYER[theirs] > LAYER[mine] or (LAYER[theirs] == LAYER[mine] == 2):
            upward.append(f"{imported} (layer {LAYER[theirs]} from layer {LAYER[mine]})")
    assert not upward, f"{module} imports {upward}"


def test_no_module_is_over_600_lines() -> None:
    long = {m: n for m, p in _modules().items() if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, f"modules over {MAX_LINES} lines: {long}"


def test_no_symbolic_links() -> None:
    links = []
    for root, dirs, files in os.walk(REPO):
        dirs[:] = [d for d in dirs if not d.startswith(".") and d not in ("node_modules", "__pycache__", "build")]
        links += [str(Path(root, n).relative_to(REPO)) for n in dirs + files if Path(root, n).is_symlink()]
    assert not links, f"symbolic links: {links}"


def test_the_rules_are_not_vacuous(tmp_path: Path) -> None:
    # an IR module reading the driver, and a driver module importing inside a function, are both caught
    bad = tmp_path / "bad.py"
    bad.write_text("from evonnx.verify import check_models\n\ndef f():\n    from evonnx.api import optimize\n")
    found = _imports(bad)
    assert ("evonnx.verify", False) in found and ("evonnx.api", True) in found
    assert LAYER[_unit("evonnx.verify")] > LAYER[_unit("evonnx.index")]
