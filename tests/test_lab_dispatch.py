"""The cluster's dispatch loop (lab.measure.dispatch) on a stand-in for Ray, and the cluster's scheduling rules
(lab.measure.cluster): no Ray, no workers, every call answered at once. The same loop with a real embedded Ray
is tests/test_lab_cluster.py's."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

from lab.evidence.store import write_record
from lab.measure import cluster, dispatch
from lab.measure.cluster import Task

FIXTURES = Path(__file__).parent / "fixtures" / "lab"
sys.path.insert(0, str(FIXTURES))

import lab_synthetic  # noqa: E402

PROVENANCE = {"command": ["test"], "git": {"commit": None, "dirty": None}}


# --------------------------------------------------------------------------------------------------------
# The dispatch loop alone, on a stand-in for Ray
# --------------------------------------------------------------------------------------------------------


class FakeRay:
    """Ray's calls that the loop makes, every call answered at once; a replacement worker never starts."""

    class exceptions:
        class RayError(Exception):
            pass

        class RayTaskError(RayError):
            pass

    def __init__(self):
        self.killed = []

    def wait(self, refs, num_returns, timeout):
        return refs[:num_returns], refs[num_returns:]

    def get(self, ref):
        if isinstance(ref.result, BaseException):
            raise ref.result
        return ref.result

    def kill(self, handle):
        self.killed.append(handle)

    def remote(self, **options):
        def actor(cls):
            never = Ref(self.exceptions.RayError("the replacement found no GPU"))
            return SimpleNamespace(remote=lambda device: SimpleNamespace(identity=Remote(lambda: never)))
        return actor


@dataclass(eq=False)
class Ref:
    result: object


@dataclass
class Remote:
    answer: object

    def remote(self, *args):
        return self.answer(*args)


def fake_worker(key, outcomes, calls):
    def run(experiment, provenance, profiling):
        calls.append((experiment.slug, key))
        return Ref(outcomes[experiment.slug])
    return cluster.Worker(SimpleNamespace(run=Remote(run)), {"host": "h", "gpu_key": key, "gpu_ids": ["0"]})


def test_the_loop_runs_each_pair_once_and_a_failure_costs_only_its_own(tmp_path):
    ray = FakeRay()
    existing = lab_synthetic.run([], slug="exists", run_id="20260101T000000Z-nvidia-test-gpu-a-000001")
    write_record(existing, tmp_path)
    outcomes = {
        "a": lab_synthetic.run([], slug="a", run_id="20260101T000000Z-nvidia-test-gpu-a-00000a").to_json(),
        "dies": ray.exceptions.RayError("The actor died unexpectedly before finishing this task."),
        "raises": ray.exceptions.RayTaskError("ValueError: deliberate"),
        "exists": existing.to_json(),
        "b": lab_synthetic.run([], slug="b", run_id="20260101T000000Z-nvidia-test-gpu-a-00000b").to_json(),
    }
    experiments = {slug: SimpleNamespace(slug=slug) for slug in outcomes}
    calls = []
    workers = [fake_worker("m", outcomes, calls), fake_worker("n", outcomes, calls)]
    tasks = [Task(s, k, "forced") for s, k in [("a", "m"), ("a", "m"), ("raises", "m"), ("dies", "m"), ("b", "m"),
                                                ("exists", "n"), ("a", "n"), ("a", "n"), ("b", "unheld")]]
    messages = []
    outcome = dispatch.Dispatch(experiments, workers, ray=ray, records_dir=tmp_path, provenance=PROVENANCE,
                                profiling=None, device="cpu", worker_class=object, say=messages.append,
                                startup_seconds=1).run(tasks, progress=False)
    assert sorted(calls) == sorted([("a", "m"), ("raises", "m"), ("dies", "m"), ("exists", "n"), ("a", "n")])
    assert sorted((t.slug, t.gpu_key) for t, _ in outcome.written) == [("a", "m")]  # ("a", "n"): same run id
    failed = {(t.slug, t.gpu_key): why for t, why in outcome.failed}
    assert "the run failed on h GPU 0: RayTaskError: ValueError: deliberate" in failed["raises", "m"]
    assert "the worker on h GPU 0 died" in failed["dies", "m"]
    assert failed["b", "m"] == "no worker holding a m is left"  # its only worker died, no replacement came
    assert failed["b", "unheld"] == "no worker holding a unheld is left"
    assert "FileExistsError" in failed["exists", "n"] and "FileExistsError" in failed["a", "n"]
    assert len(outcome.failed) == 6 and outcome.cancelled == [] and not outcome.interrupted
    assert any("did not start: RayError: the replacement found no GPU" in m for m in messages)
    assert workers[0].handle in ray.killed


