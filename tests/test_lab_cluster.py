"""Cluster runs (lab.measure.cluster, lab.measure.dispatch, build_results --cluster) on the CPU.

One embedded Ray is shared by the module's Ray tests: it declares two GPUs that do not exist, and its
workers run tiny experiments (tests/fixtures/lab/lab_cluster_experiments.py) through Triton's interpreter.
The same code starts one worker per real GPU on a GPU machine (checks/cluster.sh); here the
machinery is what is checked: distribution, GPU models kept apart, a worker killed mid-run, an experiment
that raises, Ctrl-C, pairs asked for twice, and addresses where no cluster answers.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import HAS_CUDA

from lab import REPO_ROOT
from lab.evidence.hashing import source_hashes
from lab.evidence.records import CPU_GPU_KEY, RecordError, RunRecord
from lab.evidence.store import load_record, load_records, write_record
from lab.measure import cluster, dispatch
from lab.publish.formatting import host_label
from lab.measure.cluster import ClusterError, plan_tasks, probe, resolve_address, split_address
from lab.measure.environment import command_line, git_state

FIXTURES = Path(__file__).parent / "fixtures" / "lab"
sys.path.insert(0, str(FIXTURES))

import lab_cluster_experiments as fx  # noqa: E402
import lab_synthetic  # noqa: E402

spec = importlib.util.spec_from_file_location("build_results", REPO_ROOT / "tools" / "build_results.py")
build_results = importlib.util.module_from_spec(spec)
spec.loader.exec_module(build_results)

try:
    import ray  # noqa: F401
    HAS_RAY = True
except ImportError:
    HAS_RAY = False
needs_ray = pytest.mark.skipif(not HAS_RAY, reason="Ray is not installed (the extra: pip install -e '.[cluster]')")
ON_RAY = (  # the tests that start workers share one embedded Ray (conftest keeps this module in one process)
    needs_ray, pytest.mark.slow, pytest.mark.usefixtures("ray_session"),
    pytest.mark.skipif(HAS_CUDA, reason="declares fake GPUs and runs on the CPU; on a GPU machine "
                                        "checks/cluster.sh runs the real thing"),
)


def on_ray(test):
    for mark in ON_RAY:
        test = mark(test)
    return test


PROVENANCE = {"command": ["test"], "git": {"commit": None, "dirty": None}}


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # nothing listens once the socket is closed


# --------------------------------------------------------------------------------------------------------
# Without Ray: addresses, the plan, the command line
# --------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("text, expected", [
    ("10.0.0.5:6379", ("10.0.0.5", 6379)), ("head:1234", ("head", 1234)), ("[::1]:6379", ("::1", 6379)),
    ("ray://head", ("head", 10001)), ("ray://head:20000", ("head", 20000)),
])
def test_addresses_split_into_host_and_port(text, expected):
    assert split_address(text) == expected


@pytest.mark.parametrize("text", ["head", "head:port", "head:0", "head:70000", ":6379", "fe80::1"])
def test_an_address_without_a_usable_port_is_refused_naming_the_forms(text):
    with pytest.raises(ClusterError, match=r"expected HOST:PORT .* ray://HOST\[:PORT\] or auto"):
        split_address(text)


def test_the_address_comes_from_the_argument_then_ray_address(monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert resolve_address("") is None and resolve_address(None) is None and resolve_address("local") is None
    monkeypatch.setenv("RAY_ADDRESS", "head:6379")
    assert resolve_address("") == "head:6379"
    assert resolve_address("other:1") == "other:1"


def test_an_address_where_nothing_listens_is_refused_within_seconds():
    port = closed_port()
    started = time.monotonic()
    with pytest.raises(ClusterError, match=f"no Ray cluster answers at 127.0.0.1:{port}"):
        probe(f"127.0.0.1:{port}", timeout=2)
    assert time.monotonic() - started < 5


@needs_ray
def test_an_address_that_never_answers_as_ray_is_refused_within_the_timeouts():
    # TEST-NET-3 is routed nowhere: the connection times out, or where a proxy accepts every connection,
    # Ray's handshake does.
    started = time.monotonic()
    with pytest.raises(ClusterError, match="no Ray cluster answers at 203.0.113.1:6379"):
        probe("203.0.113.1:6379", timeout=1, handshake_timeout=3)
    assert time.monotonic() - started < 8


def test_the_plan_holds_each_pair_once_and_skips_fresh_evidence():
    fresh = {("a", "gpu-x")}

    def why(slug, key):
        return None if (slug, key) in fresh else f"needed {slug} {key}"

    tasks = plan_tasks(["a", "b", "a"], ["gpu-x", "gpu-y", "gpu-x"], why)
    assert [(t.slug, t.gpu_key) for t in tasks] == [("a", "gpu-y"), ("b", "gpu-x"), ("b", "gpu-y")]
    assert tasks[0].why == "needed a gpu-y" and str(tasks[0]) == "a on gpu-y"


@pytest.mark.parametrize("change, problem", [
    ({"host": 7}, "record.environment.host: expected a string, got 7"),
    ({"worker": "ray"}, "record.environment.worker: expected an object, got 'ray'"),
    ({"worker": {"scheduler": "ray", "version": "2", "node_id": None, "gpu_ids": [0]}},
     "record.environment.worker.gpu_ids[0]: expected a string, got 0"),
    ({"worker": {"scheduler": "ray", "node_id": None, "gpu_ids": []}},
     "record.environment.worker: missing field 'version'"),
])
def test_a_records_host_and_worker_are_optional_and_checked_when_present(change, problem):
    data = json.loads(lab_synthetic.run([]).to_json())
    assert "host" not in data["environment"] and RunRecord.from_dict(data)  # records from before still load
    data["environment"].update(host="node-1", worker={"scheduler": "ray", "version": "2.60.0", "node_id": "ab",
                                                      "gpu_ids": ["3"]})
    assert RunRecord.from_dict(data).environment["worker"]["gpu_ids"] == ["3"]
    data["environment"].update(change)
    with pytest.raises(RecordError, match=re.escape(problem)):
        RunRecord.from_dict(data)


def test_without_ray_a_cluster_run_exits_2_naming_the_extra(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray raises ImportError
    code = build_results.main(["--cluster", "--run", "softmax-row-fusion", "--records-dir", str(tmp_path)])
    assert code == 2
    assert "pip install -e '.[cluster]'" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize("extra, message", [
    (["--render-only"], "--render-only and --list run nothing"),
    (["--list"], "--render-only and --list run nothing"),
    (["--device", "cuda:1"], "--device cuda:1: with --cluster every worker runs on the GPU Ray gave it"),
])
def test_cluster_usage_errors_exit_2(tmp_path, capsys, extra, message):
    assert build_results.main(["--cluster", *extra, "--records-dir", str(tmp_path)]) == 2
    assert message in capsys.readouterr().err


@needs_ray
def test_a_cluster_address_that_does_not_answer_exits_2_within_seconds(tmp_path, capsys):
    port = closed_port()
    started = time.monotonic()
    assert build_results.main(["--cluster", f"127.0.0.1:{port}", "--run", "softmax-row-fusion",
                               "--records-dir", str(tmp_path / "records"), "--docs-dir", str(tmp_path / "docs")]) == 2
    assert time.monotonic() - started < 10
    assert f"no Ray cluster answers at 127.0.0.1:{port}" in capsys.readouterr().err
    assert not (tmp_path / "records").exists() and not (tmp_path / "docs").exists()


# --------------------------------------------------------------------------------------------------------
# With an embedded Ray of two fake GPUs
# --------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ray_session():
    import ray

    with pytest.MonkeyPatch.context() as patch:
        # The workers import the fixture experiments by name, and run kernels through the interpreter.
        patch.setenv("PYTHONPATH", os.pathsep.join(p for p in (str(FIXTURES), os.environ.get("PYTHONPATH")) if p))
        patch.setenv("TRITON_INTERPRET", "1")
        # Ray starts idle Python workers ahead of the first task; every worker here is an actor on a GPU, which
        # gets a process of its own, so those would start for nothing (2-3 CPU seconds on 2 cores).
        patch.setenv("RAY_prestart_worker_first_driver", "0")
        connection = cluster.connect(None, num_cpus=4, num_gpus=2, object_store_memory=100 * 2**20)
    assert connection.owned and ray.cluster_resources()["GPU"] == 2
    yield ray
    connection.close()


def loaded(tmp_path):
    records, problems = load_records(tmp_path)
    assert problems == []
    return records


def dirs(tmp_path):
    return ["--records-dir", str(tmp_path / "records"), "--docs-dir", str(tmp_path / "docs")]


def declare(monkeypatch, experiments):
    monkeypatch.setattr(build_results, "all_experiments", lambda: dict(experiments))
    monkeypatch.setattr(build_results, "DECISIONS", ())


@on_ray
def test_a_cluster_run_spreads_over_both_gpus_one_at_a_time_writes_here_and_renders(tmp_path, monkeypatch, capsys):
    declare(monkeypatch, {**fx.GOOD, fx.BROKEN.slug: fx.BROKEN})
    # `--cluster SLUG` reads SLUG as a slug; a slug given twice is one (experiment, model) pair
    slugs = ["cluster-a", *fx.GOOD, fx.BROKEN.slug, "cluster-b"]
    assert build_results.main(["--cluster", *slugs, "--device", "cpu", "--no-progress", *dirs(tmp_path)]) == 1
    out, err = capsys.readouterr()
    assert "cluster: 4 record(s) written, 1 failed, 0 cancelled" in out
    # the experiment that raised fails alone, named at the end; its worker went on with the others
    assert f"failed: {fx.BROKEN.slug} on {CPU_GPU_KEY}: the run failed on" in err
    assert "claim subject 'missing' is not a profile" in err and "replacement" not in out
    records = loaded(tmp_path / "records")
    assert sorted(r.experiment for r in records) == sorted(fx.GOOD)
    by_gpu = {}
    for record in records:
        env = record.environment
        assert record.gpu_key == CPU_GPU_KEY and env["host"] == socket.gethostname()
        assert env["worker"]["scheduler"] == "ray" and len(env["worker"]["gpu_ids"]) == 1
        assert record.git == git_state(REPO_ROOT) and record.command[0] == command_line(REPO_ROOT)[0]
        assert record.copy_ceiling.gbps > 0 and record.copy_ceiling.samples_ms  # the worker's own, this run
        assert all(r.status == "ok" for p in record.points for r in p.results.values())
        by_gpu.setdefault(env["worker"]["gpu_ids"][0], []).append(record)
    assert set(by_gpu) == {"0", "1"}, "both GPUs got work"
    for runs in by_gpu.values():  # one experiment at a time on each GPU
        runs.sort(key=lambda r: r.started_utc)
        assert all(a.finished_utc <= b.started_utc for a, b in zip(runs, runs[1:]))
    page = (tmp_path / "docs" / "experiments" / "cluster-a.md").read_text(encoding="utf-8")
    alias = host_label(socket.gethostname())  # the record keeps the name; the page shows its alias
    assert alias.startswith("host-") and f"on {alias}" in page and f"host {alias}, GPU " in page


@on_ray
def test_a_worker_that_dies_costs_only_its_own_experiment_and_models_stay_apart(tmp_path):
    # Two fake models, one worker each; both run the killer first, die, and are replaced on the GPU each
    # freed, which then runs the other experiment of its own model.
    experiments = {fx.KILLER.slug: fx.KILLER, "cluster-a": fx.GOOD["cluster-a"]}
    messages = []
    outcome = dispatch.run_on_cluster(
        experiments, list(experiments), lambda slug, key: "forced", address=None, device="cpu",
        records_dir=tmp_path, provenance=PROVENANCE, progress=False, say=messages.append,
        worker_class=fx.TwoModelWorker)
    failed = {(t.slug, t.gpu_key): why for t, why in outcome.failed}
    assert set(failed) == {(fx.KILLER.slug, "fake-gpu-a"), (fx.KILLER.slug, "fake-gpu-b")}, (failed, messages)
    assert all("died" in why for why in failed.values()), failed
    assert sorted((t.slug, t.gpu_key) for t, _ in outcome.written) == [("cluster-a", "fake-gpu-a"),
                                                                       ("cluster-a", "fake-gpu-b")]
    assert sum("replacement worker" in m and "joined" in m for m in messages) == 2
    for task, path in outcome.written:
        record = load_record(path)
        assert record.command == ("test",) and record.git == PROVENANCE["git"]
        gpu = record.environment["worker"]["gpu_ids"]
        assert gpu == (["0"] if task.gpu_key == "fake-gpu-a" else ["1"]), "never on a worker of another model"
    assert [r.experiment for r in loaded(tmp_path)] == ["cluster-a", "cluster-a"]


@on_ray
def test_ctrl_c_cancels_the_rest_keeps_what_landed_and_exits_130(tmp_path, monkeypatch, capsys):
    declare(monkeypatch, fx.GOOD)
    real = dispatch.write_record
    writes = []

    def write_then_ctrl_c(record, records_dir):
        writes.append(record.experiment)
        if len(writes) == 2:  # Ctrl-C as the second record comes in: it never lands
            monkeypatch.setattr(dispatch, "write_record", real)
            raise KeyboardInterrupt
        return real(record, records_dir)

    monkeypatch.setattr(dispatch, "write_record", write_then_ctrl_c)
    assert build_results.main(["--cluster", "--run", "--device", "cpu", "--no-progress", *dirs(tmp_path)]) == 130
    out, err = capsys.readouterr()
    landed = {r.experiment for r in loaded(tmp_path / "records")}
    cancelled = {line.split("cancelled: ")[1].split(" on ")[0] for line in err.splitlines() if "cancelled: " in line}
    assert landed and cancelled and not landed & cancelled and writes[1] in cancelled
    assert landed | cancelled == set(fx.GOOD)
    assert f"cluster: {len(landed)} record(s) written, 0 failed, {len(cancelled)} cancelled" in out
    assert not (tmp_path / "docs").exists(), "an interrupted run renders nothing"
    assert not [p for p in (tmp_path / "records").rglob("*") if p.name.endswith(".tmp")]


JOIN = """
import json, sys
sys.path.insert(0, sys.argv[2])
import lab_cluster_experiments as fx
from lab.measure import cluster, dispatch
outcome = dispatch.run_on_cluster(fx.GOOD, ["cluster-a", "cluster-b"], lambda slug, key: "forced",
    address=cluster.resolve_address(None), device="cpu", records_dir=sys.argv[1],
    provenance={"command": ["joined"], "git": {"commit": "c" * 40, "dirty": False}}, progress=False, say=print)
