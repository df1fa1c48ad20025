"""The driver's side of a cluster run (lab.measure.cluster): hand each task to an idle worker of its GPU
model, write each record that comes back, and keep going through failures.

Ray does the placing (which GPU each worker holds) and the transport; this loop only decides which idle
worker gets which queued task, and what a failure costs:

* the run raised in a live worker: that task fails, the worker takes the next one;
* the worker died (its process killed, out of memory, its GPU or host lost): that task fails, and one
  replacement is asked for, which joins the model it says it holds when it starts: Ray puts it on
  whichever GPU is free then, not always the one its predecessor freed (two workers that die together
  may see their replacements swap GPUs), so a starting replacement counts for no model in particular;
* a model whose workers are all gone, with no replacement starting that might hold it: its queued tasks
  fail, named;
* a record that does not validate or would overwrite another: that task fails, nothing is replaced;
* Ctrl-C: records that already came back are written, the rest is cancelled (its workers killed) and
  named; the KeyboardInterrupt ends here, and Outcome.interrupted says so.
"""

from __future__ import annotations

import json
import time
from collections import deque
from pathlib import Path
from typing import Any, Callable, Mapping

from tqdm.auto import tqdm

from experiments.spec import Experiment
from lab.evidence.records import RunRecord
from lab.evidence.store import write_record
from lab.measure import cluster
from lab.measure.cluster import Outcome, Task, Worker, first_line, remote_worker

POLL_SECONDS = 0.5  # how often the loop looks up from waiting (Ctrl-C is seen at the latest then)


