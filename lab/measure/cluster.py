"""Experiments spread over many GPUs with Ray: one worker per GPU, one experiment per worker at a time.

Ray starts embedded on this machine (one worker per local GPU) or joins a running cluster at an address
(HOST:PORT, or $RAY_ADDRESS) with the same code. Each worker is a Ray actor that asks for one whole GPU
(num_gpus=1): Ray gives it a device of its own (CUDA_VISIBLE_DEVICES), and the actor runs its calls one after
another, so no two experiments ever share a GPU while they are timed. Inside the worker the runner
(lab.measure.runner) measures exactly as it does alone, the copy ceiling included, on the worker's own GPU.

The driver asks every worker which GPU model it holds (lab.measure.environment.gpu_key) and plans each
(experiment, model) pair once, for workers of that model only: a run never mixes models. A worker hands its
record back as JSON, unwritten, with its placement (scheduler, node, GPU ids) added to the environment block
next to the host; the driver alone writes records (lab.evidence.store: atomically, never over another).
Records from several hosts of one model are distinct runs, like any two runs.

Faults stay small. An experiment that raises fails alone, and its worker takes the next one. A worker that
dies (a lost GPU, out of memory, a killed process) fails only the experiment it was running; a replacement
is asked for, and the others go on. Ray places it on whichever GPU is free when it starts, which need not be
the one its predecessor freed: it runs the experiments of the model it turns out to hold. Ctrl-C cancels
what is queued or running and keeps every record that landed. The failures and cancellations are named at
the end (Outcome).

Ray is an optional extra (pip install -e '.[cluster]'): this module imports without it and says so when a
cluster run is asked for. Addresses are probed before Ray is asked to join, because ray.init waits minutes
on an address where nothing answers.
"""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

from experiments.spec import Experiment
from lab import REPO_ROOT
from lab.evidence.records import run_seconds
from lab.measure.environment import capture_environment
from lab.measure.runner import run_experiment
from lab.measure.timing import describe_exception

EXTRA = "pip install -e '.[cluster]'"
PROBE_SECONDS = 5.0  # how long an address may take to accept a connection
HANDSHAKE_SECONDS = 20.0  # how long a driver may take to join there (a second or two when Ray answers)
REFUSED_TOKEN = "InvalidAuthToken"  # what Ray's client logs when a cluster refuses its token
HANDSHAKE = ("import sys, ray; ray.init(address=sys.argv[1], logging_level='ERROR', log_to_driver=False); "
             "ray.shutdown()")
SETTLE_SECONDS = 10.0  # how long GPUs being given back may take to show as free
STARTUP_SECONDS = 300.0  # how long a worker may take to start and say what it holds (torch and CUDA load)
# What the workers of a remote cluster never need from this checkout: run outputs, the site, environments.
SHIPPING_EXCLUDES = ["records/", "docs/", "site/", "notes/", ".git/", ".venv/", ".whl/", ".cache/", "__pycache__/",
                     "*.pyc"]


class ClusterError(RuntimeError):
    """The cluster cannot be used as asked; the message says why and what would help."""


def import_ray():
    try:
        import ray
    except ImportError as exc:
        raise ClusterError(f"a cluster run needs Ray, which does not import here ({exc}); "
                           f"install the extra: {EXTRA}") from exc
    return ray


# --------------------------------------------------------------------------------------------------------
# Where Ray runs: embedded on this machine, or a cluster at an address
# --------------------------------------------------------------------------------------------------------


def looks_like_address(text: str) -> bool:
    """Whether `text` names a cluster (HOST:PORT, ray://HOST[:PORT], auto, local) rather than an experiment."""
    return ":" in text or text in ("auto", "local")


def resolve_address(given: str | None) -> str | None:
    """The cluster to join: `given`, else $RAY_ADDRESS, else None: start Ray embedded on this machine."""
    address = (given or os.environ.get("RAY_ADDRESS") or "").strip()
    return None if address in ("", "local") else address


def split_address(address: str) -> tuple[str, int]:
    """(host, port) of "HOST:PORT", "[IPv6]:PORT" or "ray://HOST[:PORT]" (Ray Client, port 10001 by default)."""
    rest = address.removeprefix("ray://")
    default = 10001 if rest != address else None
    if rest.startswith("["):
        host, _, port = rest[1:].partition("]")
        port = port.removeprefix(":")
    elif rest.count(":") == 1:
        host, port = rest.split(":")
    elif ":" not in rest:
        host, port = rest, ""
    else:
        host, port = "", ""
    if port == "" and default is not None:
        return host, default
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ClusterError(f"cluster address {address!r}: expected HOST:PORT (the head node's GCS port, 6379 "
                           f"unless `ray start --head --port` said otherwise), ray://HOST[:PORT] or auto")
    return host, int(port)


