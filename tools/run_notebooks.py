"""Execute the site's notebooks (docs/notebooks/*.ipynb) and save their outputs in place.

    python tools/run_notebooks.py                       on a CUDA machine: run every notebook, save outputs
    python tools/run_notebooks.py docs/notebooks/x.ipynb   only the named notebooks
    python tools/run_notebooks.py --allow-cpu --check   run through Triton's interpreter, save nothing

The published outputs must come from a GPU: without CUDA this refuses to save (a CPU run's timings measure
the interpreter). Saved outputs are stamped with the hash of the code cells that made them
(lab.publish.jupyter); `mkdocs build` never executes notebooks, shows what this script saved, and marks a
notebook whose outputs are missing or were made by other code.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from lab.publish.jupyter import stamp  # noqa: E402
NOTEBOOK_DIR = ROOT / "docs" / "notebooks"
GPU_MARKER = "device: cuda"  # printed by every notebook's first code cell on a GPU
CPU_MARKER = "cpu-interpreter"  # printed instead when the kernels run through the interpreter


def notebooks() -> list[Path]:
    return sorted(NOTEBOOK_DIR.glob("*.ipynb"))


def execute(path: Path, *, timeout: int = 600, env: dict[str, str] | None = None):
    """Run every cell of the notebook at `path` in a fresh kernel started in the repository root.

    Returns the executed notebook (nbformat); raises nbclient's CellExecutionError on the first failing cell.
    """
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(path, as_version=4)
    saved = os.environ.copy()
    try:
        if env:
            os.environ.update(env)  # the kernel process inherits this environment
        NotebookClient(nb, timeout=timeout, kernel_name="python3",
                       resources={"metadata": {"path": str(ROOT)}}).execute()
    finally:
        os.environ.clear()
        os.environ.update(saved)
    return nb


def output_text(nb) -> str:
    """Everything the notebook's code cells printed, as one string."""
    parts = []
    for cell in nb.cells:
        for out in cell.get("outputs", []) if cell.cell_type == "code" else []:
            if out.get("output_type") == "stream":
                parts.append(out.get("text", ""))
            elif "data" in out:
                parts.append(str(out["data"].get("text/plain", "")))
            elif out.get("output_type") == "error":
                parts.append("\n".join(out.get("traceback", [])))
    return "".join(parts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("paths", nargs="*", type=Path, help="notebooks to run (default: every one)")
    parser.add_argument("--allow-cpu", action="store_true", help="run through Triton's interpreter without CUDA")
    parser.add_argument("--check", action="store_true", help="execute only; leave the saved notebooks untouched")
    parser.add_argument("--timeout", type=int, default=600, help="seconds allowed per cell (default 600)")
    args = parser.parse_args(argv)

    import torch

    has_cuda = torch.cuda.is_available()
    if not has_cuda and not args.allow_cpu:
        print("run_notebooks: CUDA is not available. The saved outputs must come from a GPU run; use "
              "--allow-cpu --check to execute through Triton's interpreter without saving.", file=sys.stderr)
        return 2
    if not has_cuda and not args.check:
        print("run_notebooks: refusing to save outputs made without a GPU; add --check", file=sys.stderr)
        return 2
    paths = args.paths or notebooks()
    if not paths:
        print(f"run_notebooks: no notebooks in {NOTEBOOK_DIR.relative_to(ROOT)}", file=sys.stderr)
        return 2
    env = None if has_cuda else {"TRITON_INTERPRET": "1"}

    import nbformat
    from nbclient.exceptions import CellExecutionError

    for path in paths:
        try:
            nb = execute(path, timeout=args.timeout, env=env)
        except CellExecutionError as exc:
            print(f"run_notebooks: {path} failed:\n{exc}", file=sys.stderr)
            return 1
        if args.check:
            print(f"run_notebooks: {path}: ran")
            continue
        if GPU_MARKER not in output_text(nb):
            print(f"run_notebooks: {path} never printed {GPU_MARKER!r}; not saving it", file=sys.stderr)
            return 1
        stamp(nb, torch.cuda.get_device_name(0), time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
        nbformat.write(nb, path)
        print(f"run_notebooks: {path}: outputs saved")
    return 0


if __name__ == "__main__":
    sys.exit(main())
