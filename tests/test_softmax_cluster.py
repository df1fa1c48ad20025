"""Split-row backward rows whose slices are one cluster of the launch (SoftmaxPlan.cluster): the plan rule on
both sides of each threshold, the kernel compiled for Hopper without a GPU (the partials stored before the
cluster barrier and read after it), the launcher's refusals, and on a GPU the results against float64 through
every way a backward is launched (an explicit plan, autograd, a captured CUDA graph, torch.compile)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from kernels import reference
from kernels._launch import MAX_CLUSTER, bind, launch_in_clusters
from kernels.softmax import plan_softmax, softmax, softmax_bwd, softmax_fwd
from kernels.softmax_plan import device_clusters
from labtools import run_compiled

TWO_BYTE = (torch.bfloat16, torch.float16)


@pytest.mark.parametrize("dtype", TWO_BYTE, ids=str)
@pytest.mark.parametrize("n,block_n,splits", [(32769, 4096, 9), (36864, 4096, 9), (36865, 8192, 5),
                                              (100000, 8192, 13), (131072, 8192, 16)])
def test_two_byte_backward_split_rows_run_as_clusters(dtype, n, block_n, splits):
    plan = plan_softmax(64, n, dtype, "auto", True, "backward", clusters=True)
    assert (plan.impl, plan.cluster, plan.block_n, plan.splits, plan.grid) == ("split_row", True, block_n, splits,
                                                                                  64 * splits)


@pytest.mark.parametrize("n,dtype,direction,clusters", [
    (131073, torch.bfloat16, "backward", True),  # 17 slices: more than a cluster holds
    (65536, torch.float32, "backward", True),  # fp32 keeps its tickets
    (65536, torch.bfloat16, "forward", True),  # and so does the forward
    (65536, torch.bfloat16, "backward", False),  # a launcher without clusters
    (65536, torch.bfloat16, "backward", None),  # no GPU with clusters here: device_clusters() is False
])
def test_other_split_rows_keep_their_tickets(n, dtype, direction, clusters):
    if clusters is None and device_clusters():
        pytest.skip("this device launches clusters")
    plan = plan_softmax(16, n, dtype, "auto", True, direction, clusters=clusters)
    assert plan.impl == "split_row" and not plan.cluster and plan.block_n == 8192


def test_interpreter_plans_no_clusters(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert not device_clusters()


_COMPILE_FOR_HOPPER = """
import sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
sys.path.insert(0, sys.argv[1])
from kernels.softmax_split_row_kernels import _softmax_bwd_split_row_kernel as kernel
signature = {"y_ptr": "*bf16", "dy_ptr": "*bf16", "dx_ptr": "*bf16", "part_dot_ptr": "*fp32", "sync_ptr": "*i32",
             "n_cols": "i32", "n_splits": "i32", "y_row_stride": "i32", "dy_row_stride": "i32", "dx_row_stride": "i32"}
constexprs = {"BLOCK_N": 4096, "SPLITS_POW2": 16, "EDGES": True, "VEC": 8, "CLUSTER": sys.argv[2] == "1"}
src = ASTSource(fn=kernel, signature={**signature, **dict.fromkeys(constexprs, "constexpr")}, constexprs=constexprs)
print(triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4}).asm["ptx"])
"""


def _hopper_ptx(cluster: bool, tmp_path) -> str:
    return run_compiled(["-c", _COMPILE_FOR_HOPPER, str(Path(__file__).resolve().parents[1]), str(int(cluster))],
                        tmp_path)


def test_clustered_backward_meets_at_the_barrier_after_storing_its_partial(tmp_path):
    """Compiled for sm_90 outside the interpreter: no ticket or counter atomics, the partial dot stored
    before the cluster barrier, the row's partials loaded after it past L1."""
    ptx = _hopper_ptx(True, tmp_path)
    arrive = ptx.index("barrier.cluster.arrive")
    assert ptx.index("barrier.cluster.wait") > arrive
    assert "atom." not in ptx
    assert "st.global.b32" in ptx[:arrive]
    assert "ld.global.cg" in ptx[arrive:] and "ld.global.cg" not in ptx[:arrive]


