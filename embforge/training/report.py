"""An HTML report of a training run: one self-contained page (inline SVG charts, no scripts, no network).

Read from the run folder: ``metrics.jsonl`` (the trainer's log: ``{"step", "loss", "lr", "task_loss"}`` every
``log_every`` steps, ``{"step", "eval": {...}}`` per evaluation, ``{"step", "task_weights", "task_mean_loss"}``
per dynamic-weight update), ``refresh.jsonl`` (the negative refresher: ``stall_seconds`` and ``mining_seconds``
per refresh) and ``train_summary.json``. A pipeline folder (``stage-<k>-<name>/`` sub-folders) gets one section
per stage.

Example:
    >>> import json, tempfile, pathlib
    >>> run = pathlib.Path(tempfile.mkdtemp())
    >>> records = [{"step": s, "loss": 1 / s, "lr": 1e-4} for s in (10, 20, 30)]
    >>> _ = (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\\n" for r in records))
    >>> write_report(run)["charts"]
    2
"""

from __future__ import annotations

import html
import json
import math
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf"]
Series = dict[str, list[tuple[float, float]]]
STYLE = """
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; margin: 24px auto; max-width: 1360px;
       color: #222; padding: 0 16px; }
h1 { font-size: 22px; margin-bottom: 4px; } h2 { font-size: 18px; margin-top: 28px; border-bottom: 1px solid #ddd; }
.muted { color: #666; } .grid { display: flex; flex-wrap: wrap; gap: 16px; }
figure { margin: 0; border: 1px solid #e3e3e3; border-radius: 6px; padding: 8px; background: #fff; }
figcaption { font-weight: 600; margin: 0 0 4px 4px; } figure > div { max-width: 380px; font-size: 12px; }
table { border-collapse: collapse; margin: 8px 0; } td, th { border: 1px solid #ddd; padding: 3px 10px; }
th { background: #f5f5f5; text-align: left; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
svg text { font: 11px system-ui, sans-serif; fill: #444; }
"""


def _shown(root: Path) -> str:
    """The run folder as a page shared with others may show it: relative to the current folder (no home folder or
    user name in it)."""
    try:
        return os.path.relpath(root.resolve(), Path.cwd())
    except ValueError:  # another drive (Windows): the folder's name only
        return root.resolve().name


def write_report(run_dir: str | os.PathLike, *, output: str | os.PathLike | None = None) -> dict[str, object]:
    """Write the report of ``run_dir`` (default ``run_dir/report.html``) -> ``{"report", "charts", ...}``.

    Raises:
        FileNotFoundError: ``run_dir`` holds no ``metrics.jsonl`` (nor pipeline stages that do).
    """
    root = Path(run_dir)
    stages = sorted(p for p in root.glob("stage-*") if (p / "metrics.jsonl").exists())
    runs = [root] if (root / "metrics.jsonl").exists() else stages
    if not runs:
        raise FileNotFoundError(
            f"{root}: no metrics.jsonl here (nor in stage-*/ folders); give the output folder of "
            "'embforge train' (its --output)"
        )
    body, charts = [], 0
    for run in runs:
        section, count = _section(run, title=None if run == root else run.name)
        body.append(section)
        charts += count
    title = f"embforge run {root.resolve().name}"
    page = (
        f"<!doctype html>\n<html lang='en'><head><meta charset='utf-8'><title>{_e(title)}</title>"
        f"<style>{STYLE}</style></head><body><h1>{_e(title)}</h1>"
        f"<p class='muted'>{_e(_shown(root))}</p>{''.join(body)}</body></html>\n"
    )
    path = Path(output) if output is not None else root / "report.html"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(page, encoding="utf-8")
    return {"report": str(path), "charts": charts, "sections": len(runs)}


