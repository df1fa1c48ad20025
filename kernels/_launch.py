"""Launching a Triton kernel with little host time per call, and the buffers such launches share.

`kernel[grid](*args, **meta)` costs about 20 us of host time per call on an H100 host with Triton 3.6
(notes/host-overhead.md): it binds the arguments, derives their specialisation, looks the compiled kernel
up, builds launch metadata and asks the driver about every pointer. A caller that already knows which
compiled kernel it needs can skip all of that. `bind` compiles once (without launching) and returns a
launcher that takes only the arguments that change between calls:

    launch = bind(_my_kernel, (grid,), (x, y, n_cols, x.stride(0)), varying=2, BLOCK_N=1024, num_warps=4)
    launch(x, y)            # later calls: same specialisation, new tensors

A launcher is valid for new tensors only while the specialisation Triton would derive for them is the one
it was bound with: the same dtypes, and the same answer to "is data_ptr() a multiple of 16" (`aligned`).
Callers key their caches of launchers by those (and by everything in the fixed arguments), so a launcher is
never reused for tensors it does not fit.

On CUDA a bound launcher calls the compiled kernel's own launcher (`CompiledKernel.run` in Triton 3.6, or
the C function under it when no scratch memory is needed), on the stream current for the bound device, with
pointers passed as integers (so the driver is not asked about them). It falls back to `kernel[grid]` when
Triton's launch hooks are set (a profiler listening), when the current device is not the bound one, and
always under Triton's interpreter (TRITON_INTERPRET=1, the CPU path), where launchers simply replay
`kernel[grid](...)` with the fixed arguments.

`bind(..., cluster=C)` launches the programs in clusters of C consecutive programs (Hopper and later), which
the hardware schedules together and which may wait for each other at the cluster's barrier. Triton 3.6
compiles such kernels only for one CTA, so the kernel is compiled as usual and the compiled kernel's own
launcher is handed C as the packed metadata's CTA count: it sets the cluster dimension and multiplies grid x
by C. A clustered launch never falls back to `kernel[grid]` (that would launch without clusters); it passes
Triton's launch hooks on instead, and refuses the interpreter.

The raw and clustered routes call internals of Triton 3.6 (the compiled kernel's launcher and the C function
under it), which other releases rearrange. On any other Triton release (`RAW_LAUNCH` is False) `bind` hands
back the `kernel[grid]` launcher, which every release supports, and a launch in clusters is refused with the
reason (plans ask `clusters_supported()` before choosing one). The lab's records were measured on 3.6.

`stream_workspace` hands out buffers kept per (tag, device, stream) and never freed, for kernels that need
scratch space or counters: a kernel that leaves its counters zeroed (self-resetting) can then launch without
a memset per call.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

import torch
import triton
from triton import knobs
from triton.runtime import driver
from triton.runtime.jit import JITFunction

# Triton's own choice of stream and device (triton/backends/driver.py): the raw stream torch has current.
try:
    from torch._C import _cuda_getCurrentRawStream as _current_stream
except ImportError:  # a CPU-only build of torch
    _current_stream = None

# Triton 3.6 keeps its launch hooks as chains, empty unless a profiler (e.g. proton) adds to them or replaces
# them; Triton's launcher then calls them around every launch. Raw launches run only while they are idle.
_ENTER_HOOK, _EXIT_HOOK = knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook
_ENTER_CALLS, _EXIT_CALLS = getattr(_ENTER_HOOK, "calls", ()), getattr(_EXIT_HOOK, "calls", ())


# The Triton release whose launcher internals the raw and clustered routes were written against.
WRITTEN_FOR = (3, 6)


def triton_release(version: str) -> tuple[int, int]:
    """(major, minor) of a Triton version string ("3.6.0", "3.6.1+git1a2b", "3.9.0rc1"); (0, 0) if unreadable."""
    found = re.match(r"\s*(\d+)\.(\d+)", version or "")
    return (int(found.group(1)), int(found.group(2))) if found else (0, 0)


# Whether this process may launch through Triton 3.6's compiled launcher (else: kernel[grid] everywhere).
RAW_LAUNCH = triton_release(triton.__version__) == WRITTEN_FOR


def clusters_supported() -> bool:
    """Whether launches in clusters are possible with this Triton (they need the raw route)."""
    return RAW_LAUNCH


def launch_hooks_idle() -> bool:
    """Whether no launch hook is set: raw launches skip them, so they run only while this holds."""
    runtime = knobs.runtime
    return not (_ENTER_CALLS or _EXIT_CALLS or runtime.launch_enter_hook is not _ENTER_HOOK
                or runtime.launch_exit_hook is not _EXIT_HOOK)


# torch.cuda.current_device() minus its lazy-initialisation check (CUDA is up once a CUDA tensor exists).
_current_device = getattr(torch._C, "_cuda_getDevice", torch.cuda.current_device)


def aligned(t: torch.Tensor) -> bool:
    """Whether Triton specialises a pointer to `t` as 16-byte aligned (a launcher's cache key needs this)."""
    return t.data_ptr() % 16 == 0


def _trailing_values(kernel, args: Sequence, constexprs: dict) -> tuple:
    """The values of the parameters after the positional ones, in parameter order, as the launcher wants them."""
    values = []
    for param in kernel.params[len(args):]:
        name = param.name
        if name in constexprs:
            values.append(constexprs[name])
        elif param.has_default:
            values.append(param.default)
        else:
            raise TypeError(f"bind: {kernel.__name__} needs a value for {name}.")
    return tuple(values)


PORTABLE_CLUSTER = 8  # larger clusters (up to 16 on Hopper) must be allowed per kernel
MAX_CLUSTER = 16
_LARGE_CLUSTERS: set[tuple[int, int]] = set()  # (CUfunction, cluster size) allowed and found to fit


def bind(kernel, grid: Sequence[int], args: Sequence, *, varying: int, scalars: int = 0, cluster: int = 1,
         **meta) -> Callable[..., None]:
    """A launcher of `kernel` over `grid` that takes the first `varying` of `args` on each call.

    args: the kernel's leading parameters, positionally, as for `kernel[grid](*args, **meta)`; the first
    `varying` change between calls: tensors, then the last `scalars` of them plain ints (a parameter the
    kernel lists in `do_not_specialize`, so no value of it picks another compiled kernel); the rest are
    fixed. meta: constexprs by name and launch options (num_warps, ...). cluster: programs a cluster (grid x
    must be a multiple of it; 1: no clusters).
    The kernel is compiled here (without launching); the launcher's `.mode` says how it launches: "raw" (the
    compiled launcher's C function), "run" (CompiledKernel.run) or "jit" (kernel[grid], e.g. interpreter).
    """
    grid = tuple(grid) + (1,) * (3 - len(grid))
    fixed = tuple(args[varying:])
    tensors = args[:varying - scalars]
    if cluster != 1:
        return _cluster_launcher(kernel, grid, args, varying, scalars, cluster, meta)
    fallback = _jit_launcher(kernel, grid, fixed, meta)
    if not RAW_LAUNCH:  # another Triton release: its launcher internals are not the ones called below
        return fallback
    if not (isinstance(kernel, JITFunction) and tensors and all(isinstance(t, torch.Tensor) and t.is_cuda
                                                                   for t in tensors)):
        return fallback
    constexprs = {name: value for name, value in meta.items() if name in kernel.arg_names}
    # Fixed tensors travel as integers too; the launcher keeps them alive (`.fixed`).
    tail = tuple(a.data_ptr() if isinstance(a, torch.Tensor) else a for a in fixed)
    tail += _trailing_values(kernel, args, constexprs)
    device = tensors[0].device.index
    with torch.cuda.device(device):  # Triton compiles and loads for the current device
        compiled = kernel.warmup(*args, grid=grid, **meta)
        if hasattr(compiled, "result"):  # asynchronous compilation hands back a future
            compiled = compiled.result()
        if compiled is None:  # a jit_cache_hook took the compilation over: launch the ordinary way
            return fallback
        launch = _raw_launcher(compiled, grid, device, tail, fallback, varying - scalars)
    launch.fixed = fixed
    return launch


def launch_in_clusters(kernel, grid: Sequence[int], args: Sequence, cluster: int, **meta) -> None:
    """One launch of `kernel[grid](*args, **meta)` in clusters of `cluster` programs (see bind)."""
    tensors = next((i for i, a in enumerate(args) if not isinstance(a, torch.Tensor)), len(args))
    bind(kernel, grid, args, varying=tensors, cluster=cluster, **meta)(*args[:tensors])


def _cluster_launcher(kernel, grid: tuple, args: Sequence, varying: int, scalars: int, cluster: int,
                      meta: dict) -> Callable[..., None]:
    tensors = args[:varying - scalars]
    if not RAW_LAUNCH:
        raise RuntimeError(f"bind: launches in clusters call Triton {WRITTEN_FOR[0]}.{WRITTEN_FOR[1]}'s launcher "
                           f"internals; this is Triton {triton.__version__}. Plan without clusters "
                           "(kernels._launch.clusters_supported()).")
    if not 1 <= cluster <= MAX_CLUSTER or grid[0] % cluster or grid[1:] != (1, 1):
        raise ValueError(f"bind: clusters of 1-{MAX_CLUSTER} programs tile a 1-D grid; got {cluster} over {grid}.")
    if not (isinstance(kernel, JITFunction) and tensors and all(isinstance(t, torch.Tensor) and t.is_cuda
                                                                   for t in tensors)):
        raise ValueError("bind: a launch in clusters needs CUDA tensors and a compiled kernel, not Triton's "
                         "interpreter.")
    constexprs = {name: value for name, value in meta.items() if name in kernel.arg_names}
    tail = tuple(a.data_ptr() if isinstance(a, torch.Tensor) else a for a in args[varying:])
    tail += _trailing_values(kernel, args, constexprs)
    device = tensors[0].device.index
    with torch.cuda.device(device):
        compiled = kernel.warmup(*args, grid=grid, **meta)
        if hasattr(compiled, "result"):
            compiled = compiled.result()
        runner = compiled.run  # loads the binary, so compiled.function is set
        function, shared = compiled.function, compiled.metadata.shared
        if cluster > PORTABLE_CLUSTER and (function, cluster) not in _LARGE_CLUSTERS:
            # Allows the non-portable size on this function (Triton's launcher does it only for 16) and asks
            # the driver whether such a cluster fits at all.
            if driver.active.utils.cuOccupancyMaxActiveClusters(function, shared, cluster) < 1:
                raise ValueError(f"bind: clusters of {cluster} programs of {kernel.__name__} do not fit this GPU.")
            _LARGE_CLUSTERS.add((function, cluster))
    packed = (compiled.metadata.num_warps, cluster, shared)
    gx = grid[0] // cluster
    values = _pointers(varying - scalars)
    runtime = knobs.runtime

    def launch(*varying_args):
        if _current_device() != device:
            with torch.cuda.device(device):
                return launch(*varying_args)
        stream = _current_stream(device)
        kernel_args = (*values(varying_args), *tail)
        if launch_hooks_idle():
            runner(gx, 1, 1, stream, function, packed, None, None, None, *kernel_args)
        else:  # a profiler listening: what CompiledKernel's own launch passes it
            runner(gx, 1, 1, stream, function, packed, compiled.launch_metadata(grid, stream, *kernel_args),
                   runtime.launch_enter_hook, runtime.launch_exit_hook, *kernel_args)

    launch.mode = "cluster"
    launch.compiled = compiled
    launch.fixed = tuple(args[varying:])
    return launch


def _jit_launcher(kernel, grid: tuple, fixed: tuple, meta: dict) -> Callable[..., None]:
    """Replays `kernel[grid](*varying, *fixed, **meta)`, under the bound device when it is not current."""
    run = kernel[grid]

    def launch(*varying):
        device = varying[0].device if varying else None
        if device is not None and device.type == "cuda" and device.index != _current_device():
            with torch.cuda.device(device):
                run(*varying, *fixed, **meta)
        else:
            run(*varying, *fixed, **meta)

    launch.mode = "jit"
    return launch


def _pointers(n_tensors: int):
    """varying args -> the launcher's values: tensors' data pointers, then the scalars as they are."""
    data_ptr = torch.Tensor.data_ptr

    def values(varying):
        return (*map(data_ptr, varying[:n_tensors]), *varying[n_tensors:])

    return values


def _raw_launcher(compiled, grid: tuple, device: int, tail: tuple, fallback, n_tensors: int | None = None) -> Callable[..., None]:
    """n_tensors: how many leading varying args are tensors (the rest plain ints); None: all of them."""
    runner = compiled.run  # loads the binary on the current device and builds Triton's launcher
    function, packed = compiled.function, compiled.packed_metadata
    gx, gy, gz = grid
    runtime = knobs.runtime  # launch_hooks_idle(), inlined: while a hook is set, launches take kernel[grid]
    data_ptr = torch.Tensor.data_ptr
    scalars = _pointers(n_tensors)
    c_launch = getattr(runner, "launch", None)
    direct = (
        c_launch is not None
        and getattr(runner, "global_scratch_size", 1) == 0
        and getattr(runner, "profile_scratch_size", 1) == 0
        and hasattr(runner, "launch_cooperative_grid")
        and hasattr(runner, "launch_pdl")
    )
    if direct:
        # CudaLauncher.__call__ minus its scratch allocation (none needed): the arguments of the C function.
        cooperative, pdl = runner.launch_cooperative_grid, runner.launch_pdl

        def launch(*varying):
            if (_ENTER_CALLS or _EXIT_CALLS or runtime.launch_enter_hook is not _ENTER_HOOK
                    or runtime.launch_exit_hook is not _EXIT_HOOK or _current_device() != device):
                return fallback(*varying)
            c_launch(gx, gy, gz, _current_stream(device), function, cooperative, pdl, None, None, packed,
                     None, None, None, *(map(data_ptr, varying) if n_tensors is None or len(varying) == n_tensors else scalars(varying)),
                     *tail)

        launch.mode = "raw"
    else:

        def launch(*varying):
            if (_ENTER_CALLS or _EXIT_CALLS or runtime.launch_enter_hook is not _ENTER_HOOK
                    or runtime.launch_exit_hook is not _EXIT_HOOK or _current_device() != device):
                return fallback(*varying)
            runner(gx, gy, gz, _current_stream(device), function, packed, None, None, None,
                   *(map(data_ptr, varying) if n_tensors is None or len(varying) == n_tensors else scalars(varying)), *tail)

        launch.mode = "run"
    launch.compiled = compiled
    return launch


# --------------------------------------------------------------------------------------------------------
# Buffers per (tag, device, stream), never freed
# --------------------------------------------------------------------------------------------------------

_WORKSPACES: dict[tuple, object] = {}  # (tag, dtype, device, stream, numel) -> views of a buffer
_BUFFERS: dict[tuple, torch.Tensor] = {}  # (tag, dtype, device, stream) -> the largest buffer so far


def stream_workspace(tag: str, numel, dtype: torch.dtype, device: torch.device):
    """Zero-initialised memory owned by (tag, device, current stream): a tensor of `numel` elements, or for a
    tuple of sizes a tuple of tensors laid end to end.

    The same call on the same stream returns the same tensors, so launches that follow each other on a
    stream share them and launches on different streams never do. Buffers grow by powers of two and are
    never freed, so a kernel that counts in one must leave it as it found it: zeroed, if it is to start from
    zero next time. On the CPU the stream is 0. While a CUDA graph is being captured, prefer memory of the
    capture's own (torch.cuda.is_current_stream_capturing()): graphs captured on one stream and replayed on
    several at once would otherwise share these buffers.
    """
    stream = _current_stream(device.index) if device.type == "cuda" else 0
    key = (tag, dtype, device, stream, numel)
    views = _WORKSPACES.get(key)
    if views is None:
        sizes = numel if isinstance(numel, tuple) else (numel,)
        total = sum(sizes)
        base_key = key[:4]
        base = _BUFFERS.get(base_key)
        if base is None or base.numel() < total:
            base = _BUFFERS[base_key] = torch.zeros(1 << max(total - 1, 0).bit_length(), dtype=dtype, device=device)
        views = base[:total].split(sizes)
        views = _WORKSPACES[key] = views if isinstance(numel, tuple) else views[0]
    return views