def probe(address: str, timeout: float = PROBE_SECONDS, handshake_timeout: float = HANDSHAKE_SECONDS) -> None:
    """Refuse an address where no Ray cluster answers: nothing accepts a connection within `timeout`
    seconds, or Ray's own handshake (a driver that connects and leaves, in a child process) does not
    complete within `handshake_timeout` seconds."""
    advice = "start one there with `ray start --head`, or leave the address out to run Ray on this machine"
    if address != "auto":  # for auto, Ray itself finds $RAY_ADDRESS or a cluster started here, or fails at once
        host, port = split_address(address)
        try:
            socket.create_connection((host, port), timeout=timeout).close()
        except OSError as exc:
            raise ClusterError(f"no Ray cluster answers at {address} ({host}:{port}: "
                               f"{exc.strerror or exc or 'no answer'} within {timeout:g} s); {advice}") from exc
    joined, finished, said = handshake(address, handshake_timeout)
    if REFUSED_TOKEN in said:
        raise ClusterError(f"the Ray cluster at {address} refuses this driver's token: it uses token "
                           f"authentication; set RAY_AUTH_MODE=token, and RAY_AUTH_TOKEN to the cluster's token "
                           f"unless Ray's token file here holds it")
    if not finished:
        raise ClusterError(f"no Ray cluster answers at {address}: a connection is accepted there, but Ray's "
                           f"handshake did not complete within {handshake_timeout:g} s; {advice}")
    if not joined:
        lines = [line for line in said.splitlines() if line.strip()]
        raise ClusterError(f"Ray could not join the cluster at {address}: {lines[-1] if lines else 'no reason given'}")


def handshake(address: str, timeout: float) -> tuple[bool, bool, str]:
    """A driver that joins `address` and leaves, in a child process: (joined, finished within `timeout`, what
    it wrote to stderr). Stops it as soon as it reports a refused token (Ray would retry for 20 s)."""
    child = subprocess.Popen([sys.executable, "-c", HANDSHAKE, address], stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, text=True, errors="replace")
    lines: list[str] = []

    def read() -> None:
        for line in child.stderr:
            lines.append(line)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    deadline = time.monotonic() + timeout
    while child.poll() is None and time.monotonic() < deadline and not any(REFUSED_TOKEN in x for x in lines):
        time.sleep(0.1)
    finished = child.poll() is not None
    if not finished:
        child.kill()
        child.wait()
    reader.join(timeout=5)
    return finished and child.returncode == 0, finished, "".join(lines)


@dataclass
class Connection:
    """This process's link to Ray; `owned` when this process made it (and ends it with close)."""

    where: str
    owned: bool

    def close(self) -> None:
        if self.owned:
            import_ray().shutdown()


def connect(address: str | None, **embedded: Any) -> Connection:
    """Join the cluster at `address`, or start Ray embedded on this machine when it is None; `embedded`
    goes to ray.init for an embedded start (tests declare fake GPUs: num_gpus=2). A process already
    connected to Ray keeps that connection."""
    ray = import_ray()
    if address is not None:
        probe(address)
    if ray.is_initialized():
        return Connection("the Ray instance this process is connected to", owned=False)
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    quiet = {"logging_level": logging.WARNING}
    if address is None:
        # The workers share this checkout: they import the lab from it whatever the driver's directory.
        path = os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH")) if p)
        ray.init(address="local", include_dashboard=False, runtime_env={"env_vars": {"PYTHONPATH": path}},
                 **quiet, **embedded)
        return Connection("Ray embedded on this machine", owned=True)
    # The hosts of a cluster get this checkout's code (not its records or site) as their working directory.
    ray.init(address=address, runtime_env={"working_dir": str(REPO_ROOT), "excludes": SHIPPING_EXCLUDES}, **quiet)
    return Connection(f"the Ray cluster at {address}", owned=True)


# --------------------------------------------------------------------------------------------------------
# A worker: one process, one GPU, one experiment at a time
# --------------------------------------------------------------------------------------------------------


class GpuWorker:
    """Holds one whole GPU (Ray's num_gpus=1) for its lifetime; runs one experiment per call and returns the
    record's JSON unwritten."""

    def __init__(self, device: str = "cuda") -> None:
        self.device = device
        self.environment = capture_environment(device)  # the model held, fixed for the worker's life

    def placement(self) -> dict:
        """Where Ray put this worker: scheduler and version, node, and the GPU ids it was given."""
        import ray

        return {"scheduler": "ray", "version": ray.__version__, "node_id": ray.get_runtime_context().get_node_id(),
                "gpu_ids": [str(i) for i in ray.get_gpu_ids()]}

    def identity(self) -> dict:
        """What the driver plans with: host, the GPU model (key and name) and the placement."""
        env = self.environment
        return {"host": env["host"], "gpu_key": env["gpu_key"], "gpu_name": env["gpu_name"], **self.placement()}

    def run(self, experiment: Experiment, provenance: Mapping[str, Any], profiling=None) -> str:
        """Run `experiment` here; its record's JSON, with the driver's command and git state (`provenance`)."""
        record, _ = run_experiment(experiment, device=self.device, records_dir=None, progress=False,
                                   profiling=profiling, say=print)
        if record.gpu_key != self.environment["gpu_key"]:
            raise RuntimeError(f"this worker started on {self.environment['gpu_key']} but ran on {record.gpu_key}")
        environment = {**record.environment, "worker": self.placement()}
        return replace(record, environment=environment, command=tuple(provenance["command"]),
                       git=dict(provenance["git"])).to_json()