def _section(run: Path, *, title: str | None) -> tuple[str, int]:
    records = read_jsonl(run / "metrics.jsonl")
    refreshes = [r for r in read_jsonl(run / "refresh.jsonl") if r.get("event") == "refresh"]
    parts: list[str] = [f"<h2>{_e(title)}</h2>"] if title else []
    parts.append(_summary(run, records))
    figures: list[str] = []
    train = [r for r in records if "loss" in r and "step" in r]
    if train:
        losses: Series = {"loss (all tasks)": [(r["step"], r["loss"]) for r in train]}
        for r in train:
            for name, value in (r.get("task_loss") or {}).items():
                losses.setdefault(f"loss: {name}", []).append((r["step"], value))
        figures.append(line_chart("Training loss", losses, x_label="step"))
        rates = [(r["step"], r["lr"]) for r in train if "lr" in r]
        if rates:
            figures.append(line_chart("Learning rate", {"lr": rates}, x_label="step"))
    figures += _evaluation_charts([r for r in records if isinstance(r.get("eval"), dict)])
    weights = [r for r in records if isinstance(r.get("task_weights"), dict)]
    if weights:
        series: Series = {}
        for r in weights:
            for name, value in r["task_weights"].items():
                series.setdefault(name, []).append((r["step"], value))
        figures.append(line_chart("Task weights (dynamic)", series, x_label="step", markers=True))
    if refreshes:
        figures.append(
            bar_chart(
                "Negative refreshes: seconds training stalled (mining seconds in the tooltip)",
                [
                    (r.get("applied_step", 0), r.get("stall_seconds", 0.0), r.get("mining_seconds"))
                    for r in refreshes
                ],
            )
        )
    if not figures:
        parts.append("<p>No training records in metrics.jsonl yet.</p>")
    parts.append(f"<div class='grid'>{''.join(figures)}</div>")
    if refreshes:
        parts.append(_refresh_table(refreshes))
    return "".join(parts), len(figures)


def _evaluation_charts(evals: list[dict[str, Any]]) -> list[str]:
    """One chart of the 0-100 metrics (a metric equal to one before it at every step is named in its legend, not
    drawn twice), one chart for each other metric; the evaluated row count ``n`` is left out."""
    series: dict[str, list[tuple[float, float]]] = {}
    for record in evals:
        for key, value in record["eval"].items():
            if key != "n" and _finite(value):
                series.setdefault(key, []).append((record["step"], value))
    percent: dict[str, list[str]] = {}  # drawn metric -> the metrics equal to it (e.g. spearman_dot)
    figures = []
    for key, points in series.items():
        twin = next((k for k in percent if _same(series[k], points)), None)
        if twin is not None:
            percent[twin].append(key)
        elif all(0 <= y <= 100 for _, y in points):
            percent[key] = [key]
        else:
            figures.append(line_chart(f"Evaluation: {key}", {key: points}, x_label="step", markers=True))
    if percent:
        drawn = {" = ".join(names): series[key] for key, names in percent.items()}
        figures.insert(0, line_chart("Evaluation (0-100)", drawn, x_label="step", markers=True))
    return figures


def _same(a: Sequence[tuple[float, float]], b: Sequence[tuple[float, float]]) -> bool:
    return len(a) == len(b) and all(
        x == u and abs(y - v) <= 1e-6 * max(1.0, abs(y)) for (x, y), (u, v) in zip(a, b)
    )


def _summary(run: Path, records: list[dict[str, Any]]) -> str:
    summary = read_json(run / "train_summary.json")
    rows: list[tuple[str, str]] = []
    if summary:
        rows.append(("steps", str(summary.get("steps"))))
        if summary.get("seconds") is not None:
            rows.append(("training time", _duration(float(summary["seconds"]))))
        if summary.get("pairs_per_second"):
            rows.append(("training rows / s", f"{summary['pairs_per_second']:.1f}"))
        best = summary.get("best") or {}
        if best:
            rows.append(("best evaluation", f"{_num(best.get('value'))} at step {best.get('step')}"))
        for key, value in (summary.get("final") or {}).items():
            rows.append((f"final {key}", _num(value)))
    else:
        steps = [r["step"] for r in records if "step" in r]
        rows.append(("status", f"running or interrupted (last logged step {max(steps) if steps else 0})"))
    resumes = [r for r in records if r.get("event") == "resume"]
    if resumes:
        rows.append(("resumed", ", ".join(f"from {r.get('from', '?')}" for r in resumes)))
    cells = "".join(f"<tr><th>{_e(k)}</th><td class='num'>{_e(v)}</td></tr>" for k, v in rows)
    return f"<table>{cells}</table>"


