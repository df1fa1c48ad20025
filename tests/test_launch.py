"""kernels._launch: bound launchers and per-stream workspaces.

On the CPU the raw route is checked against a stand-in for Triton 3.6's compiled kernel (its `run`, the
CudaLauncher, and the C function under it): the arguments must arrive in the order Triton's own
JITFunction.run passes them. On a GPU the real launchers are compared with kernel[grid].
"""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl
from triton.runtime.jit import JITFunction

from kernels import _launch

needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="raw launches need a CUDA device")


def _scale_rows(x_ptr, y_ptr, n_cols, x_row_stride, scale, BLOCK_N: tl.constexpr, FLAG: tl.constexpr = 0):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    x = tl.load(x_ptr + row * x_row_stride + cols, mask=cols < n_cols)
    tl.store(y_ptr + row * n_cols + cols, x * scale, mask=cols < n_cols)


_scale_rows_kernel = triton.jit(_scale_rows)  # an InterpretedFunction under TRITON_INTERPRET=1


def test_trailing_values_follow_parameter_order_with_defaults():
    kernel = JITFunction(_scale_rows)  # a JITFunction needs no GPU until it compiles
    assert _launch._trailing_values(kernel, (0, 0, 7, 8, 2.0), {"BLOCK_N": 16}) == (16, 0)
    assert _launch._trailing_values(kernel, (0, 0, 7, 8, 2.0), {"BLOCK_N": 16, "FLAG": 1}) == (16, 1)
    assert _launch._trailing_values(kernel, (0, 0, 7, 8, 2.0, 32), {}) == (0,)
    with pytest.raises(TypeError, match="needs a value for BLOCK_N"):
        _launch._trailing_values(kernel, (0, 0, 7, 8, 2.0), {})


class _FakeCudaLauncher:
    """Triton 3.6's CudaLauncher as the raw route sees it: the C function and the attributes it reads."""

    def __init__(self, scratch: int = 0):
        self.calls, self.run_calls = [], []
        self.global_scratch_size, self.profile_scratch_size = scratch, 0
        self.launch_cooperative_grid, self.launch_pdl = False, True
        self.launch = lambda *args: self.calls.append(args)

    def __call__(self, *args):
        self.run_calls.append(args)


class _FakeCompiled:
    def __init__(self, scratch: int = 0):
        self.run = _FakeCudaLauncher(scratch)
        self.function, self.packed_metadata = 0xF00, (4, 1, 0)


@pytest.fixture
def fake_device(monkeypatch):
    monkeypatch.setattr(_launch, "_current_stream", lambda device: 1000 + device)
    monkeypatch.setattr(_launch, "_current_device", lambda: 0)


def test_raw_route_passes_the_c_launcher_its_arguments_in_order(fake_device):
    compiled, fallback_calls = _FakeCompiled(), []
    x, y = torch.zeros(4, 8), torch.zeros(4, 8)
    launch = _launch._raw_launcher(compiled, (4, 1, 1), 0, (8, 8, 2.0, 16, 0), lambda *a: fallback_calls.append(a))
    assert launch.mode == "raw"
    launch(x, y)
    assert compiled.run.calls == [(4, 1, 1, 1000, 0xF00, False, True, None, None, (4, 1, 0), None, None, None,
                                   x.data_ptr(), y.data_ptr(), 8, 8, 2.0, 16, 0)]
    assert fallback_calls == [] and compiled.run.run_calls == []


def test_raw_route_passes_varying_scalars_as_they_are(fake_device):
    compiled = _FakeCompiled()
    x = torch.zeros(4, 8)
    launch = _launch._raw_launcher(compiled, (4, 1, 1), 0, (8,), lambda *a: None, n_tensors=1)
    launch(x, 1234)
    launch(x, 7)  # a plain int, never a pointer: each call's value goes through
    tails = [call[13:] for call in compiled.run.calls]
    assert tails == [(x.data_ptr(), 1234, 8), (x.data_ptr(), 7, 8)]


def test_raw_route_with_scratch_memory_goes_through_compiled_run(fake_device):
    compiled = _FakeCompiled(scratch=128)
    x = torch.zeros(3)
    launch = _launch._raw_launcher(compiled, (2, 3, 1), 0, (5,), lambda *a: None)
    assert launch.mode == "run"
    launch(x)
    # CompiledKernel.run(grid_0, grid_1, grid_2, stream, function, packed_metadata, launch_metadata,
    # enter_hook, exit_hook, *args), as JITFunction.run calls it.
    assert compiled.run.run_calls == [(2, 3, 1, 1000, 0xF00, (4, 1, 0), None, None, None, x.data_ptr(), 5)]


def test_raw_route_yields_to_launch_hooks_and_other_devices(fake_device, monkeypatch):
    compiled, fallback_calls = _FakeCompiled(), []
    x = torch.zeros(3)
    launch = _launch._raw_launcher(compiled, (1, 1, 1), 0, (), lambda *a: fallback_calls.append(a))
    assert _launch.launch_hooks_idle()
    hook = lambda metadata: None  # noqa: E731
    triton.knobs.runtime.launch_enter_hook.add(hook)  # how a profiler listens
    try:
        assert not _launch.launch_hooks_idle()
        launch(x)
    finally:
        triton.knobs.runtime.launch_enter_hook.remove(hook)
    monkeypatch.setattr(triton.knobs.runtime, "launch_exit_hook", hook)  # or replaces a chain
    assert not _launch.launch_hooks_idle()
    launch(x)
    monkeypatch.setattr(triton.knobs.runtime, "launch_exit_hook", _launch._EXIT_HOOK)
    monkeypatch.setattr(_launch, "_current_device", lambda: 1)
    launch(x)
    assert len(fallback_calls) == 3 and compiled.run.calls == []
    monkeypatch.setattr(_launch, "_current_device", lambda: 0)
    launch(x)
    assert len(compiled.run.calls) == 1


