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

Every SVG drawn this way names its key in a comment on its second line, so the plots committed under
docs/assets/plots/ seed an empty cache: a fresh checkout renders the figures the repository already holds
without drawing them again (a figure, its settings and this code give one SVG, wherever it was drawn).
"""

from __future__ import annotations

import copyreg
import hashlib
import io
import pickle
import re
from collections.abc import Callable
from functools import cache
from pathlib import Path

import matplotlib
import numpy
from matplotlib.figure import Figure
from matplotlib.path import Path as MplPath
from matplotlib.transforms import TransformNode

from lab import cache_folder
from lab.evidence.store import replace_text

PUBLISH = Path(__file__).resolve().parent
COMMITTED = PUBLISH.parents[1] / "docs" / "assets" / "plots"  # the repository's drawn plots
_KEY_LINE = re.compile(rb"<!-- kernel-lab plot ([0-9a-f]{64}) -->")


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
        if isinstance(obj, MplPath):
            # matplotlib gives a gridline's path 180 interpolation steps, or 1 where the line was recached
            # before, which depends on what the process drew earlier. Steps only bend a path under a
            # non-affine transform (polar axes), which no figure here has.
            state = dict(vars(obj))
            state.pop("_interpolation_steps", None)
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


def _key_line(name: str) -> str:
    return f"<!-- kernel-lab plot {name} -->"


def with_key(text: str, name: str) -> str:
    """The SVG text with its key in a comment after the XML declaration (or first, without one)."""
    line = _key_line(name) + "\n"
    if text.startswith("<?xml"):
        end = text.find("\n") + 1
        return text[:end] + line + text[end:] if end else text + "\n" + line
    return line + text


def committed() -> dict[str, Path]:
    """Key -> SVG file among the committed plots (COMMITTED) whose second line names the key this module wrote."""
    return _index(COMMITTED)


@cache
def _index(folder: Path) -> dict[str, Path]:
    found: dict[str, Path] = {}
    for path in sorted(folder.glob("*.svg")) if folder.is_dir() else ():
        try:
            with open(path, "rb") as f:
                head = f.read(300)
        except OSError:
            continue
        if (match := _KEY_LINE.search(head)) is not None:
            found[match.group(1).decode()] = path
    return found


def _kept(name: str, entry: Path) -> str | None:
    """The SVG drawn before for key `name`: the cache's entry, else a committed plot naming the key."""
    for path in (entry, committed().get(name)):
        if path is None:
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        if _key_line(name) in text[:300]:
            return text
    return None


def drawn(fig, draw: Callable[[object], str]) -> str:
    """draw(fig), or the SVG it gave for the same figure, settings and code before."""
    where = folder()
    name = key(fig) if where is not None else None
    if name is None:
        return draw(fig)
    entry = where / f"{name}.svg"
    text = _kept(name, entry)
    if text is None:
        text = with_key(draw(fig), name)
    elif entry.is_file():
        return text
    _keep(where, entry, text)  # drawn now, or taken from a committed plot
    return text


def _keep(where: Path, entry: Path, text: str) -> None:
    try:
        where.mkdir(parents=True, exist_ok=True)
        replace_text(entry, text)  # whole or not at all
    except OSError:
        pass  # a cache that cannot be written costs time, never the plot