def test_ticketed_backward_has_no_cluster_barrier(tmp_path):
    ptx = _hopper_ptx(False, tmp_path)
    assert "barrier.cluster" not in ptx and "atom." in ptx


def test_cluster_launches_refuse_what_they_cannot_run():
    from kernels.softmax_split_row_kernels import _softmax_bwd_split_row_kernel as kernel

    t = torch.zeros(4)
    with pytest.raises(ValueError, match="clusters of 1-16 programs tile a 1-D grid"):
        bind(kernel, (10,), (t,), varying=1, cluster=4)
    with pytest.raises(ValueError, match="clusters of 1-16"):
        bind(kernel, (34,), (t,), varying=1, cluster=MAX_CLUSTER + 1)
    with pytest.raises(ValueError, match="needs CUDA tensors and a compiled kernel"):
        launch_in_clusters(kernel, (8,), (t,), 4)


# ---------------------------------------------------------------------------------------------------------
# GPU: results against float64
# ---------------------------------------------------------------------------------------------------------

needs_clusters = pytest.mark.skipif(not device_clusters(), reason="needs a CUDA GPU of compute capability 9.0+")
BOUND = {torch.bfloat16: 2e-2, torch.float16: 4e-3}


def _inputs(m, n, dtype, seed, dy_stride=None):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    x = (torch.randn(m, n, device="cuda", generator=gen) * 3).to(dtype)
    y = torch.softmax(x.float(), -1).to(dtype)
    dy_full = torch.randn(m, dy_stride or n, device="cuda", generator=gen).to(dtype)
    return x, y, dy_full[:, :n]


def _rel_err(got, want):
    return ((got.double() - want).abs().max() / want.abs().max().clamp_min(1e-30)).item()


@needs_clusters
@pytest.mark.parametrize("dtype", TWO_BYTE, ids=str)
@pytest.mark.parametrize("n", [32769, 36481, 65536, 75029, 131072])
@pytest.mark.parametrize("dy_stride", [None, 131089])
def test_clustered_backward_matches_float64(dtype, n, dy_stride):
    m = 9
    _, y, dy = _inputs(m, n, dtype, n, dy_stride)
    plan = plan_softmax(m, n, dtype, "auto", True, "backward")
    assert plan.cluster
    dx = softmax_bwd(y, dy, plan, out=torch.full_like(y, float("nan")))
    assert not torch.isnan(dx).any()
    assert _rel_err(dx, reference.softmax_backward(y.double(), dy.double())) <= BOUND[dtype]
    ticketed = softmax_bwd(y, dy, plan_softmax(m, n, dtype, "auto", True, "backward", clusters=False))
    assert _rel_err(dx, ticketed.double()) <= BOUND[dtype]


@needs_clusters
@pytest.mark.parametrize("n", [36481, 100000])
def test_clustered_backward_through_autograd_graphs_and_compile(n):
    m, dtype = 5, torch.bfloat16
    x, _, dy = _inputs(m, n, dtype, n + 1)
    x64 = x.double().requires_grad_()
    torch.softmax(x64, -1).backward(dy.double())
    want = x64.grad

    leaf = x.clone().requires_grad_()
    softmax(leaf).backward(dy)
    assert not torch.isnan(leaf.grad).any() and _rel_err(leaf.grad, want) <= BOUND[dtype]

    y = softmax_fwd(x, plan_softmax(m, n, dtype, "auto", True))
    plan = plan_softmax(m, n, dtype, "auto", True, "backward")
    out = torch.full_like(y, float("nan"))
    softmax_bwd(y, dy, plan, out=out)  # compiled before capture
    graph = torch.cuda.CUDAGraph()
    out.fill_(float("nan"))
    with torch.cuda.graph(graph):
        softmax_bwd(y, dy, plan, out=out)
    graph.replay()
    torch.cuda.synchronize()
    assert not torch.isnan(out).any() and _rel_err(out, reference.softmax_backward(y.double(), dy.double())) <= BOUND[dtype]

    def loss(t):
        return (softmax(t) * dy).sum()

    leaf = x.clone().requires_grad_()
    torch.compile(loss, fullgraph=True)(leaf).backward()
    assert not torch.isnan(leaf.grad).any() and _rel_err(leaf.grad, want) <= BOUND[dtype]