class Dispatch:
    def __init__(self, experiments: Mapping[str, Experiment], workers: list[Worker], *, ray, records_dir: Path,
                 provenance: Mapping[str, Any], profiling, device: str, worker_class: type,
                 say: Callable[[str], None], startup_seconds: float) -> None:
        self.experiments, self.ray, self.records_dir = experiments, ray, Path(records_dir)
        self.provenance, self.profiling, self.device = dict(provenance), profiling, device
        self.worker_class, self.say, self.startup_seconds = worker_class, say, startup_seconds
        self.idle: dict[str, deque[Worker]] = {}
        for worker in workers:
            self.idle.setdefault(worker.key, deque()).append(worker)
        self.queued: dict[str, deque[Task]] = {key: deque() for key in self.idle}
        self.running: dict[Any, tuple[Task, Worker]] = {}  # object ref -> the task and the worker running it
        # identity ref -> (handle, the model of the worker it replaces, asked at); the model it holds is
        # known only once it starts
        self.starting: dict[Any, tuple[Any, str, float]] = {}
        self.replacements: list[Worker] = []
        self.outcome = Outcome()
        self.bar = None

    # ----------------------------------------------------------------------------------------------------

    def run(self, tasks: list[Task], progress: bool = True) -> Outcome:
        pairs = set()
        for task in tasks:  # each (experiment, model) pair once, however often it was asked for
            if (task.slug, task.gpu_key) not in pairs:
                pairs.add((task.slug, task.gpu_key))
                self.queued.setdefault(task.gpu_key, deque()).append(task)
                self.idle.setdefault(task.gpu_key, deque())  # a model no worker holds: failed as orphans
        with tqdm(total=len(pairs), desc="cluster", unit="experiment", disable=not progress) as self.bar:
            try:
                self._loop()
            except KeyboardInterrupt:
                self._cancel()
        return self.outcome

    def _loop(self) -> None:
        while True:
            self._hand_out()
            self._fail_orphans()
            if not self.running and not any(self.queued.values()):
                break
            ready, _ = self.ray.wait([*self.running, *self.starting], num_returns=1, timeout=POLL_SECONDS)
            for ref in ready:
                if ref in self.running:
                    self._landed(ref)
                else:
                    self._started(ref)
            self._expire_starting()
        for handle, _, _ in self.starting.values():
            self.ray.kill(handle)  # a replacement with nothing left to do
        self.starting.clear()

    def _hand_out(self) -> None:
        for key, queue in self.queued.items():
            while queue and self.idle[key]:
                task, worker = queue.popleft(), self.idle[key].popleft()
                ref = worker.handle.run.remote(self.experiments[task.slug], self.provenance, self.profiling)
                self.running[ref] = (task, worker)
                self.say(f"{task}: running on {worker} ({task.why})")
        self._show()

    def _fail_orphans(self) -> None:
        """Fail the queued tasks of a model that has no worker left and none coming. While a replacement
        is starting, none is failed: it may hold any model, whatever the model of the worker it replaces."""
        if self.starting:
            return
        busy = {worker.key for _, worker in self.running.values()}
        for key, queue in self.queued.items():
            if queue and not self.idle[key] and key not in busy:
                while queue:
                    self._fail(queue.popleft(), f"no worker holding a {key} is left")

    # ----------------------------------------------------------------------------------------------------

    def _landed(self, ref) -> None:
        task, worker = self.running.pop(ref)
        try:
            self._settle(task, worker, ref)
        except KeyboardInterrupt:  # mid-way: the task counts as cancelled unless it got as far as an outcome
            if task not in {t for t, _ in (*self.outcome.written, *self.outcome.failed)}:
                self.outcome.cancelled.append(task)
            raise

    def _settle(self, task: Task, worker: Worker, ref) -> None:
        errors = self.ray.exceptions
        try:
            text = self.ray.get(ref)
        except errors.RayTaskError as exc:  # the run raised; the worker lives on
            self._fail(task, f"the run failed on {worker}: {first_line(exc)}")
            self.idle[worker.key].append(worker)
            return
        except errors.RayError as exc:  # the worker is gone (killed, out of memory, lost GPU or host)
            self._fail(task, f"the worker on {worker} died: {first_line(exc)}")
            # The replacement may land on another model's GPU, freed too: any task still queued may need it.
            self._replace(worker, needed=any(self.queued.values()))
            return
        try:
            path = write_record(RunRecord.from_dict(json.loads(text)), self.records_dir)
        except (ValueError, OSError) as exc:  # a record that does not validate, or one that exists already
            self._fail(task, f"its record was not written: {type(exc).__name__}: {exc}")
        else:
            self.outcome.written.append((task, path))
            self._show(finished=1)
            self.say(f"{task}: wrote {path} (on {worker})")
        self.idle[worker.key].append(worker)

    def _replace(self, dead: Worker, needed: bool) -> None:
        try:
            self.ray.kill(dead.handle)
        except Exception:  # noqa: BLE001 - already gone
            pass
        if not needed:
            return
        handle = remote_worker(self.worker_class, self.ray).remote(self.device)
        self.starting[handle.identity.remote()] = (handle, dead.key, time.monotonic())
        self.say(f"cluster: asked for a worker to replace the one on {dead}")

    def _started(self, ref) -> None:
        handle, key, _ = self.starting.pop(ref)
        try:
            worker = Worker(handle, self.ray.get(ref))
        except self.ray.exceptions.RayError as exc:
            self.say(f"cluster: the replacement for a {key} worker did not start: {first_line(exc)}")
            return
        self.replacements.append(worker)
        if not self.queued.get(worker.key):  # no task of its model is left (or the run never had one)
            self.say(f"cluster: the replacement on {worker} holds {worker.key}, for which nothing is left to run")
            self.ray.kill(handle)
            return
        self.idle[worker.key].append(worker)
        self.say(f"cluster: a replacement worker on {worker} joined ({worker.key})")

    def _expire_starting(self) -> None:
        now = time.monotonic()
        for ref, (handle, key, asked) in list(self.starting.items()):
            if now - asked > self.startup_seconds:
                del self.starting[ref]
                self.ray.kill(handle)
                self.say(f"cluster: the replacement for a {key} worker did not start "
                         f"within {self.startup_seconds:g} s")

    # ----------------------------------------------------------------------------------------------------

    def _cancel(self) -> None:
        """Ctrl-C: keep what came back, cancel the rest."""
        self.outcome.interrupted = True
        if self.running:
            ready, _ = self.ray.wait(list(self.running), num_returns=len(self.running), timeout=0)
            for ref in ready:
                task, worker = self.running.pop(ref)
                try:
                    path = write_record(RunRecord.from_dict(json.loads(self.ray.get(ref))), self.records_dir)
                except Exception as exc:  # noqa: BLE001 - a failure now is that task's alone
                    self.outcome.failed.append((task, first_line(exc)))
                else:
                    self.outcome.written.append((task, path))
        for task, worker in self.running.values():
            self.outcome.cancelled.append(task)
            self.ray.kill(worker.handle)
        self.running.clear()
        for queue in self.queued.values():
            self.outcome.cancelled.extend(queue)
            queue.clear()
        for handle, _, _ in self.starting.values():
            self.ray.kill(handle)
        self.starting.clear()

    def _fail(self, task: Task, why: str) -> None:
        self.outcome.failed.append((task, why))
        self._show(finished=1)
        self.say(f"{task}: FAILED: {why}")

    def _show(self, finished: int = 0) -> None:
        """The bar: experiments finished (done or failed) of all, with done / running / failed after it."""
        if self.bar is not None:
            done, failed = len(self.outcome.written), len(self.outcome.failed)
            self.bar.set_postfix_str(f"{done} done, {len(self.running)} running, {failed} failed", refresh=False)
            self.bar.update(finished) if finished else self.bar.refresh()