def test_bind_replays_the_kernel_under_the_interpreter(device):
    if torch.cuda.is_available():
        pytest.skip("checks the interpreter route; the GPU route is test_raw_launch_matches_kernel_grid")
    x = torch.randn(3, 20)
    y = torch.full((3, 10), float("nan"))
    launch = _launch.bind(_scale_rows_kernel, (3,), (x, y, 10, x.stride(0), 2.0), varying=2, BLOCK_N=16)
    assert launch.mode == "jit"
    launch(x, y)
    torch.testing.assert_close(y, 2.0 * x[:, :10])
    x2, y2 = torch.randn(3, 20), torch.empty(3, 10)
    launch(x2, y2)  # new tensors, the same fixed arguments
    torch.testing.assert_close(y2, 2.0 * x2[:, :10])


def test_stream_workspace_is_kept_per_tag_and_grows_without_freeing():
    _launch._WORKSPACES.clear()
    _launch._BUFFERS.clear()
    cpu = torch.device("cpu")
    a = _launch.stream_workspace("test-a", 5, torch.int32, cpu)
    assert a.shape == (5,) and a.dtype == torch.int32 and (a == 0).all()
    assert _launch.stream_workspace("test-a", 5, torch.int32, cpu) is a
    assert _launch.stream_workspace("test-b", 5, torch.int32, cpu).data_ptr() != a.data_ptr()
    small = _launch.stream_workspace("test-a", 3, torch.int32, cpu)
    assert small.data_ptr() == a.data_ptr()  # a prefix of the same buffer
    big = _launch.stream_workspace("test-a", 100, torch.int32, cpu)
    assert big.numel() == 100 and (big == 0).all() and big.data_ptr() != a.data_ptr()
    assert _launch.stream_workspace("test-a", 5, torch.int32, cpu) is a  # still alive, still handed out
    first, second = _launch.stream_workspace("test-c", (3, 4), torch.float32, cpu)
    assert (first.numel(), second.numel()) == (3, 4) and second.data_ptr() == first.data_ptr() + 3 * 4


@needs_gpu
def test_raw_launch_matches_kernel_grid():
    x = torch.randn(6, 40, device="cuda")[:, 1:31]  # 4 bytes past a 16-byte boundary: not `aligned`
    y = torch.empty(6, 30, device="cuda")
    assert not _launch.aligned(x) and _launch.aligned(y)
    launch = _launch.bind(_scale_rows_kernel, (6,), (x, y, 30, x.stride(0), 0.5), varying=2, BLOCK_N=32)
    assert launch.mode == "raw"
    for _ in range(3):
        x2 = torch.randn(6, 40, device="cuda")[:, 1:31]
        y.fill_(float("nan"))
        launch(x2, y)
        torch.testing.assert_close(y, 0.5 * x2)


@needs_gpu
def test_raw_launch_is_captured_by_a_cuda_graph():
    x = torch.randn(4, 16, device="cuda")
    y = torch.empty(4, 16, device="cuda")
    launch = _launch.bind(_scale_rows_kernel, (4,), (x, y, 16, 16, 3.0), varying=2, BLOCK_N=16)
    launch(x, y)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        launch(x, y)
    for _ in range(3):
        x.copy_(torch.randn(4, 16, device="cuda"))
        graph.replay()
        torch.cuda.synchronize()
        torch.testing.assert_close(y, 3.0 * x)


# --------------------------------------------------------------------------------------------------------
# Another Triton release: kernel[grid] everywhere, no clusters
# --------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("version, release", [("3.6.0", (3, 6)), ("3.6.1+git1a2b3c", (3, 6)), ("3.9.0rc1", (3, 9)),
                                              ("4.0", (4, 0)), ("", (0, 0)), ("nightly", (0, 0))])
def test_triton_release_reads_major_and_minor(version, release):
    assert _launch.triton_release(version) == release


def test_the_installed_release_decides_the_raw_route():
    assert _launch.RAW_LAUNCH == (_launch.triton_release(triton.__version__) == _launch.WRITTEN_FOR)


def test_another_release_binds_the_portable_launcher(monkeypatch):
    monkeypatch.setattr(_launch, "RAW_LAUNCH", False)
    x = torch.randn(3, 8)
    y = torch.empty_like(x)
    launch = _launch.bind(_scale_rows_kernel, (3,), (x, y, 8, x.stride(0), 2.0), varying=2, BLOCK_N=8)
    assert launch.mode == "jit"
    if not torch.cuda.is_available():
        launch(x, y)
        torch.testing.assert_close(y, 2 * x)


def test_another_release_refuses_clusters_and_plans_without_them(monkeypatch):
    from kernels import softmax_plan

    monkeypatch.setattr(_launch, "RAW_LAUNCH", False)
    assert not _launch.clusters_supported()
    assert not softmax_plan.device_clusters()
    x = torch.randn(4, 8)
    with pytest.raises(RuntimeError, match="launches in clusters call Triton 3.6"):
        _launch.bind(_scale_rows_kernel, (4,), (x, x, 8, 8, 1.0), varying=2, cluster=2, BLOCK_N=8)
