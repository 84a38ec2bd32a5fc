"""The `evonnx` command line (click): parses arguments and calls the library; no logic of its own."""

from __future__ import annotations

import functools
import logging
import os
import shutil
import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from evonnx.errors import EvonnxError

log = logging.getLogger(__name__)

F = TypeVar("F", bound=Callable[..., Any])

EXIT_ERROR = 1  # an EvonnxError: bad input, a failed check, a failed build, an unwritable output
EXIT_INTERNAL = 70  # a bug in evonnx (sysexits' EX_SOFTWARE)


def _stop(signum: int, frame: object) -> None:
    """SIGINT/SIGTERM: raise KeyboardInterrupt once, so every `finally` removes its temporary files; a second
    signal would interrupt that cleanup, so both are ignored from then on."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise KeyboardInterrupt(signum)


def _one_line_failures(command: F) -> F:
    """Every failure of `command` is one line on stderr and a non-zero exit: `evonnx: error: ...` (exit 1) for
    an EvonnxError, `evonnx: error: interrupted` (exit 128 + signal) for Ctrl-C or SIGTERM, and
    `evonnx: internal error: ...` (exit 70) for anything else, a bug, whose traceback -vv shows."""

    @functools.wraps(command)
    def run(*args: Any, **kwargs: Any) -> Any:
        # onnxruntime's telemetry writes a `.ses` file into the temp folder when it is imported (imports are lazy).
        os.environ.setdefault("ORT_DISABLE_TELEMETRY", "1")
        main_thread = threading.current_thread() is threading.main_thread()
        # a signal the parent ignores (a background job's SIGINT, nohup) stays ignored
        saved = {s: signal.signal(s, _stop) for s in (signal.SIGINT, signal.SIGTERM)
                 if main_thread and signal.getsignal(s) is not signal.SIG_IGN}
        try:
            try:
                return command(*args, **kwargs)
            finally:  # a status line goes before whatever follows
                if _StatusLine.current is not None:
                    _StatusLine.current.clear()
        except EvonnxError as e:
            first, _, rest = str(e).partition("\n")
            if rest:
                log.info("%s", rest)
            hint = " (-v shows more)" if rest and not log.isEnabledFor(logging.INFO) else ""
            click.echo(f"evonnx: error: {first}{hint}", err=True)
            sys.exit(EXIT_ERROR)
        except KeyboardInterrupt as e:
            signum = e.args[0] if e.args and isinstance(e.args[0], int) else signal.SIGINT
            click.echo("evonnx: error: interrupted", err=True)
            sys.exit(128 + signum)
        except (click.ClickException, click.exceptions.Exit, click.Abort):
            raise  # usage errors: click reports them itself
        except Exception as e:  # noqa: BLE001 - a bug: one line, the traceback at -vv
            log.debug("traceback of the internal error:", exc_info=True)
            first = (str(e).strip().splitlines() or [""])[0]
            click.echo(f"evonnx: internal error: {type(e).__name__}: {first} (a bug in evonnx; rerun with -vv "
                       f"for the traceback)", err=True)
            sys.exit(EXIT_INTERNAL)
        finally:
            for s, handler in saved.items():
                signal.signal(s, handler)

    return run  # type: ignore[return-value]


def _pairs(values: tuple[str, ...], what: str) -> dict[str, str]:
    out = {}
    for v in values:
        name, sep, rest = v.partition("=")
        if not sep or not name or not rest:
            raise click.BadParameter(f"expected NAME=VALUE, got '{v}'", param_hint=what)
        out[name] = rest
    return out


def _ints(text: str, what: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",")]
    except ValueError as e:
        raise click.BadParameter(f"'{text}' is not a comma-separated list of integers", param_hint=what) from e


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("-v", "--verbose", count=True, help="More logging (-v info, -vv debug).")
@click.version_option(package_name="evonnx")
def main(verbose: int) -> None:
    """evonnx: view-aware fusion of ONNX post-processing into generated onnxruntime kernels."""
    logging.basicConfig(level=logging.WARNING - 10 * min(verbose, 2), format="%(levelname)s %(name)s: %(message)s")
    if verbose < 2:  # onnx-graphsurgeon's own "[W] ..." lines (a type without a numpy one, ...) are not the user's
        from onnx_graphsurgeon.logger import G_LOGGER

        G_LOGGER.severity = G_LOGGER.ERROR


@main.command()
@click.argument("model", type=click.Path(path_type=Path))
@click.option("-o", "--output", type=click.Path(path_type=Path), help="Optimized model (default MODEL.opt.onnx).")
@click.option("--no-check", is_flag=True, help="Skip the comparison against onnxruntime (not recommended).")
@click.option("--no-guard", is_flag=True,
              help="Skip the never-slower guard (timing against onnxruntime on this machine; on by default).")
@click.option("--dim", "dims", multiple=True, metavar="SYM=N", help="Size of a symbolic input dim for the check.")
@click.option("--input-shape", "input_shapes", multiple=True, metavar="NAME=D0,D1,..",
              help="Shape of an input for the check.")
@click.option("--inputs", "inputs", type=click.Path(path_type=Path), metavar="FILE.npz|DIR",
              help="Input sets the check runs too: an .npz by input name, or a folder of .npz files or of ONNX "
                   "test data (input_N.pb).")
@click.option("--dump-dir", type=click.Path(path_type=Path), help="Write the plan, kernels and graph here.")
@click.option("--ort-headers", type=click.Path(path_type=Path), help="Folder with onnxruntime's C API headers.")
@click.option("--cflag", "cflags", multiple=True, help="Extra C compiler flag for the kernels (e.g. -march=native).")
@click.option("--planner", type=click.Choice(["search", "greedy"]), default="search", show_default=True,
              help="Fusion planner: cost-model search or TVM-style greedy.")
@click.option("--report", type=click.Path(path_type=Path), help="Write a JSON report (see README) here.")
@click.option("--target", type=click.Choice(["cpu", "cuda", "both"]), default=None,
              help="Kernels for onnxruntime's CPU EP, CUDA EP (needs nvcc or NVRTC), or both. "
                   "[default: both when a GPU is visible, else cpu]")
@click.option("--cuda-arch", "cuda_archs", default="sm_80,sm_90", show_default=True,
              help="CUDA architectures for the CUBINs (PTX for the newest is added).")
@click.option("--cuda-compiler", type=click.Choice(["auto", "nvcc", "nvrtc"]), default="auto", show_default=True,
              help="Compiler of the CUDA kernels: nvcc, NVRTC (pip install 'evonnx[cuda]'; no CUDA toolkit), or "
                   "nvcc where found, else NVRTC.")
@click.option("-q", "--quiet", is_flag=True, help="Print nothing but errors.")
@click.option("-v", "--verbose", count=True, help="More logging (-v info, -vv debug), as `evonnx -v`.")
@_one_line_failures
def optimize(model: Path, output: Path | None, no_check: bool, no_guard: bool, dims: tuple[str, ...],
             input_shapes: tuple[str, ...],
             inputs: Path | None, dump_dir: Path | None, ort_headers: Path | None, cflags: tuple[str, ...],
             planner: str, report: Path | None, target: str | None, cuda_archs: str, cuda_compiler: str,
             quiet: bool, verbose: int) -> None:
    """Fuse MODEL's view and elementwise chains; write the model and its kernel library (*.evonnx.so)."""
    from evonnx.api import optimize as run

    if verbose:
        logging.getLogger().setLevel(min(logging.getLogger().level, logging.WARNING - 10 * min(verbose, 2)))
    if quiet:
        logging.getLogger().setLevel(logging.ERROR)
    status = _StatusLine() if _on_terminal() and not quiet else None

    sizes = {k: _ints(v, "--dim")[0] for k, v in _pairs(dims, "--dim").items()}
    shapes = {k: _ints(v, "--input-shape") for k, v in _pairs(input_shapes, "--input-shape").items()}
    if target is None:
        from evonnx.kernels.build import cuda_device_count

        target = "both" if cuda_device_count() > 0 else "cpu"
    result = run(model, output, check=not no_check, dump_dir=dump_dir, cflags=cflags, ort_headers=ort_headers,
                 sizes=sizes or None, shapes=shapes or None, inputs=inputs, planner=planner, report=report,
                 target=target, guard=False if no_guard else None,
                 cuda_archs=[a for a in cuda_archs.split(",") if a], cuda_compiler=cuda_compiler,
                 progress=status.show if status is not None else None)
    if status is not None:
        status.clear()
    if not quiet:
        click.echo(result.summary())


