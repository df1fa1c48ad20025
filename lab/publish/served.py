"""Which run records the site serves: the ones its numbers come from.

Those are the newest run of each experiment on each GPU, on either clock (the summary card, the GPUs side by
side, the per-GPU detail, the plots and the indexes come from it); the older run a GPU's profile and roofline
come from when its newest run was not profiled (lab.publish.profiled); and every run a hand-written page
cites by id (`{{ fig(..., run="...") }}`: lab.publish.figures.cited_runs). Pages link these records' copies
on the site. Every other run, superseded, is named in its experiment's history by its path in the repository,
which keeps every record: published, they would be most of the site's weight, and no number on a page comes
from them.

The site's hook (tools/mkdocs_hooks.py) publishes exactly the records the pages link, so a link and its file
never part, whatever set the pages on disk were rendered with.
"""

from __future__ import annotations

from typing import Iterable

from lab.evidence.verdict import CLOCKS
from lab.publish.collect import Evidence
from lab.publish.profiled import profiled_run


def served_runs(evidence: Evidence, cited: Iterable[str] = ()) -> frozenset[str]:
    """The ids of the runs whose records the site serves: what the pages' numbers come from, and the runs in
    `cited` (ids) that the evidence holds."""
    served: set[str] = set()
    for slug, runs in evidence.runs.items():
        for clock in CLOCKS:
            for verdict in evidence.on_clock(slug, clock).values():
                if verdict.run is not None:
                    served.add(verdict.run.run_id)
                    served.add(profiled_run(runs, verdict.run).run_id)
    known = {run.run_id for runs in evidence.runs.values() for run in runs}
    return frozenset(served | (set(cited) & known))