print(json.dumps({"written": len(outcome.written), "failed": len(outcome.failed)}))
"""


@on_ray
def test_a_driver_joins_a_running_cluster_at_ray_address_and_ships_this_checkout(tmp_path, ray_session):
    address = ray_session.get_runtime_context().gcs_address
    env = {**os.environ, "RAY_ADDRESS": address, "RAY_AUTH_MODE": "token",  # the fixture's Ray uses a token
           "PYTHONPATH": os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH")) if p)}
    done = subprocess.run([sys.executable, "-c", JOIN, str(tmp_path), str(FIXTURES)], capture_output=True,
                          text=True, timeout=300, env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"on the Ray cluster at {address}" in done.stdout
    assert json.loads(done.stdout.splitlines()[-1]) == {"written": 2, "failed": 0}
    for record in loaded(tmp_path):
        # the workers ran the code shipped to them (Ray's working directory), hashed there
        assert record.hashes == source_hashes(fx.EXPERIMENTS[record.experiment], REPO_ROOT)
        assert record.git == {"commit": "c" * 40, "dirty": False} and record.command == ("joined",)
        assert record.environment["worker"]["gpu_ids"] in (["0"], ["1"])


@on_ray
def test_a_cluster_that_uses_a_token_refuses_a_driver_without_it_and_says_so(ray_session, monkeypatch):
    monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    monkeypatch.delenv("RAY_AUTH_TOKEN", raising=False)
    with pytest.raises(ClusterError, match="refuses this driver's token: it uses token authentication; "
                                           "set RAY_AUTH_MODE=token"):
        probe(ray_session.get_runtime_context().gcs_address, timeout=2, handshake_timeout=30)


@needs_ray
def test_every_declared_experiment_travels_to_a_worker():
    """A cluster run sends each declaration to its worker through Ray's serialiser: a closure over an object it
    cannot serialise (torch's SDPBackend members are pybind11 objects) fails every task of that experiment."""
    from ray import cloudpickle

    from experiments import all_experiments

    for slug, experiment in all_experiments().items():
        back = cloudpickle.loads(cloudpickle.dumps(experiment))
        assert back.slug == slug and [p.name for p in back.profiles] == [p.name for p in experiment.profiles]
