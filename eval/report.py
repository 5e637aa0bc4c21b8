"""Shared output helpers for the eval scripts: JSON, Markdown tables, PNG line plots.

Nothing here imports torch or SGLang.  matplotlib is optional: it is present on the
GPU host, maybe not elsewhere; :func:`plot_panels` returns ``False`` (and writes
nothing) when it cannot be imported, so callers never need to guard it themselves.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional, Sequence

MISSING = "—"


# ---------------------------------------------------------------------------------
# numbers and JSON
# ---------------------------------------------------------------------------------
def is_number(x: Any) -> bool:
    """A finite int/float (bools excluded)."""
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def sanitize(obj: Any) -> Any:
    """Copy of ``obj`` that strict JSON accepts: NaN/inf become None, tuples become
    lists, dict keys become strings, numpy/torch scalars become Python numbers."""
    if isinstance(obj, dict):
        return {str(k): sanitize(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [sanitize(v) for v in obj]
    if isinstance(obj, bool) or obj is None or isinstance(obj, str):
        return obj
    if isinstance(obj, int):
        return obj
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    item = getattr(obj, "item", None)  # numpy / torch scalars
    if callable(item):
        try:
            return sanitize(item())
        except Exception:
            pass
    return str(obj)


def write_json(path, obj: Any, indent: int = 1) -> Path:
    """Write ``obj`` as strict JSON (``allow_nan=False`` after :func:`sanitize`), gzipped for ``*.json.gz``."""
    p = Path(path)
    if p.parent and not p.parent.exists():
        p.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(sanitize(obj), indent=indent, allow_nan=False) + "\n"
    if p.suffix == ".gz":
        import gzip

        with gzip.open(p, "wt", encoding="utf-8") as f:
            f.write(text)
    else:
        p.write_text(text)
    return p


def read_json(path) -> Any:
    """A JSON file, or a gzipped one (``*.json.gz``: how large raw results are committed)."""
    p = Path(path)
    if p.suffix == ".gz":
        import gzip

        with gzip.open(p, "rt", encoding="utf-8") as f:
            return json.load(f)
    return json.loads(p.read_text())


def fmt(x: Any, digits: int = 2, pct: bool = False, suffix: str = "") -> str:
    """Format a number for a table: None/NaN -> '—', ``pct`` -> 'xx.x%'."""
    if not is_number(x):
        return MISSING if x is None or isinstance(x, float) else str(x)
    if pct:
        return f"{100.0 * x:.1f}%"
    if isinstance(x, int):
        return f"{x}{suffix}"
    ax = abs(x)
    if ax != 0 and (ax < 10 ** (-digits) or ax >= 1e7):
        return f"{x:.{max(digits, 1)}e}{suffix}"
    return f"{x:.{digits}f}{suffix}"


def ratio(num: Any, den: Any) -> Optional[float]:
    """num / den, or None when either is missing or den is 0."""
    if not (is_number(num) and is_number(den)) or den == 0:
        return None
    return float(num) / float(den)


# ---------------------------------------------------------------------------------
# Markdown
# ---------------------------------------------------------------------------------
def _cell(v: Any) -> str:
    s = v if isinstance(v, str) else fmt(v)
    return s.replace("|", "\\|").replace("\n", " ")


def markdown_table(headers: Sequence[str], rows: Iterable[Sequence[Any]],
                   align: Optional[Sequence[str]] = None) -> str:
    """GitHub-flavoured Markdown table. ``align`` entries: 'l', 'r' or 'c'
    (default: right for every column but the first)."""
    headers = list(headers)
    n = len(headers)
    if align is None:
        align = ["l"] + ["r"] * (n - 1)
    if len(align) != n:
        raise ValueError(f"align has {len(align)} entries for {n} columns")
    marks = {"l": ":---", "r": "---:", "c": ":---:"}
    lines = ["| " + " | ".join(_cell(h) for h in headers) + " |",
             "| " + " | ".join(marks[a] for a in align) + " |"]
    for row in rows:
        row = list(row)
        if len(row) != n:
            raise ValueError(f"row has {len(row)} cells for {n} columns: {row!r}")
        lines.append("| " + " | ".join(_cell(c) for c in row) + " |")
    return "\n".join(lines)


def markdown_kv(items: Dict[str, Any]) -> str:
    """Bulleted 'key: value' list."""
    return "\n".join(f"- **{k}**: {v if isinstance(v, str) else fmt(v, 4)}" for k, v in items.items())


def write_markdown(path, title: str, sections: Sequence[tuple]) -> Path:
    """Write a document: ``# title`` then ``## heading`` + body per (heading, body)."""
    parts = [f"# {title}", ""]
    for heading, body in sections:
        if heading:
            parts += [f"## {heading}", ""]
        parts += [body.rstrip(), ""]
    p = Path(path)
    if p.parent and not p.parent.exists():
        p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text("\n".join(parts))
    return p