@dataclass
class Worker:
    """The driver's view of a started worker."""

    handle: Any
    identity: dict

    @property
    def key(self) -> str:
        return self.identity["gpu_key"]

    def __str__(self) -> str:
        gpus = ", ".join(self.identity.get("gpu_ids") or ()) or "?"
        return f"{self.identity['host']} GPU {gpus}"


def remote_worker(worker_class: type = GpuWorker, ray=None):
    """`worker_class` as a Ray actor holding one GPU; Ray never restarts it (the driver asks for another)."""
    return (ray or import_ray()).remote(num_gpus=1, num_cpus=1, max_restarts=0, max_task_retries=0)(worker_class)


def start_workers(count: int, device: str, worker_class: type = GpuWorker,
                  timeout: float = STARTUP_SECONDS) -> tuple[list[Worker], list[str]]:
    """`count` workers, each on a GPU of its own, and a line for each that did not start within `timeout`."""
    ray = import_ray()
    actor = remote_worker(worker_class)
    handles = [actor.remote(device) for _ in range(count)]
    asked = {handle.identity.remote(): handle for handle in handles}
    ready, late = ray.wait(list(asked), num_returns=len(asked), timeout=timeout)
    workers, problems = [], []
    for ref in ready:
        try:
            workers.append(Worker(asked[ref], ray.get(ref)))
        except ray.exceptions.RayError as exc:
            problems.append(f"a worker did not start: {first_line(exc)}")
    for ref in late:
        ray.kill(asked[ref])
        problems.append(f"a worker did not start within {timeout:g} s")
    return sorted(workers, key=lambda w: (w.identity["host"], w.identity.get("gpu_ids") or [])), problems


def free_gpus(ray, settle_seconds: float = SETTLE_SECONDS) -> tuple[int, int]:
    """The free and the total GPUs of the cluster, once the ones being given back are free (Ray releases a
    stopped worker's GPU a moment after it stops), or after `settle_seconds` (some are busy elsewhere)."""
    deadline = time.monotonic() + settle_seconds
    while True:
        total, free = (int(r().get("GPU", 0)) for r in (ray.cluster_resources, ray.available_resources))
        if free >= total or time.monotonic() > deadline:
            return free, total
        time.sleep(0.2)


def stop_workers(workers: Iterable[Worker]) -> None:
    ray = import_ray()
    for worker in workers:
        try:
            ray.kill(worker.handle)
        except Exception:  # noqa: BLE001 - already gone
            pass


def first_line(exc: BaseException) -> str:
    cause = getattr(exc, "cause", None)  # a RayTaskError carries the exception the worker raised
    if isinstance(cause, BaseException):
        return describe_exception(cause, 400)
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return f"{type(exc).__name__}: {lines[0] if lines else ''}"[:400]


# --------------------------------------------------------------------------------------------------------
# The plan and the outcome
# --------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Task:
    """One experiment on one GPU model, and why it runs ("forced", "stale", ...)."""

    slug: str
    gpu_key: str
    why: str

    def __str__(self) -> str:
        return f"{self.slug} on {self.gpu_key}"


def plan_tasks(slugs: Sequence[str], keys: Sequence[str], why: Callable[[str, str], str | None]) -> list[Task]:
    """One task per (experiment, model) pair that `why` gives a reason to run (None: leave it), each pair
    once however often a slug or key is given, in the order given."""
    tasks = {}
    for slug in slugs:
        for key in keys:
            if (slug, key) not in tasks and (reason := why(slug, key)) is not None:
                tasks[slug, key] = Task(slug, key, reason)
    return list(tasks.values())


def last_duration(runs: Sequence, gpu_key: str, points: int | None = None) -> float | None:
    """Seconds the newest of `runs` (newest first) on `gpu_key` took, else the newest on any GPU; None
    without a run. With `points` (how many the experiment declares now) the time is scaled by points now
    over points then, for a declaration that grew since. A cluster hands out the longest experiments first
    by it."""
    for run in [r for r in runs if r.gpu_key == gpu_key] or list(runs):
        seconds = run_seconds(run.started_utc, run.finished_utc)
        if seconds is None:
            continue
        return seconds * points / len(run.points) if points and run.points else seconds
    return None


def longest_first(tasks: Sequence[Task], expected: Callable[[Task], float | None]) -> list[Task]:
    """`tasks` in the order that keeps a cluster's last worker from starting a long experiment late: those whose
    duration is unknown first (a new experiment may be the longest), then the rest by `expected` seconds,
    longest first; ties and unknowns keep the order given."""
    known = {task: expected(task) for task in tasks}
    unknown = [t for t in tasks if known[t] is None]
    timed = sorted((t for t in tasks if known[t] is not None), key=lambda t: -known[t])
    return unknown + timed


@dataclass
class Outcome:
    """What a cluster run did: records written, tasks failed (and why), tasks cancelled by Ctrl-C."""

    written: list[tuple[Task, Path]] = field(default_factory=list)
    failed: list[tuple[Task, str]] = field(default_factory=list)
    cancelled: list[Task] = field(default_factory=list)
    interrupted: bool = False
