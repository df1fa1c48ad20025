"""Each experiment's measured margin, read from experiments/margins.json (written from the run records by
tools/derive_margin.py; lab.evidence.margin says how). A declaration names its margin with
`measured_margin(slug)`; an experiment the file does not list yet takes the value pooled over all of them."""

from __future__ import annotations

import json
from pathlib import Path

from experiments.spec import NO_MARGIN, Margin

MARGINS_FILE = Path(__file__).with_name("margins.json")


def measured_margin(slug: str) -> Margin:
    if not MARGINS_FILE.is_file():
        return NO_MARGIN
    data = json.loads(MARGINS_FILE.read_text(encoding="utf-8"))
    entry = data["experiments"].get(slug)
    if entry is None:
        pooled = data["pooled"]
        return Margin(pooled["fraction"], f"{pooled['basis']} (not derived for this experiment yet)")
    return Margin(entry["fraction"], entry["basis"])
