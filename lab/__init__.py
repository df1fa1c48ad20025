"""The lab's machinery, in three rooms by the stages a run record passes through.

* lab.measure — on the GPU: timing (lab.measure.timing), a run of one experiment into one record
  (lab.measure.runner, with its inputs and checks in lab.measure.inputs), the environment it ran on, and the
  Nsight Compute facts (lab.measure.profiling, lab.measure.ncu, lab.measure.profile_driver); runs spread
  over many GPUs, one worker per GPU, through Ray (lab.measure.cluster, lab.measure.dispatch).
* lab.evidence — the records themselves: their schema (lab.evidence.records), the store that writes and
  reads them (lab.evidence.store), source hashes, statistics and verdicts.
* lab.publish — the site: evidence collected and judged (lab.publish.collect), the view models the templates
  show (lab.publish.views, lab.publish.indexes), plots, number formatting and the rendering into docs/.

Dependencies point one way: measure → evidence ← publish; publishing never imports measuring, so records,
verdicts, plots and pages import and run on a CPU. Declared experiments (experiments/) go in; immutable run
records (records/<slug>/<run-id>.json.gz) and generated Markdown pages (docs/) come out. lab.adhoc is the
console entry for a quick one-case table.
"""

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]


def cache_folder(variable: str, name: str):
    """Where a cache between processes lives: .cache/<name>/ at the repository root (git-ignored, never
    published), the folder the environment variable names instead, or None when it says off, 0, no or false."""
    setting = os.environ.get(variable, "").strip()
    if setting.lower() in ("off", "0", "no", "false"):
        return None
    return Path(setting) if setting else REPO_ROOT / ".cache" / name
