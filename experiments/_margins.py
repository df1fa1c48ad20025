"""Each experiment's measured margins, one per clock, read from experiments/margins.json (written from the run
records by tools/derive_margin.py; lab.evidence.margin says how). A declaration names its margin with
`measured_margin(slug)`: the GPU-time margin, carrying the eager-call clock's own as `.eager`. An experiment the
file does not list yet takes the values pooled over all of them."""

from __future__ import annotations

import json
from pathlib import Path

from experiments.spec import EAGER_CALL, GPU_TIME, NO_MARGIN, Margin

MARGINS_FILE = Path(__file__).with_name("margins.json")
NOT_YET = " (not derived for this experiment yet)"


def measured_margin(slug: str) -> Margin:
    if not MARGINS_FILE.is_file():
        return NO_MARGIN
    data = json.loads(MARGINS_FILE.read_text(encoding="utf-8"))
    entry = data["experiments"].get(slug)
    if entry is None:
        pooled = data["pooled"]
        gpu, eager = pooled[GPU_TIME]["all"], pooled.get(EAGER_CALL, {}).get("all")
        fraction = max(gpu["fraction"], eager["fraction"]) if eager else gpu["fraction"]
        return Margin(gpu["fraction"], gpu["basis"] + NOT_YET,
                      Margin(fraction, (eager or gpu)["basis"] + NOT_YET))
    gpu, eager = entry[GPU_TIME], entry[EAGER_CALL]
    return Margin(gpu["fraction"], gpu["basis"], Margin(eager["fraction"], eager["basis"]))
