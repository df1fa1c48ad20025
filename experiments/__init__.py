"""Declared experiments. Each module here (other than spec and _-prefixed helpers) declares EXPERIMENT;
adding an experiment means adding one module."""

from __future__ import annotations

import importlib
import pkgutil

from experiments.spec import Case, Claim, Decision, Experiment, Profile

__all__ = ["Case", "Claim", "Decision", "Experiment", "Profile", "all_experiments", "get_experiment"]

_SKIP = {"spec", "decisions"}


def all_experiments() -> dict[str, Experiment]:
    """Every declared experiment, by slug, in module-name order."""
    found: dict[str, Experiment] = {}
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda i: i.name):
        if info.name.startswith("_") or info.name in _SKIP:
            continue
        module = importlib.import_module(f"{__name__}.{info.name}")
        experiment = getattr(module, "EXPERIMENT", None)
        if not isinstance(experiment, Experiment):
            raise TypeError(f"experiments/{info.name}.py must declare EXPERIMENT = Experiment(...)")
        if experiment.slug in found:
            raise ValueError(f"two experiments share the slug {experiment.slug!r}")
        found[experiment.slug] = experiment
    return found


def get_experiment(slug: str) -> Experiment:
    experiments = all_experiments()
    if slug not in experiments:
        raise KeyError(f"unknown experiment {slug!r}; known: {', '.join(experiments)}")
    return experiments[slug]
