"""What the evidence pages are rendered from, and the digest of it kept in a checkout after a render.

tools/build_results.py stores the digest once it has rendered docs/ from records/ (taken before the render, so
a file changed during it shows as a change); under `mkdocs serve`, tools/mkdocs_hooks.py re-renders only when
the inputs' digest differs from the one stored. So the first `./dev.sh serve` after `./dev.sh site` starts
without rendering the same pages again. No imports beyond the standard library: the hooks load it at every
start of the server.
"""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path

log = logging.getLogger(__name__)

# What the evidence pages are rendered from; a change to any of them re-renders under `mkdocs serve`.
RENDER_INPUTS = ("records", "lab", "experiments", "kernels", "probes", "notes")
# Where the digest of the inputs of the last successful render is kept, from the repository root.
FINGERPRINT_FILE = ".cache/kernel-lab/evidence-inputs.sha256"


def render_fingerprint(root: Path) -> str:
    """A digest of the names, sizes and modification times of everything the evidence pages depend on."""
    h = hashlib.sha256()
    for top in RENDER_INPUTS:
        base = root / top
        if not base.exists():
            continue
        for path in sorted(base.rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts:
                st = path.stat()
                h.update(f"{path.relative_to(root).as_posix()}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return h.hexdigest()


def stored_fingerprint(root: Path) -> str | None:
    try:
        return (root / FINGERPRINT_FILE).read_text(encoding="ascii").strip() or None
    except (OSError, UnicodeDecodeError):
        return None


def store_fingerprint(root: Path, fingerprint: str) -> None:
    try:
        path = root / FINGERPRINT_FILE
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(fingerprint + "\n", encoding="ascii")
    except OSError as exc:  # a read-only checkout still serves; it only renders again on the next start
        log.debug(f"could not keep the render's fingerprint: {exc}")
