"""`python ARGS` for the tests, run by a child forked from a Python that has already imported torch, Triton,
the kernels and MkDocs, instead of a Python that imports them all again.

Compiling a kernel for a GPU target outside the interpreter (labtools.run_compiled) and building a site
(`python -m mkdocs build`) each began with about five seconds of imports on a 2-core machine, over half of
their time. Each pytest worker starts one warm Python on its first request, outside Triton's interpreter,
from the repository root; every request is a fork of it, so it starts where a fresh `python` would be once
those imports were done: its own process, environment, working directory, arguments, standard streams and
exit status, and nothing left behind by an earlier request. What the fork cannot give is what those imports
read from the environment when the warm Python made them: it is started without TRITON_INTERPRET (the
commands it runs are the ones that must not be interpreted) and with NO_MKDOCS_2_WARNING=1, as every
request sets.

A request runs `-c CODE ARGS...`, `-m MODULE ARGS...` or `SCRIPT ARGS...` as python would (sys.argv,
sys.path[0], `__main__`); KERNEL_LAB_WARM_PYTHON=off runs each in a fresh `python` instead.
"""

from __future__ import annotations

import atexit
import json
import os
import queue
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# What the warm Python imports before it forks: what the commands above import first.
PRELOAD = (
    "torch", "triton", "triton.compiler", "triton.backends.compiler", "kernels", "experiments", "lab.publish.figures",
    "lab.publish.collect", "lab.evidence.hashing", "click", "mkdocs.commands.build", "material",
    "material.plugins.search.plugin", "material.plugins.blog.plugin", "mkdocs_jupyter.plugin", "markdown",
    "pymdownx.superfences", "pymdownx.highlight", "pymdownx.arithmatex", "pymdownx.snippets",
)

# The warm Python: imports PRELOAD, then for each request (a line of JSON) forks a child that runs it and
# answers its exit status (a line of JSON). Forks only while it runs no thread of its own.
SERVER = r'''
import importlib, json, os, sys
for name in json.loads(sys.argv[1]):
    try:
        importlib.import_module(name)
    except Exception:  # a module this environment lacks is imported by the request itself, if it needs it
        pass
requests, answers = sys.stdin, sys.stdout
while True:
    line = requests.readline()
    if not line:
        break
    request = json.loads(line)
    pid = os.fork()
    if pid == 0:
        import io, runpy, traceback
        os.setpgid(0, 0)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(os.open(request["stdout"], os.O_WRONLY), 1)
        os.dup2(os.open(request["stderr"], os.O_WRONLY), 2)
        sys.stdin = io.TextIOWrapper(io.FileIO(0, "r", closefd=False))
        sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), encoding="utf-8", line_buffering=True)
        sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), encoding="utf-8", line_buffering=True)
        sys.__stdout__, sys.__stderr__, sys.__stdin__ = sys.stdout, sys.stderr, sys.stdin
        os.environ.clear()
        os.environ.update(request["env"])
        os.chdir(request["cwd"])
        importlib.invalidate_caches()
        args = request["args"]
        code = 0
        try:
            if args[0] == "-c":
                sys.argv, sys.path[0] = ["-c", *args[2:]], ""
                main = type(sys)("__main__")
                sys.modules["__main__"] = main
                exec(compile(args[1], "<string>", "exec"), main.__dict__)
            elif args[0] == "-m":
                sys.argv, sys.path[0] = [args[1], *args[2:]], os.getcwd()
                runpy.run_module(args[1], run_name="__main__", alter_sys=True)
            else:
                sys.argv, sys.path[0] = list(args), os.path.dirname(os.path.abspath(args[0]))
                runpy.run_path(args[0], run_name="__main__")
        except SystemExit as exc:
            if exc.code is None:
                code = 0
            elif isinstance(exc.code, int):
                code = exc.code
            else:
                print(exc.code, file=sys.stderr)
                code = 1
        except BaseException:
            traceback.print_exc()
            code = 1
        try:
            import atexit
            atexit._run_exitfuncs()
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)
    answers.write(json.dumps({"pid": pid}) + "\n")
    answers.flush()
    _, status = os.waitpid(pid, 0)
    answers.write(json.dumps({"returncode": os.waitstatus_to_exitcode(status)}) + "\n")
    answers.flush()
'''

