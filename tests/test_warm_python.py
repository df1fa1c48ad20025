"""tests/warm_python.py runs `python ARGS` as a fresh Python would: arguments, working directory, exactly the
environment given, standard streams, exit status, and nothing left over from an earlier command."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from warm_python import run_python

ENV = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}


def test_code_arguments_folder_environment_and_streams_are_the_commands_own(tmp_path):
    code = ("import json, os, sys\n"
            "print(json.dumps({'argv': sys.argv, 'cwd': os.getcwd(), 'path0': sys.path[0], "
            "'mark': os.environ.get('WARM_MARK'), 'interpret': os.environ.get('TRITON_INTERPRET')}))\n"
            "print('to stderr', file=sys.stderr)\n"
            "sys.exit(7)")
    proc = run_python(["-c", code, "a b", "c"], env={**ENV, "WARM_MARK": "x"}, cwd=tmp_path, timeout=300)
    import json

    assert proc.returncode == 7 and proc.stderr.strip().endswith("to stderr")
    assert json.loads(proc.stdout) == {"argv": ["-c", "a b", "c"], "cwd": str(tmp_path.resolve()), "path0": "",
                                       "mark": "x", "interpret": None}
    assert run_python(["-c", "import os; print(os.environ.get('WARM_MARK'))"], env=ENV, cwd=tmp_path,
                      timeout=300).stdout == "None\n", "no environment is kept from the command before"


def test_scripts_and_modules_run_as_main(tmp_path):
    script = tmp_path / "script.py"
    script.write_text("import sys\nprint(__name__, sys.argv[1:], sys.path[0])\nraise SystemExit('failed')\n",
                      encoding="utf-8")
    proc = run_python([str(script), "x"], env=ENV, cwd=tmp_path, timeout=300)
    assert proc.stdout == f"__main__ ['x'] {tmp_path}\n" and proc.returncode == 1 and "failed" in proc.stderr
    (tmp_path / "warm_module_probe.py").write_text("import sys\nprint(__name__, sys.argv[1:])\n", encoding="utf-8")
    proc = run_python(["-m", "warm_module_probe", "y"], env=ENV, cwd=tmp_path, timeout=300)
    assert (proc.returncode, proc.stdout) == (0, "__main__ ['y']\n")


def test_what_a_command_changes_is_gone_for_the_next(tmp_path):
    run_python(["-c", "import torch, sys; torch.warm_mark = 1; sys.modules['warm_left'] = 1"], env=ENV, cwd=tmp_path,
               timeout=300, check=True)
    proc = run_python(["-c", "import torch, sys; print(hasattr(torch, 'warm_mark'), 'warm_left' in sys.modules)"],
                      env=ENV, cwd=tmp_path, timeout=300)
    assert proc.stdout == "False False\n"


def test_an_error_is_a_status_and_a_traceback_a_hang_a_timeout(tmp_path):
    proc = run_python(["-c", "raise ValueError('boom')"], env=ENV, cwd=tmp_path, timeout=300)
    assert proc.returncode == 1 and "ValueError: boom" in proc.stderr
    with pytest.raises(subprocess.CalledProcessError):
        run_python(["-c", "raise SystemExit(2)"], env=ENV, cwd=tmp_path, timeout=300, check=True)
    with pytest.raises(subprocess.TimeoutExpired):
        run_python(["-c", "import time; time.sleep(60)"], env=ENV, cwd=tmp_path, timeout=2)
    assert run_python(["-c", "print('next')"], env=ENV, cwd=tmp_path, timeout=300).stdout == "next\n"
    with pytest.raises(ValueError, match="interpreter"):
        run_python(["-c", "pass"], env={**ENV, "TRITON_INTERPRET": "1"}, cwd=tmp_path, timeout=300)


def test_it_runs_the_python_the_tests_run():
    proc = run_python(["-c", "import sys; print(sys.executable, sys.version)"], env=ENV, cwd=os.getcwd(), timeout=300)
    assert proc.stdout == f"{sys.executable} {sys.version}\n"