def text_table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """Fixed-width plain-text table for stdout."""
    cells = [[str(h) for h in headers]] + [[c if isinstance(c, str) else fmt(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    out = []
    for j, r in enumerate(cells):
        out.append("  ".join(c.rjust(widths[i]) if i else c.ljust(widths[i]) for i, c in enumerate(r)))
        if j == 0:
            out.append("  ".join("-" * w for w in widths))
    return "\n".join(out)


# ---------------------------------------------------------------------------------
# plots
# ---------------------------------------------------------------------------------
def have_matplotlib() -> bool:
    try:
        import matplotlib  # noqa: F401
    except Exception:
        return False
    return True


def plot_panels(path, panels: List[Dict[str, Any]], suptitle: Optional[str] = None) -> bool:
    """One PNG with a row of line-plot panels.

    Each panel: ``{"title", "xlabel", "ylabel", "xlog2": bool, "hline": float|None,
    "series": [{"label", "x": [...], "y": [...], "style": "-"|"--"|...}]}``.
    Points whose y is missing are dropped.  Returns False when matplotlib is missing
    or there is nothing to draw.

    A panel with ``"kind": "bar"`` draws grouped bars instead: ``"categories": [...]``
    and series whose ``"y"`` holds one value per category (``"ylog": True`` for a log
    axis).
    """
    if not panels:
        return False
    try:
        os.environ.setdefault("MPLBACKEND", "Agg")
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        import matplotlib.ticker  # noqa: F401
    except Exception:
        return False
    n = len(panels)
    fig, axes = plt.subplots(1, n, figsize=(6.2 * n, 4.4), squeeze=False)
    drew = False
    for ax, panel in zip(axes[0], panels):
        if panel.get("kind") == "bar":
            drew = _draw_bars(ax, panel) or drew
            continue
        for s in panel.get("series", []):
            pts = [(x, y) for x, y in zip(s.get("x", []), s.get("y", [])) if is_number(x) and is_number(y)]
            if not pts:
                continue
            xs, ys = zip(*pts)
            ax.plot(xs, ys, s.get("style", "-"), marker=s.get("marker", "o"), markersize=4, label=s.get("label"))
            drew = True
        if panel.get("xlog2"):
            ax.set_xscale("log", base=2)
            ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
        if panel.get("hline") is not None:
            ax.axhline(panel["hline"], color="grey", linewidth=0.8, linestyle=":")
        ax.set_title(panel.get("title", ""))
        ax.set_xlabel(panel.get("xlabel", ""))
        ax.set_ylabel(panel.get("ylabel", ""))
        ax.grid(True, alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    if suptitle:
        fig.suptitle(suptitle, fontsize=10)
    fig.tight_layout()
    if drew:
        p = Path(path)
        if p.parent and not p.parent.exists():
            p.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(p, dpi=110)
        shrink_png(p)
    plt.close(fig)
    return drew


PNG_COLORS = 128


def shrink_png(path) -> None:
    """Rewrite a plot PNG with a palette of PNG_COLORS colours (about a third of matplotlib's RGBA file: the
    results travel to the GPU host inside a 64 MiB limit). No-op without Pillow (matplotlib's own dependency)."""
    try:
        from PIL import Image
    except Exception:
        return
    with Image.open(path) as im:
        small = im.convert("RGB").quantize(colors=PNG_COLORS)
    small.save(path, "PNG", optimize=True)


def _draw_bars(ax, panel: Dict[str, Any]) -> bool:
    """Grouped bar chart on ``ax`` (see :func:`plot_panels`); True if anything was drawn."""
    cats = list(panel.get("categories", []))
    series = [s for s in panel.get("series", []) if any(is_number(v) and v for v in s.get("y", []))]
    if not cats or not series:
        ax.set_title(panel.get("title", ""))
        ax.text(0.5, 0.5, panel.get("empty_text", "no data"), ha="center", va="center", transform=ax.transAxes)
        return False
    width = 0.8 / len(series)
    for j, s in enumerate(series):
        ys = [v if is_number(v) else 0 for v in s.get("y", [])][: len(cats)]
        xs = [i - 0.4 + width * (j + 0.5) for i in range(len(ys))]
        ax.bar(xs, ys, width=width, label=s.get("label"))
    ax.set_xticks(range(len(cats)))
    ax.set_xticklabels(cats, rotation=panel.get("xrotation", 0), fontsize=8)
    if panel.get("ylog"):
        ax.set_yscale("log")
    ax.set_title(panel.get("title", ""))
    ax.set_xlabel(panel.get("xlabel", ""))
    ax.set_ylabel(panel.get("ylabel", ""))
    ax.grid(True, axis="y", alpha=0.3)
    if len(series) > 1 or series[0].get("label"):
        ax.legend(fontsize=7)
    return True
