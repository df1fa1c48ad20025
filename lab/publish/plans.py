"""The launch plans a run recorded, as an experiment page lists them: what every plan of a profile shares once,
and per point only what differs."""

from __future__ import annotations

import json
from typing import Mapping

from experiments.spec import Experiment
from lab.evidence.records import Point, RunRecord
from lab.publish.collect import profile_names


def _plan_text(plan: Mapping) -> str:
    return json.dumps(dict(plan), sort_keys=True, separators=(", ", ": "))


def launch_plans(experiment: Experiment, run: RunRecord) -> dict | None:
    """The launch plans the run recorded, per profile: what every plan of a profile shares, stated once
    ("common"), and per point only what differs ("rows"). None when the run recorded no plan."""
    by_profile: dict[str, list[tuple[Point, dict]]] = {}
    for point in run.points:
        for name in profile_names(experiment, [point]):
            plan = point.results[name].plan
            if plan:
                by_profile.setdefault(name, []).append((point, plan if isinstance(plan, dict) else {"plan": plan}))
    if not by_profile:
        return None
    common, rows = [], []
    for name, plans in by_profile.items():
        shared = {k: v for k, v in plans[0][1].items()
                  if all(k in p and p[k] == v for _, p in plans[1:])} if len(plans) > 1 else {}
        if shared:
            common.append({"profile": name, "plan": _plan_text(shared)})
        for point, plan in plans:
            rest = {k: v for k, v in plan.items() if k not in shared}
            rows.append({"case": point.case, "dtype": point.dtype, "profile": name,
                         "plan": _plan_text(rest) if rest else "as above"})
    subject = experiment.claim.subject
    return {"common": common, "rows": rows,
            "subject_common": [c for c in common if c["profile"] == subject],
            "subject_rows": [r for r in rows if r["profile"] == subject]}
