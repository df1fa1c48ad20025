"""What a run ran on: host, device, software versions, clocks, the git state and the command line.

`gpu_key` names a device model as a slug ("NVIDIA H100 80GB HBM3" -> "nvidia-h100-80gb-hbm3"): verdicts,
plots and page sections are kept per key. Runs on the CPU through Triton's interpreter all share the key
"cpu-interpreter" and are never performance evidence.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import re
import socket
import subprocess
import sys
from pathlib import Path

import torch

from lab.evidence.records import CPU_GPU_KEY

# Packages whose versions a reader needs to repeat a run; an absent one is simply left out.
PACKAGES = ("torch", "triton", "numpy", "liger-kernel", "gemlite", "quack-kernels", "nvidia-cutlass-dsl")
_SMI_FIELDS = {
    "driver_version": "driver",
    "clocks.sm": "sm_clock_mhz",
    "clocks.mem": "memory_clock_mhz",
    "clocks.max.sm": "max_sm_clock_mhz",
    "clocks.max.mem": "max_memory_clock_mhz",
    "power.limit": "power_limit_w",
    "temperature.gpu": "temperature_c",
    "persistence_mode": "persistence_mode",
}


def gpu_key(name: str) -> str:
    """A device model's name as a lower-case slug of letters, digits and dashes."""
    key = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")
    if not key:
        raise ValueError(f"cannot make a GPU key from the device name {name!r}")
    return key


def package_versions() -> dict[str, str]:
    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return versions


def nvidia_smi_query(*ids: str) -> dict[str, str]:
    """Driver, clocks, power limit and temperature now, of the first of `ids` (nvidia-smi --id values) that
    nvidia-smi answers for; {} when it is absent or answers for none."""
    for ident in ids:
        command = ["nvidia-smi", f"--id={ident}", f"--query-gpu={','.join(_SMI_FIELDS)}",
                   "--format=csv,noheader,nounits"]
        try:
            out = subprocess.run(command, capture_output=True, text=True, timeout=20, check=True).stdout
        except (OSError, subprocess.SubprocessError):
            continue
        values = [v.strip() for v in out.strip().splitlines()[0].split(",")] if out.strip() else []
        if len(values) == len(_SMI_FIELDS):
            pairs = zip(_SMI_FIELDS.values(), values, strict=True)
            return {name: value for name, value in pairs if value and "N/A" not in value}
    return {}


def capture_environment(device: str) -> dict:
    """The environment of a run on `device` ("cuda", "cuda:N" or "cpu"), as JSON-ready values."""
    packages = package_versions()
    env = {
        "host": socket.gethostname(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "packages": packages,
        "torch": torch.__version__,
        "triton": packages.get("triton"),
        "cuda": torch.version.cuda,
        "triton_interpreter": os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"),
    }
    if torch.device(device).type != "cuda":
        env.update(gpu_key=CPU_GPU_KEY, gpu_name="CPU (Triton interpreter)", device="cpu",
                   cpu=platform.processor() or platform.machine(), cpu_count=os.cpu_count())
        return env
    index = torch.device(device).index
    index = torch.cuda.current_device() if index is None else index
    props = torch.cuda.get_device_properties(index)
    env.update(
        gpu_key=gpu_key(props.name),
        gpu_name=props.name,
        device=f"cuda:{index}",
        sm_count=props.multi_processor_count,
        memory_bytes=props.total_memory,
        l2_cache_bytes=getattr(props, "L2_cache_size", None),
        compute_capability=f"{props.major}.{props.minor}",
        # CUDA's device order can differ from nvidia-smi's (CUDA_VISIBLE_DEVICES): ask by UUID first.
        nvidia_smi=nvidia_smi_query(*([f"GPU-{props.uuid}"] if getattr(props, "uuid", None) else []), str(index)),
    )
    return env


def git_state(root: Path) -> dict:
    """The commit checked out in `root` and whether tracked or new files differ from it.

    records/ and docs/ are left out of the dirty check: they hold what runs and renders produce, not what
    is measured. $KERNEL_LAB_SOURCE_COMMIT, when set, names the commit instead, with `dirty` unknown
    (None): a copy of the tree shipped to a GPU machine may sit outside any checkout, or on top of an older
    one whose HEAD would be the wrong answer. The source hashes in every record pin what was measured
    either way.
    """
    declared = os.environ.get("KERNEL_LAB_SOURCE_COMMIT")
    if declared:
        return {"commit": declared, "dirty": None}

    def git(*args: str) -> str | None:
        try:
            return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, timeout=30,
                                  check=True).stdout
        except (OSError, subprocess.SubprocessError):
            return None

    commit = git("rev-parse", "HEAD")
    if commit is None:
        return {"commit": None, "dirty": None}
    status = git("status", "--porcelain", "--", ".", ":(exclude)records", ":(exclude)docs")
    return {"commit": commit.strip(), "dirty": None if status is None else bool(status.strip())}


def command_line(root: Path) -> list[str]:
    """The command that started this process, with the script path made relative to `root` when inside it."""
    argv = list(sys.argv) or [""]
    try:
        script = Path(argv[0]).resolve()
        if script.is_relative_to(Path(root).resolve()):
            argv[0] = script.relative_to(Path(root).resolve()).as_posix()
    except (OSError, ValueError):
        pass
    return argv