def _on_terminal() -> bool:
    """Whether stderr is a terminal: progress is drawn there, never into a log."""
    return sys.stderr.isatty()


class _StatusLine:
    """On a terminal, the stage `optimize` is in as one line on stderr, rewritten in place, with the seconds so
    far; cleared before anything else is printed (a failure's one line included: `_one_line_failures`)."""

    def __init__(self) -> None:
        import time

        self._clock = time.monotonic
        self._start = self._clock()
        self._shown = False
        _StatusLine.current = self

    current: _StatusLine | None = None

    def show(self, stage: str) -> None:
        width = shutil.get_terminal_size((80, 20)).columns - 1
        text = f"evonnx: {stage}... ({self._clock() - self._start:.0f} s)"
        click.echo("\r\x1b[K" + text[:width], err=True, nl=False)
        self._shown = True

    def clear(self) -> None:
        if self._shown:
            click.echo("\r\x1b[K", err=True, nl=False)
            self._shown = False
        _StatusLine.current = None


@main.command()
@click.argument("model", type=click.Path(path_type=Path))
@click.option("-v", "--verbose", is_flag=True, help="Also a verdict per node, the dependences and each kernel's reads.")
@click.option("--json", "as_json", is_flag=True, help="Everything -v says, as one JSON object.")
@_one_line_failures
def explain(model: Path, verbose: bool, as_json: bool) -> None:
    """Say what optimize would fuse in MODEL: each kernel and what it absorbs, then what stays with onnxruntime,
    grouped by reason."""
    from evonnx.explain import explain as run

    result = run(model)
    click.echo(result.json() if as_json else result.text(verbose))


