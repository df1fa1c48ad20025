"""Whether a published Jupyter notebook's saved outputs belong to its code.

tools/run_notebooks.py runs a notebook on a GPU and saves its outputs with a stamp in the notebook's metadata:
the sha256 of its code cells' sources at that run, the GPU and the time. The site build
(tools/mkdocs_hooks.py) reads the stamp and marks a notebook page whose outputs are missing or were made by
other code, so a reader never takes bare cells, or outputs of an older version, for the current code's.
"""

from __future__ import annotations

import hashlib
import html
from typing import Any, Mapping

STAMP_KEY = "kernel_lab"  # the notebook metadata key run_notebooks.py writes
FRESH, MISSING, STALE = "fresh", "missing", "stale"


def code_hash(nb: Mapping[str, Any]) -> str:
    """sha256 over the notebook's code cells' sources, in order (whitespace at the ends of a cell ignored)."""
    digest = hashlib.sha256()
    for cell in nb.get("cells", []):
        if cell.get("cell_type") != "code":
            continue
        source = cell.get("source", "")
        text = "".join(source) if isinstance(source, list) else str(source)
        digest.update(text.strip().encode("utf-8") + b"\0")
    return digest.hexdigest()


def has_outputs(nb: Mapping[str, Any]) -> bool:
    return any(cell.get("outputs") for cell in nb.get("cells", []) if cell.get("cell_type") == "code")


def stamp(nb: dict, gpu: str, ran_utc: str) -> None:
    """Record in `nb`'s metadata which code its outputs came from (call after a GPU run, before saving)."""
    nb.setdefault("metadata", {})[STAMP_KEY] = {"code_sha256": code_hash(nb), "gpu": gpu, "ran_utc": ran_utc}


def outputs_state(nb: Mapping[str, Any]) -> str:
    """FRESH: saved outputs stamped with the current code; MISSING: no outputs, or outputs without a stamp;
    STALE: outputs stamped with other code."""
    if not has_outputs(nb):
        return MISSING
    mark = (nb.get("metadata") or {}).get(STAMP_KEY)
    if not isinstance(mark, Mapping) or not isinstance(mark.get("code_sha256"), str):
        return MISSING
    return FRESH if mark["code_sha256"] == code_hash(nb) else STALE


def outputs_notice(nb: Mapping[str, Any]) -> str | None:
    """The HTML note a notebook page opens with when its outputs are not the current code's (None if they are)."""
    state = outputs_state(nb)
    if state == FRESH:
        return None
    mark = (nb.get("metadata") or {}).get(STAMP_KEY) or {}
    if state == MISSING:
        text = ("This notebook is shown without results: its code has not been run on a GPU since it last "
                "changed (<code>tools/run_notebooks.py</code> saves the outputs of a GPU run). The cells that need "
                "no GPU run on the CPU in the project's tests.")
    else:
        when = html.escape(str(mark.get("ran_utc", "an earlier date")))
        gpu = html.escape(str(mark.get("gpu", "a GPU")))
        text = (f"The outputs below come from a run on {gpu} at {when} of an earlier version of this code: the "
                "code has changed since, so they may not be what it prints now.")
    return (f'<div class="admonition warning"><p class="admonition-title">Outputs {state}</p>'
            f"<p>{text}</p></div>")