def _refresh_table(refreshes: Sequence[Mapping[str, Any]]) -> str:
    head = "<tr><th>started at step</th><th>applied at step</th><th>stall s</th><th>mining s</th><th>hard ratio</th></tr>"
    rows = "".join(
        "<tr>"
        + "".join(
            f"<td class='num'>{_e(_num(r.get(k)))}</td>"
            for k in ("started_step", "applied_step", "stall_seconds", "mining_seconds", "hard_ratio")
        )
        + "</tr>"
        for r in refreshes
    )
    total = sum(float(r.get("stall_seconds") or 0) for r in refreshes)
    return f"<p>Training stalled {total:.1f} s in all for {len(refreshes)} refreshes.</p><table>{head}{rows}</table>"


# ---------------------------------------------------------------------------------------------- SVG charts
WIDTH, HEIGHT, LEFT, RIGHT, TOP, BOTTOM = 380, 240, 62, 12, 12, 40


def line_chart(
    title: str,
    series: Mapping[str, Sequence[tuple[float, float]]],
    *,
    x_label: str = "",
    markers: bool = False,
) -> str:
    """A figure with one polyline per series over shared axes (tooltips on the points)."""
    points = [p for values in series.values() for p in values if _finite(p[1])]
    if not points:
        return ""
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    x_ticks, y_ticks = nice_ticks(min(xs), max(xs)), nice_ticks(min(ys), max(ys))
    sx, sy = _scale(x_ticks, LEFT, WIDTH - RIGHT), _scale(y_ticks, HEIGHT - BOTTOM, TOP)
    svg = _axes(x_ticks, y_ticks, sx, sy, x_label)
    for number, (name, values) in enumerate(series.items()):
        color = COLORS[number % len(COLORS)]
        kept = [(x, y) for x, y in values if _finite(y)]
        path = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in kept)
        svg.append(f"<polyline fill='none' stroke='{color}' stroke-width='1.8' points='{path}'/>")
        if markers or len(kept) <= 40:
            for x, y in kept:
                svg.append(
                    f"<circle cx='{sx(x):.1f}' cy='{sy(y):.1f}' r='2.6' fill='{color}'>"
                    f"<title>{_e(name)}: step {_num(x)} = {_num(y)}</title></circle>"
                )
    legend = "".join(
        f"<span style='color:{COLORS[i % len(COLORS)]}'>&#9632;</span> {_e(name)}&nbsp;&nbsp;"
        for i, name in enumerate(series)
    )
    return _figure(title, svg, legend if len(series) > 1 else "")


def bar_chart(title: str, bars: Sequence[tuple[float, float, object]]) -> str:
    """Bars of height ``value`` at ``x`` (``(x, value, tooltip extra)``), e.g. stall seconds per refresh step."""
    if not bars:
        return ""
    xs = [b[0] for b in bars]
    x_ticks = nice_ticks(min(xs) - 1, max(xs) + 1)
    y_ticks = nice_ticks(0.0, max(max(b[1] for b in bars), 1e-3))
    sx, sy = _scale(x_ticks, LEFT, WIDTH - RIGHT), _scale(y_ticks, HEIGHT - BOTTOM, TOP)
    svg = _axes(x_ticks, y_ticks, sx, sy, "step")
    width = max(3.0, min(24.0, (WIDTH - LEFT - RIGHT) / (2 * len(bars))))
    for x, value, extra in bars:
        top = sy(value)
        svg.append(
            f"<rect x='{sx(x) - width / 2:.1f}' y='{top:.1f}' width='{width:.1f}' "
            f"height='{max(0.5, sy(0) - top):.1f}' fill='{COLORS[3]}'><title>step {_num(x)}: stalled "
            f"{_num(value)} s, mining {_num(extra)} s</title></rect>"
        )
    return _figure(title, svg, "")