_server: subprocess.Popen | None = None
_lock = threading.Lock()


def _warm() -> subprocess.Popen:
    global _server
    if _server is None or _server.poll() is not None:
        env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
        env["NO_MKDOCS_2_WARNING"] = "1"
        _server = subprocess.Popen([sys.executable, "-c", SERVER, json.dumps(PRELOAD)], cwd=ROOT, env=env,
                                   stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        _server.lines = queue.Queue()  # its answers, one line each, read as they come ("" once it stopped)
        threading.Thread(target=_read_lines, args=(_server,), daemon=True).start()
        atexit.register(_stop, _server)
    return _server


def _read_lines(server: subprocess.Popen) -> None:
    for line in server.stdout:
        server.lines.put(line)
    server.lines.put("")


def _stop(server: subprocess.Popen) -> None:
    if server.poll() is None:
        server.stdin.close()
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()


def run_python(args: list[str], *, env: dict[str, str], cwd: Path | str, timeout: float,
               check: bool = False) -> subprocess.CompletedProcess:
    """`python *args` in `cwd` with exactly `env` (which must not ask for Triton's interpreter), its output
    captured as text, like subprocess.run(..., capture_output=True, text=True); TimeoutExpired past `timeout`
    seconds, CalledProcessError on a non-zero status when `check`."""
    if env.get("TRITON_INTERPRET"):
        raise ValueError("the warm Python runs outside Triton's interpreter")
    if os.environ.get("KERNEL_LAB_WARM_PYTHON", "").strip().lower() in ("off", "0", "no", "false"):
        return subprocess.run([sys.executable, *args], env=env, cwd=cwd, capture_output=True, text=True,
                              timeout=timeout, check=check)
    with tempfile.TemporaryDirectory(prefix="warm-python-") as folder:
        out, err = Path(folder) / "stdout", Path(folder) / "stderr"
        out.touch()
        err.touch()
        request = {"args": [str(a) for a in args], "env": dict(env), "cwd": str(Path(cwd).resolve()),
                   "stdout": str(out), "stderr": str(err)}
        with _lock:
            server = _warm()
            server.stdin.write(json.dumps(request) + "\n")
            server.stdin.flush()
            answer = _answer(server, timeout, args)
        proc = subprocess.CompletedProcess([sys.executable, *args], answer["returncode"],
                                           out.read_text(encoding="utf-8", errors="replace"),
                                           err.read_text(encoding="utf-8", errors="replace"))
    if check:
        proc.check_returncode()
    return proc


def _answer(server: subprocess.Popen, timeout: float, args) -> dict:
    """The warm Python's answer to the request just sent. Past `timeout` the child running it is stopped with
    everything it started (it runs in a process group of its own) and TimeoutExpired is raised; the warm
    Python stays for the next request."""
    child = _line(server, 60)
    if child is None:
        _restart(server)
        raise RuntimeError("the warm Python did not start the request")
    answer = _line(server, timeout)
    if answer is None:
        try:
            os.killpg(child["pid"], 9)
        except OSError:
            pass
        if _line(server, 60) is None:
            _restart(server)
        raise subprocess.TimeoutExpired([sys.executable, *args], timeout)
    return answer


def _line(server: subprocess.Popen, timeout: float) -> dict | None:
    """The warm Python's next line of JSON, or None if none came within `timeout` seconds or it stopped."""
    try:
        line = server.lines.get(timeout=timeout)
    except queue.Empty:
        return None
    return json.loads(line) if line else None


def _restart(server: subprocess.Popen) -> None:
    """Stop a warm Python that no longer answers; the next request starts another."""
    server.kill()
    server.wait()