def _fraction(text: str, what: str) -> float:
    """`5%` or `0.05`."""
    try:
        return float(text[:-1]) / 100 if text.endswith("%") else float(text)
    except ValueError as e:
        raise click.BadParameter(f"'{text}' is not a fraction (0.05) or a percentage (5%)", param_hint=what) from e


@main.command()
@click.argument("models", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--threads", default="1", show_default=True, metavar="N,N..",
              help="Intra-op thread counts to time at (0: onnxruntime's default).")
@click.option("--provider", type=click.Choice(["cpu"]), default="cpu", show_default=True,
              help="onnxruntime execution provider to time on.")
@click.option("--seconds", type=float, default=1.0, show_default=True,
              help="Timed runs per model, side and thread count, in seconds.")
@click.option("--json", "json_out", type=click.Path(path_type=Path), help="Write the report as JSON here.")
@click.option("--markdown", "md_out", type=click.Path(path_type=Path), help="Write a markdown table here.")
@click.option("--junit", "junit_out", type=click.Path(path_type=Path), help="Write JUnit XML here.")
@click.option("--out-dir", type=click.Path(path_type=Path),
              help="Keep the optimized models and libraries here (default: a temporary folder).")
@click.option("--no-guard", is_flag=True, help="Optimize without the never-slower guard.")
@click.option("--no-reuse", is_flag=True, help="Optimize even where X.opt.onnx lies next to X.onnx.")
@click.option("--dim", "dims", multiple=True, metavar="SYM=N", help="Size of a symbolic input dim.")
@click.option("--input-shape", "input_shapes", multiple=True, metavar="NAME=D0,D1,..", help="Shape of an input.")
@_one_line_failures
def bench(models: tuple[Path, ...], threads: str, provider: str, seconds: float, json_out: Path | None,
          md_out: Path | None, junit_out: Path | None, out_dir: Path | None, no_guard: bool, no_reuse: bool,
          dims: tuple[str, ...], input_shapes: tuple[str, ...]) -> None:
    """Optimize (or take X.opt.onnx next to X.onnx), check and time each model against onnxruntime; MODELS are
    .onnx files or folders of them. Exit 1 when a check fails or a model cannot be optimized or timed."""
    from evonnx import bench as b

    counts = _ints(threads, "--threads")
    if any(t < 0 for t in counts) or seconds <= 0:
        raise click.BadParameter("thread counts must be >= 0 and --seconds > 0")
    opts = b.Options(threads=counts, seconds=seconds, guard=not no_guard, out_dir=out_dir, reuse=not no_reuse,
                     sizes={k: _ints(v, "--dim")[0] for k, v in _pairs(dims, "--dim").items()} or None,
                     shapes={k: _ints(v, "--input-shape") for k, v in _pairs(input_shapes, "--input-shape").items()}
                     or None)
    for target in (json_out, md_out, junit_out):
        if target is not None and target.is_dir():
            raise click.BadParameter(f"{target} is a folder")
    tty = _on_terminal()

    def progress(k: int, n: int, model: str, entries: list[b.Entry] | None) -> None:
        if entries is None:
            bar = f"[{'#' * (20 * k // n):.<20}] " if tty else ""
            click.echo(f"{bar}{k + 1}/{n} {model}: optimizing, checking and timing...", err=True, nl=not tty)
            return
        if tty:
            click.echo("\r\x1b[K", err=True, nl=False)
        for e in entries:
            click.echo(b.line(e))

    report = b.bench(list(models), opts, provider, progress)
    outputs = {json_out: report.json(), md_out: b.markdown(report), junit_out: b.junit(report)}
    for target, body in outputs.items():
        if target is not None:
            _write_text(target, body)
    bad = [e for e in report.models if e.status != "ok"]
    if bad:
        click.echo(f"evonnx: error: {len(bad)} of {len(report.models)} results failed (first: {bad[0].model}: "
                   f"{bad[0].message[:160]})", err=True)
        sys.exit(EXIT_ERROR)


