#!/usr/bin/env python3
"""Build a small offline wheelhouse of Ray for a machine without network (build_results.py --cluster).

    python tools/ray_wheelhouse.py                      # Python 3.12, manylinux x86_64, into .whl/ray/
    python tools/ray_wheelhouse.py --python 3.11 --out DIR

Downloads (here, where there is network) the Ray version that requirements/cpu.lock pins and its
dependencies as wheels, then rewrites Ray's wheel without what a cluster run never loads: the Java jars,
the dashboard's web client and the libraries on top of Ray Core (RLlib, Tune, Train, Serve, Data, LLM).
That takes the wheel from about 80 MB to about 40 MB. On the target machine:

    python -m pip install --no-index --find-links .whl/ray ray==<pin>   # installs only what is missing

The rewritten wheel's RECORD lists exactly the files it keeps, so pip installs it like any other.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Parts of Ray's wheel that neither the driver nor a worker of a cluster run imports or starts.
PRUNED = ("ray/jars/", "ray/dashboard/client/build/", "ray/rllib/", "ray/tune/", "ray/train/", "ray/serve/",
          "ray/data/", "ray/llm/")


def pinned_ray() -> str:
    text = (ROOT / "requirements" / "cpu.lock").read_text(encoding="utf-8")
    found = re.search(r"^ray==(\S+)$", text, re.M)
    if not found:
        raise SystemExit("ray_wheelhouse: requirements/cpu.lock pins no ray==VERSION")
    return found.group(1)


def prune(wheel: Path, out: Path) -> tuple[int, int]:
    """Copy `wheel` to `out` without the PRUNED paths (their RECORD lines too); (files kept, dropped)."""
    kept = dropped = 0
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as dst:
        for info in src.infolist():
            if info.filename.startswith(PRUNED):
                dropped += 1
                continue
            data = src.read(info)
            if info.filename.endswith(".dist-info/RECORD"):
                lines = data.decode().splitlines(keepends=True)
                data = "".join(line for line in lines if not line.startswith(PRUNED)).encode()
            dst.writestr(info, data)
            kept += 1
    return kept, dropped


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python", default="3.12", help="the target machine's Python (default 3.12)")
    parser.add_argument("--out", type=Path, default=ROOT / ".whl" / "ray", help="where the wheels go")
    args = parser.parse_args()
    version = pinned_ray()
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        platforms = [f"--platform={p}" for p in ("manylinux2014_x86_64", "manylinux_2_17_x86_64",
                                                   "manylinux_2_28_x86_64")]
        subprocess.run([sys.executable, "-m", "pip", "download", f"ray=={version}", "--only-binary=:all:",
                        f"--python-version={args.python}", *platforms, "--dest", tmp, "--quiet"], check=True)
        for wheel in sorted(Path(tmp).glob("*.whl")):
            target = args.out / wheel.name
            if wheel.name.startswith("ray-"):
                kept, dropped = prune(wheel, target)
                print(f"{wheel.name}: kept {kept} files, dropped {dropped} "
                      f"({wheel.stat().st_size / 2**20:.1f} -> {target.stat().st_size / 2**20:.1f} MiB)")
            else:
                target.write_bytes(wheel.read_bytes())
    total = sum(p.stat().st_size for p in args.out.glob("*.whl"))
    print(f"{args.out}: {len(list(args.out.glob('*.whl')))} wheels, {total / 2**20:.1f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
