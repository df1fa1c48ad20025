"""Drawn plots kept between processes, so a figure is drawn to SVG once per content and code.

Drawing is most of a render: about three quarters of `tools/build_results.py --render-only` (141 figures, about
45 s of 60 on two cores) goes to matplotlib laying out and writing the SVG, while building the figure (its
artists, data and text) takes a few milliseconds. A figure that pickles to the same bytes, drawn under the same
settings by the same code, gives the same SVG: plot_style makes the output deterministic (a fixed hash salt, no
date, text kept as text). So the SVG is kept under .cache/plots/ (git-ignored, never published), named by the
SHA-256 of:

* the figure, pickled (its artists, transforms, data and text), with each transform's back-links to its
  parents left out (they are keyed by memory address, which differs from one process to the next, and each
  is the reverse of a forward link that is pickled anyway) and the figure's number in pyplot (how many
  figures were open; it draws nothing);
* every rcParam in force when it is drawn, and the versions of matplotlib and numpy;
* the source of lab/publish/ (formatters run at drawing time and pickle by name, not by code).

A figure that cannot be pickled is drawn as before. The entries are text this code wrote; nothing is
unpickled. KERNEL_LAB_PLOT_CACHE=off turns the cache off; a folder path there moves it.
"""

from __future__ import annotations

import copyreg
import hashlib
import io
import pickle
from collections.abc import Callable
from functools import cache
from pathlib import Path

import matplotlib
import numpy
from matplotlib.figure import Figure
from matplotlib.transforms import TransformNode

from lab import cache_folder
from lab.evidence.store import replace_text

PUBLISH = Path(__file__).resolve().parent


@cache
def _code_digest() -> bytes:
    digest = hashlib.sha256(f"matplotlib {matplotlib.__version__} numpy {numpy.__version__}".encode())
    for path in sorted(PUBLISH.glob("*.py")):
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.digest()


def folder() -> Path | None:
    """Where the cache lives, or None when KERNEL_LAB_PLOT_CACHE turns it off."""
    return cache_folder("KERNEL_LAB_PLOT_CACHE", "plots")


class _KeyPickler(pickle.Pickler):
    """Pickles a figure for its key: transforms without their address-keyed back-links, the figure without the
    number pyplot gave it (the count of figures open at the time)."""

    def reducer_override(self, obj):
        if isinstance(obj, (TransformNode, Figure)):
            state = obj.__getstate__()
            state.pop("_parents" if isinstance(obj, TransformNode) else "_number", None)
            return copyreg.__newobj__, (type(obj),), state
        return NotImplemented


def key(fig) -> str | None:
    """The figure's key under the rcParams in force now, or None when it cannot be pickled."""
    out = io.BytesIO()
    try:
        _KeyPickler(out, protocol=pickle.HIGHEST_PROTOCOL).dump(fig)
    except Exception:  # an unpicklable artist (a lambda formatter, say): drawn without the cache
        return None
    settings = repr(sorted((name, repr(value)) for name, value in matplotlib.rcParams.items()))
    digest = hashlib.sha256(_code_digest())
    digest.update(settings.encode("utf-8"))
    digest.update(out.getbuffer())
    return digest.hexdigest()


def drawn(fig, draw: Callable[[object], str]) -> str:
    """draw(fig), or the SVG it gave for the same figure, settings and code before."""
    where = folder()
    name = key(fig) if where is not None else None
    if name is None:
        return draw(fig)
    entry = where / f"{name}.svg"
    try:
        return entry.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        pass
    text = draw(fig)
    try:
        where.mkdir(parents=True, exist_ok=True)
        replace_text(entry, text)  # whole or not at all
    except OSError:
        pass  # a cache that cannot be written costs time, never the plot
    return text