def run_on_cluster(experiments: Mapping[str, Experiment], slugs: Sequence[str],
                   why: Callable[[str, str], str | None], *, address: str | None, device: str, records_dir: Path,
                   provenance: Mapping[str, Any], profiling=None, progress: bool = True,
                   say: Callable[[str], None] = tqdm.write, worker_class: type = cluster.GpuWorker,
                   startup_seconds: float = cluster.STARTUP_SECONDS,
                   expected: Callable[[Task], float | None] | None = None) -> Outcome:
    """Connect (or start Ray), start one worker per free GPU, plan each (experiment, model) pair that `why`
    gives a reason for, run them all, and stop the workers. With `expected` (a task's likely duration in
    seconds, None if unknown) the tasks are handed out longest first. Raises ClusterError when no worker
    starts."""
    ray = cluster.import_ray()
    connection = cluster.connect(address)
    workers: list[Worker] = []
    try:
        free, total = cluster.free_gpus(ray)
        if free < 1:
            raise cluster.ClusterError(f"{connection.where} has no free GPU ({total} in all)")
        say(f"cluster: starting {free} worker(s) on {connection.where}, one per free GPU")
        workers, problems = cluster.start_workers(free, device, worker_class, startup_seconds)
        for problem in problems:
            say(f"cluster: {problem}")
        if not workers:
            raise cluster.ClusterError(f"no worker started on {connection.where}")
        for worker in workers:
            say(f"cluster: worker on {worker} holds {worker.identity['gpu_name']} ({worker.key})")
        keys = list(dict.fromkeys(w.key for w in workers))
        tasks = cluster.plan_tasks(slugs, keys, why)
        if expected is not None:
            seconds = {task: expected(task) for task in tasks}
            tasks = cluster.longest_first(tasks, seconds.get)
            say("cluster: longest first, by each experiment's last recorded duration: " + ", ".join(
                f"{t} ({'new' if seconds[t] is None else f'{seconds[t]:.0f} s'})" for t in tasks))
        dispatch = Dispatch(experiments, workers, ray=ray, records_dir=records_dir, provenance=provenance,
                            profiling=profiling, device=device, worker_class=worker_class, say=say,
                            startup_seconds=startup_seconds)
        try:
            return dispatch.run(tasks, progress=progress)
        finally:
            workers.extend(dispatch.replacements)
    finally:
        cluster.stop_workers(workers)
        connection.close()
