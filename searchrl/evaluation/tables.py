"""Small HTML table helpers shared by the report page and its trainers-side-by-side section."""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from typing import Any


def fmt_cell(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.3f}" if math.isfinite(v) else str(v)
    return html.escape(str(v))


def html_table(header: Sequence[str], rows: Sequence[Sequence[Any]], css_class: str = "") -> str:
    head = "".join(f"<th>{html.escape(str(h))}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
    cls = f" class='{css_class}'" if css_class else ""
    return f"<table{cls}><tr>{head}</tr>{body}</table>"


def finite_number(value: Any) -> float | None:
    """`value` as a float when it is a finite int or float (not a bool), else None."""
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None
