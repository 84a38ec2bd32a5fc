"""`evonnx compare BASE.json NEW.json`: what changed between two `evonnx bench` reports, per model and thread
count, and whether anything regressed beyond the thresholds.

A model regresses when its check passed in BASE and not in NEW, when its fusion ratio drops by more than
`max_fusion_drop`, or when its speedup over onnxruntime falls by more than `max_slowdown` and by more than the
measured noise of both runs. A speedup moving within that noise is no change. A model in one report only is listed,
never a regression.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from evonnx.errors import EvonnxError
from evonnx.measure import NOISE_FLOOR


class ReportError(EvonnxError):
    """A report that is missing or is not an `evonnx bench` report: exit code 2."""


@dataclass
class Change:
    model: str
    threads: int | None
    verdict: str  # "regressed", "improved", "same", "only in base", "only in new"
    notes: list[str] = field(default_factory=list)
    base: Mapping[str, Any] | None = None
    new: Mapping[str, Any] | None = None


def load_report(path: Path) -> dict[str, Any]:
    """An `evonnx bench` JSON report; ReportError names what is wrong with it."""
    try:
        data = json.loads(Path(path).read_text())
    except OSError as e:
        raise ReportError(f"{path}: cannot read the report ({e.strerror or e})") from None
    except (ValueError, UnicodeDecodeError) as e:
        raise ReportError(f"{path}: not JSON ({str(e).splitlines()[0][:120]})") from None
    if not isinstance(data, dict) or not isinstance(data.get("models"), list):
        raise ReportError(f"{path}: not an evonnx bench report (no 'models' list)")
    for k, m in enumerate(data["models"]):
        if not isinstance(m, dict) or not isinstance(m.get("model"), str) or "status" not in m:
            raise ReportError(f"{path}: entry {k} of 'models' is not a bench result (needs 'model' and 'status')")
        for key in ("speedup", "noise", "fusion_ratio"):
            if m.get(key) is not None and not isinstance(m[key], (int, float)):
                raise ReportError(f"{path}: entry {k} ({m['model']}): '{key}' is not a number")
    return data


def _key(m: Mapping[str, Any]) -> tuple[str, int | None]:
    return m["model"], m.get("threads")


def _pct(x: float) -> str:
    return f"{x:+.1%}"


def compare_one(b: Mapping[str, Any], n: Mapping[str, Any], max_slowdown: float, max_fusion_drop: float) -> Change:
    change = Change(b["model"], b.get("threads"), "same", base=b, new=n)
    bad, good = [], []
    b_ok, n_ok = b.get("status") == "ok", n.get("status") == "ok"
    if b_ok and not n_ok:
        bad.append(f"{n.get('status')}: {n.get('message', '')}"[:200])
    elif n_ok and not b_ok:
        good.append(f"now passes (was {b.get('status')})")
    elif not n_ok:
        change.notes.append(f"still {n.get('status')}: {n.get('message', '')}"[:200])
    fb, fn = b.get("fusion_ratio"), n.get("fusion_ratio")
    if fb is not None and fn is not None and abs(fn - fb) > 1e-9:
        what = f"fusion {fb:.0%} -> {fn:.0%}"
        (bad if fb - fn > max_fusion_drop else good if fn > fb else change.notes).append(what)
    kb, kn = b.get("kernels"), n.get("kernels")
    if kb != kn and kb is not None and kn is not None:
        change.notes.append(f"kernels {kb} -> {kn}")
    sb, sn = b.get("speedup"), n.get("speedup")
    if sb and sn:
        rel = sn / sb - 1.0
        band = max((b.get("noise") or 0.0) + (n.get("noise") or 0.0), NOISE_FLOOR)
        what = f"speedup {sb:.3f}x -> {sn:.3f}x ({_pct(rel)}, noise +-{band:.1%})"
        if rel < -max(max_slowdown, band):
            bad.append(what)
        elif rel > band:
            good.append(what)
        elif rel < -band:
            change.notes.append(what + f": slower, within --max-slowdown {max_slowdown:.0%}")
        else:
            change.notes.append(what + ": within noise")
    change.notes = bad + good + change.notes
    change.verdict = "regressed" if bad else "improved" if good else "same"
    return change


def compare_reports(base: Mapping[str, Any], new: Mapping[str, Any], *, max_slowdown: float = 0.05,
                    max_fusion_drop: float = 0.02) -> list[Change]:
    """One Change per model and thread count of either report, in NEW's order, then those only in BASE."""
    old = {_key(m): m for m in base["models"]}
    seen = set()
    out = []
    for m in new["models"]:
        k = _key(m)
        seen.add(k)
        if k in old:
            out.append(compare_one(old[k], m, max_slowdown, max_fusion_drop))
        else:
            out.append(Change(m["model"], m.get("threads"), "only in new", new=m))
    out += [Change(m["model"], m.get("threads"), "only in base", base=m) for k, m in old.items() if k not in seen]
    return out


def regressed(changes: Sequence[Change]) -> bool:
    return any(c.verdict == "regressed" for c in changes)


def _threads(t: int | None) -> str:
    return "default" if t == 0 else str(t) if t is not None else "?"


def text(changes: Sequence[Change]) -> str:
    lines = [f"{c.model} [{_threads(c.threads)} threads]: {c.verdict}" + (f": {'; '.join(c.notes)}" if c.notes else "")
             for c in changes]
    counts: dict[str, int] = {}
    for c in changes:
        counts[c.verdict] = counts.get(c.verdict, 0) + 1
    lines.append(", ".join(f"{n} {v}" for v, n in counts.items()) or "no models in either report")
    return "\n".join(lines)


def markdown(changes: Sequence[Change]) -> str:
    icon = {"regressed": "❌ regressed", "improved": "✅ improved", "same": "same"}
    rows = ["### evonnx compare", "", "| model | threads | verdict | speedup | fusion | check | notes |",
            "|---|---:|---|---|---|---|---|"]
    for c in changes:
        b, n = c.base or {}, c.new or {}

        def pair(key: str, fmt: str, b: Mapping[str, Any] = b, n: Mapping[str, Any] = n) -> str:
            vals = [format(d[key], fmt) if d.get(key) is not None else "–" for d in (b, n)]
            return " → ".join(vals)

        checks = " → ".join(d.get("status", "–") for d in (b, n))
        notes = "; ".join(c.notes).replace("|", "\\|")
        model = c.model.replace("|", "\\|")
        rows.append(f"| {model} | {_threads(c.threads)} | {icon.get(c.verdict, c.verdict)} | "
                    f"{pair('speedup', '.2f')} | {pair('fusion_ratio', '.0%')} | {checks} | {notes} |")
    return "\n".join(rows) + "\n"