def _write_text(target: Path, body: str) -> None:
    """`body` into `target` through a temporary file beside it, renamed into place."""
    import tempfile

    from evonnx.errors import UsageError

    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent if str(target.parent) else ".")
    except OSError as e:
        raise UsageError(f"cannot write {target}: {e.strerror or e}") from None
    try:
        with os.fdopen(fd, "w") as f:
            f.write(body)
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@main.command()
@click.argument("base", type=click.Path(path_type=Path))
@click.argument("new", type=click.Path(path_type=Path))
@click.option("--max-slowdown", default="5%", show_default=True,
              help="A speedup that falls by more than this (and more than the noise) is a regression.")
@click.option("--max-fusion-drop", default="0.02", show_default=True,
              help="A fusion ratio that falls by more than this is a regression.")
@click.option("--markdown", "md_out", type=click.Path(path_type=Path), help="Write a markdown table here.")
@_one_line_failures
def compare(base: Path, new: Path, max_slowdown: str, max_fusion_drop: str, md_out: Path | None) -> None:
    """What changed between two `evonnx bench` reports. Exit 0: nothing regressed beyond the thresholds; 1: something
    did; 2: bad input (a missing or malformed report)."""
    from evonnx import compare as c

    try:
        slow, drop = _fraction(max_slowdown, "--max-slowdown"), _fraction(max_fusion_drop, "--max-fusion-drop")
        changes = c.compare_reports(c.load_report(base), c.load_report(new), max_slowdown=slow,
                                    max_fusion_drop=drop)
        if md_out is not None:
            _write_text(md_out, c.markdown(changes))
    except (EvonnxError, click.BadParameter) as e:
        message = e.format_message() if isinstance(e, click.BadParameter) else str(e).splitlines()[0]
        click.echo(f"evonnx: error: {message}", err=True)
        sys.exit(2)
    click.echo(c.text(changes))
    sys.exit(1 if c.regressed(changes) else 0)


@main.command("build-runtime")
@click.option("--ort-headers", type=click.Path(path_type=Path), help="Folder with onnxruntime's C API headers.")
@_one_line_failures
def build_runtime(ort_headers: Path | None) -> None:
    """Build the onnxruntime-facing part of the kernel library once for this install (otherwise done lazily)."""
    from evonnx.kernels.build import runtime_object

    click.echo(runtime_object(ort_headers))


if __name__ == "__main__":
    main()
