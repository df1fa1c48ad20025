"""The lab's machinery: timing, run records, verdicts, plots and the evidence pages built from them.

Declared experiments (experiments/) go in, immutable run records (records/<slug>/<run-id>.json) and
generated Markdown pages (docs/) come out. Only lab.timing, lab.environment and lab.profile_driver (the
program profiled under Nsight Compute) need a GPU to do real work; everything else imports and runs on a CPU.
"""

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
