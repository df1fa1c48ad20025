"""torch.compile's recompile limits, raised for every point a run may compile, before anything compiles.

The compiled references use dynamic=False, so each shape is its own graph. Past dynamo's recompile limit (8 by
default) a compiled function silently runs eager PyTorch instead, and a profile named torch.compile would be
timing something else. The compiled references are cached for the whole process, so one process running several
experiments keeps compiling into the same functions: each run raises the limits by its own number of points, on
top of what earlier runs were granted.

Importing torch._dynamo costs about 2.4 CPU seconds, and most processes that run experiments never compile
(a run of eager profiles, each cluster worker of the CPU tests). Nothing can compile before torch._dynamo's
configuration module has been imported, so a grant made before then is kept and added to the limits the moment
that module finishes loading, before torch.compile can read them; a grant made after is added at once.
"""

from __future__ import annotations

import importlib
import importlib.abc
import sys
import threading

CONFIG = "torch._dynamo.config"

_lock = threading.RLock()
_pending: dict[str, int] = {}  # limit -> the extra granted before CONFIG was imported
_loaded = False  # whether CONFIG has been imported (and the pending grants added to it)


def _extras(points: int) -> dict[str, int]:
    return {"recompile_limit": points + 8, "accumulated_recompile_limit": 8 * points + 256}


def _add(config, extras: dict[str, int]) -> None:
    for name, extra in extras.items():
        if hasattr(config, name):  # a torch that names them otherwise (cache_size_limit) is left as it is
            setattr(config, name, getattr(config, name) + extra)


def _config_loaded(config) -> None:
    global _loaded
    with _lock:
        _loaded = True
        pending = dict(_pending)
        _pending.clear()
        _add(config, pending)


class _GrantOnImport(importlib.abc.MetaPathFinder):
    """Finds CONFIG with the finders after it and has its loader add the pending grants once it has run."""

    def find_spec(self, fullname, path, target=None):
        if fullname != CONFIG:
            return None
        for finder in sys.meta_path[sys.meta_path.index(self) + 1:]:
            find = getattr(finder, "find_spec", None)
            spec = find(fullname, path, target) if find is not None else None
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        exec_module = loader.exec_module

        def exec_then_grant(module):
            exec_module(module)
            _config_loaded(sys.modules.get(fullname, module))

        loader.exec_module = exec_then_grant  # this module's own loader object only
        return spec


_finder = _GrantOnImport()


def allow_a_compile_per_point(points: int) -> None:
    """Let torch.compile profiles compile one graph per case and dtype (`points` of them) without falling back to
    eager: the limits are raised now if torch._dynamo is loaded, else as soon as it is."""
    if CONFIG in sys.modules:
        importlib.import_module(CONFIG)  # waits for another thread's import of it, if one is under way, to end
    with _lock:
        if not _loaded and CONFIG in sys.modules:  # loaded before the finder was ever in place
            _config_loaded(sys.modules[CONFIG])
        if _loaded:
            _add(sys.modules[CONFIG], _extras(points))
            return
        for name, extra in _extras(points).items():
            _pending[name] = _pending.get(name, 0) + extra
        if _finder not in sys.meta_path:
            sys.meta_path.insert(0, _finder)


def granted_before_import() -> dict[str, int]:
    """The extras waiting for torch._dynamo to load (empty once it has): for the tests."""
    with _lock:
        return dict(_pending)