class SwappingRay(FakeRay):
    """FakeRay whose replacement workers start, in the order given: each holds the model its identity says."""

    def __init__(self, replacements):
        super().__init__()
        self.replacements = list(replacements)

    def remote(self, **options):
        return lambda cls: SimpleNamespace(remote=lambda device: self.replacements.pop(0))


def run_with_replacements(tmp_path, pairs, replacements):
    """Workers of models m (GPU 0) and n (GPU 1), each running its own "dies" first, then `pairs`; the
    replacements start as `replacements` says ((model, GPU) each, in the order asked for)."""
    def outcomes(key):
        dies = FakeRay.exceptions.RayError("The actor died unexpectedly before finishing this task.")
        good = lab_synthetic.run([], slug="a", run_id=f"20260101T000000Z-nvidia-test-gpu-a-00000{key}").to_json()
        return {"dies": dies, "a": good}

    calls, messages = [], []

    def worker(key, gpu):
        found = fake_worker(key, outcomes(key), calls)
        found.identity["gpu_ids"] = [gpu]
        found.handle.identity = Remote(lambda: Ref(found.identity))
        return found

    ray = SwappingRay([worker(key, gpu).handle for key, gpu in replacements])
    tasks = [Task(s, k, "forced") for s, k in [("dies", "m"), ("dies", "n"), *pairs]]
    experiments = {s: SimpleNamespace(slug=s) for s in ("dies", "a")}
    outcome = dispatch.Dispatch(experiments, [worker("m", "0"), worker("n", "1")], ray=ray, records_dir=tmp_path,
                                provenance=PROVENANCE, profiling=None, device="cpu", worker_class=object,
                                say=messages.append, startup_seconds=60).run(tasks, progress=False)
    assert sorted((t.slug, t.gpu_key) for t, _ in outcome.failed) == [("dies", "m"), ("dies", "n")], messages
    return sorted((t.slug, t.gpu_key) for t, _ in outcome.written), calls, messages


def test_replacements_that_swap_gpus_run_the_tasks_of_the_model_each_holds(tmp_path):
    # Both workers die; Ray puts the replacement asked for first on the GPU the other one freed. The first
    # to join holds n: m's task waits for the second, which holds m, instead of failing for want of a worker.
    written, calls, messages = run_with_replacements(tmp_path, [("a", "m"), ("a", "n")], [("n", "1"), ("m", "0")])
    assert written == [("a", "m"), ("a", "n")], messages
    assert calls[-2:] == [("a", "n"), ("a", "m")]  # each on the replacement holding its model, as it joined
    assert sum("replacement worker" in m and "joined" in m for m in messages) == 2


def test_a_worker_with_nothing_left_to_run_is_replaced_too_when_another_model_waits(tmp_path):
    # Only m has a task left, but n's GPU is freed as well, and m's replacement may land there: n's death
    # asks for one more, which holds m; the one that holds n, with nothing to run, is let go.
    written, calls, messages = run_with_replacements(tmp_path, [("a", "m")], [("n", "1"), ("m", "0")])
    assert written == [("a", "m")] and calls[-1] == ("a", "m"), messages
    assert any("holds n, for which nothing is left to run" in m for m in messages), messages
    assert sum("replacement worker" in m and "joined" in m for m in messages) == 1


# --------------------------------------------------------------------------------------------------------
# Scheduling: longest first, by the last run's duration
# --------------------------------------------------------------------------------------------------------


def test_longest_first_puts_unknown_durations_first_then_the_longest():
    tasks = [Task(s, "m", "forced") for s in ("short", "new", "long", "middle", "also-new")]
    seconds = {"short": 10.0, "long": 300.0, "middle": 60.0}
    order = cluster.longest_first(tasks, lambda t: seconds.get(t.slug))
    assert [t.slug for t in order] == ["new", "also-new", "long", "middle", "short"]


def test_last_duration_prefers_the_same_gpu_and_scales_by_points():
    def run(key, start, end, points):
        return SimpleNamespace(gpu_key=key, started_utc=start, finished_utc=end, points=[None] * points)

    runs = [run("b", "2026-01-01T00:00:00Z", "2026-01-01T00:10:00Z", 4),  # newest first
            run("a", "2026-01-01T00:00:00Z", "2026-01-01T00:01:40Z", 10)]
    assert cluster.last_duration(runs, "a") == 100.0
    assert cluster.last_duration(runs, "a", points=30) == 300.0  # three times the points it had then
    assert cluster.last_duration(runs, "c") == 600.0  # no run on c: the newest on any GPU
    assert cluster.last_duration([], "a") is None
    assert cluster.last_duration([run("a", "garbled", "2026-01-01T00:00:00Z", 1)], "a") is None