def nice_ticks(low: float, high: float, count: int = 5) -> list[float]:
    """Round tick values covering ``[low, high]`` (steps of 1, 2 or 5 x 10^k).

    >>> nice_ticks(0.13, 0.92)
    [0.0, 0.2, 0.4, 0.6, 0.8, 1.0]
    """
    if not (_finite(low) and _finite(high)):
        return [0.0, 1.0]
    if high <= low:
        pad = abs(low) * 0.05 or 1.0
        low, high = low - pad, high + pad
    raw = (high - low) / max(1, count)
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 5, 10) if m * magnitude >= raw)
    digits = max(0, 1 - math.floor(math.log10(step)))
    start = math.floor(low / step)
    ticks = [round(start * step, digits)]
    while ticks[-1] < high - 1e-9 * step:
        ticks.append(round((start + len(ticks)) * step, digits))
    return ticks


def _scale(ticks: Sequence[float], start: float, end: float) -> Callable[[float], float]:
    low, high = ticks[0], ticks[-1]
    return lambda v: start + (end - start) * (v - low) / ((high - low) or 1.0)


def _axes(
    x_ticks: Sequence[float],
    y_ticks: Sequence[float],
    sx: Callable[[float], float],
    sy: Callable[[float], float],
    x_label: str,
) -> list[str]:
    svg = []
    for y in y_ticks:
        svg.append(
            f"<line x1='{LEFT}' x2='{WIDTH - RIGHT}' y1='{sy(y):.1f}' y2='{sy(y):.1f}' stroke='#eee'/>"
        )
        svg.append(f"<text x='{LEFT - 6}' y='{sy(y) + 4:.1f}' text-anchor='end'>{_e(_tick(y))}</text>")
    for x in x_ticks:
        svg.append(
            f"<line x1='{sx(x):.1f}' x2='{sx(x):.1f}' y1='{TOP}' y2='{HEIGHT - BOTTOM}' stroke='#f3f3f3'/>"
        )
        svg.append(
            f"<text x='{sx(x):.1f}' y='{HEIGHT - BOTTOM + 15}' text-anchor='middle'>{_e(_tick(x))}</text>"
        )
    svg.append(
        f"<rect x='{LEFT}' y='{TOP}' width='{WIDTH - LEFT - RIGHT}' height='{HEIGHT - TOP - BOTTOM}' "
        "fill='none' stroke='#bbb'/>"
    )
    svg.append(
        f"<text x='{(LEFT + WIDTH - RIGHT) / 2}' y='{HEIGHT - 6}' text-anchor='middle'>{_e(x_label)}</text>"
    )
    return svg


def _figure(title: str, svg: list[str], legend: str) -> str:
    return (
        f"<figure><figcaption>{_e(title)}</figcaption><svg xmlns='http://www.w3.org/2000/svg' width='{WIDTH}' "
        f"height='{HEIGHT}' viewBox='0 0 {WIDTH} {HEIGHT}'>{''.join(svg)}</svg>"
        + (f"<div>{legend}</div>" if legend else "")
        + "</figure>"
    )


def _tick(value: float) -> str:
    if value == 0:
        return "0"
    if abs(value) >= 1e4 or abs(value) < 1e-3:
        return f"{value:.0e}"
    return f"{value:.4g}"


def _num(value: object) -> str:
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e9:
        return str(int(value))
    if isinstance(value, float):
        return f"{value:.4g}" if abs(value) < 1e-2 and value != 0 else f"{value:.2f}"
    return "–" if value is None else str(value)


def _duration(seconds: float) -> str:
    minutes, rest = divmod(round(seconds), 60)
    return f"{minutes} min {rest} s" if minutes else f"{seconds:.1f} s"


def _finite(value: object) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


def _e(text: object) -> str:
    return html.escape(str(text), quote=True)


def read_json(path: Path) -> dict[str, Any]:
    """A JSON object file's content, or ``{}`` when it is missing or not an object."""
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The records of a JSON-lines file; a torn last line (a run still writing) is skipped."""
    try:
        text = path.read_text()
    except OSError:
        return []
    records = []
    for line in text.splitlines():
        try:
            value = json.loads(line)
        except ValueError:
            continue
        if isinstance(value, dict):
            records.append(value)
    return records
