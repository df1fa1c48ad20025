"""The host side of kernels.softmax: routes planned and bound once per input layout, checks that still refuse
bad input once a layout is known, autograd through routes, torch.compile, and (on a GPU) raw launches,
split-row counters that reset themselves, and CUDA graphs.

Correctness is judged as in tests/test_softmax.py: against float64, with the same bounds.
"""

from __future__ import annotations

import importlib

import pytest
import torch

from accuracy import rel_err
from kernels import reference
from kernels.softmax import softmax

softmax_module = importlib.import_module("kernels.softmax")
needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

#               rtol    atol    grad (norm-wise): as tests/test_softmax.py, which explains them
BOUNDS = {torch.float32: (2e-5, 1e-12, 2e-5), torch.bfloat16: (1.6e-2, 1e-12, 3e-2)}


def _draw(shape, device, gen, dtype=torch.float32, scale=3.0):
    return (torch.randn(shape, generator=gen, dtype=torch.float64) * scale).to(dtype).to(device)


def _assert_matches_float64(y, x, dim=-1):
    rtol, atol, _ = BOUNDS[x.dtype]
    ref = reference.softmax_float64(x.detach(), dim)
    assert y.shape == x.shape and y.dtype == x.dtype and not torch.isnan(y).any()
    assert ((y.double() - ref).abs() <= atol + rtol * ref.abs()).all()


def _assert_grad_matches_float64(grad, x, dy, dim=-1):
    x64 = x.detach().double().requires_grad_()
    torch.softmax(x64, dim).backward(dy.double())
    assert grad.shape == x.shape and rel_err(grad, x64.grad) <= BOUNDS[x.dtype][2]


@pytest.fixture
def fresh_routes(monkeypatch):
    """An empty route cache, and a list that grows by one plan per route built."""
    monkeypatch.setattr(softmax_module, "_ROUTES", {})
    built = []
    real = softmax_module._new_route

    def counting(x, dim, impl):
        route = real(x, dim, impl)
        built.append(route.plan)
        return route

    monkeypatch.setattr(softmax_module, "_new_route", counting)
    return built


# ---------------------------------------------------------------------------------------------------------
# Routes: one per layout, never a stale one
# ---------------------------------------------------------------------------------------------------------


def test_a_layout_is_planned_once(fresh_routes, device, gen):
    for _ in range(3):
        x = _draw((3, 200), device, gen)
        _assert_matches_float64(softmax(x), x)
    assert len(fresh_routes) == 1


def test_new_shapes_strides_and_alignments_get_their_own_routes(fresh_routes, device, gen):
    wide = _draw((4, 80), device, gen)
    inputs = {
        "contiguous": _draw((4, 64), device, gen),
        "another row length": _draw((4, 3000), device, gen),  # another plan
        "row stride 80": wide[:, :64],  # the shape of the first, its rows 80 apart
        "transposed": _draw((64, 4), device, gen).t(),  # the shape of the first, columns 4 apart
        "4 bytes past 16": wide[:, 1:65],  # row stride 80, not 16-byte aligned
        "expanded": _draw((1, 64), device, gen).expand(4, 64),  # row stride 0
    }
    for name, x in inputs.items():
        try:
            _assert_matches_float64(softmax(x), x)
        except AssertionError as e:
            raise AssertionError(f"{name}: {e}") from e
    assert len(fresh_routes) == len(inputs)
    assert fresh_routes[0].block_n != fresh_routes[1].block_n
    for name, x in inputs.items():  # every route again, in the same order: nothing new is built
        _assert_matches_float64(softmax(x), x)
    assert len(fresh_routes) == len(inputs)


def test_a_tensor_resized_in_place_gets_a_new_route(fresh_routes, device, gen):
    x = _draw((4, 64), device, gen)
    softmax(x)
    x.resize_(8, 32).copy_(_draw((8, 32), device, gen))
    _assert_matches_float64(softmax(x), x)
    assert [(p.block_n, p.grid) for p in fresh_routes] == [(64, 1), (32, 1)]


@pytest.mark.parametrize("dim", [0, 1, 2, -1])
def test_routes_by_dim(fresh_routes, dim, device, gen):
    x = _draw((3, 5, 7), device, gen)
    for _ in range(2):
        _assert_matches_float64(softmax(x, dim), x, dim)
    assert len(fresh_routes) == 1


def test_checks_still_refuse_bad_input_once_a_layout_is_known(device, monkeypatch):
    x = torch.ones(2, 3, device=device)
    softmax(x)
    softmax(x, 1)
    with pytest.raises(TypeError, match="dim must be an int, got bool"):
        softmax(x, True)  # True == 1 and hashes alike: the route of dim=1 must not answer
    with pytest.raises(TypeError, match="dim must be an int, got float"):
        softmax(x, 1.0)
    with pytest.raises(IndexError, match=r"expected to be in range of \[-2, 1\]"):
        softmax(x, 2)
    with pytest.raises(ValueError, match="'auto', 'single_block', 'online'"):
        softmax(x, impl="fast")
    with pytest.raises(ValueError, match="'auto', 'single_block', 'online'"):
        softmax(x, impl=["auto"])  # unhashable
    with pytest.raises(TypeError, match="float64.*supported dtypes are float32, float16, bfloat16"):
        softmax(x.double())
    with pytest.raises(TypeError, match="must be a torch.Tensor"):
        softmax(x.tolist())
    if device == "cpu":  # a CPU route must not outlive the interpreter
        monkeypatch.setenv("TRITON_INTERPRET", "0")
        with pytest.raises(RuntimeError, match=r"(?s)x\.cuda\(\).*TRITON_INTERPRET=1"):
            softmax(x)


def test_outputs_are_fresh_tensors(device, gen):
    x = _draw((2, 100), device, gen)
    y1, y2 = softmax(x), softmax(x)
    assert y1.data_ptr() != y2.data_ptr() and torch.equal(y1, y2)


# ---------------------------------------------------------------------------------------------------------
# Autograd through routes
# ---------------------------------------------------------------------------------------------------------


def _gradients(x, dim):
    """dy of several layouts for a 2-D x: contiguous, transposed, stride 0 across the rows of `dim` (varying
    along them: a dy constant along a row has dx = 0, which no relative error can judge), a column slice."""
    rows, cols = x.shape
    yield "contiguous", torch.randn(rows, cols, device=x.device)
    yield "transposed", torch.randn(cols, rows, device=x.device).t()
    if dim in (1, -1):
        yield "expanded", torch.randn(1, cols, device=x.device).expand(rows, cols)
    else:
        yield "expanded", torch.randn(rows, 1, device=x.device).expand(rows, cols)
    yield "sliced", torch.randn(rows, cols + 3, device=x.device)[:, 2:-1]


@pytest.mark.parametrize("dim", [-1, 0])
def test_backward_for_every_layout_of_dy(dim, device, gen):
    x = _draw((6, 40), device, gen).requires_grad_()
    for name, dy in _gradients(x, dim):
        for _ in range(2):  # the second time through the bound backward
            x.grad = None
            softmax(x, dim).backward(dy)
            try:
                _assert_grad_matches_float64(x.grad, x, dy, dim)
            except AssertionError as e:
                raise AssertionError(f"{name}: {e}") from e


def test_sum_backward(device, gen):
    # y.sum().backward() sends a gradient of stride 0 everywhere; softmax's rows sum to 1, so dx = 0.
    x = _draw((3, 50), device, gen).requires_grad_()
    softmax(x).sum().backward()
    assert x.grad.abs().max() < 1e-6


def test_double_backward_refuses(device, gen):
    x = _draw((2, 30), device, gen).requires_grad_()
    dy = _draw((2, 30), device, gen).requires_grad_()
    (dx,) = torch.autograd.grad(softmax(x), x, dy, create_graph=True)
    _assert_grad_matches_float64(dx, x, dy.detach())
    with pytest.raises(RuntimeError, match="once_differentiable"):
        dx.sum().backward()


def test_no_graph_without_grad_mode(device, gen):
    x = _draw((2, 30), device, gen).requires_grad_()
    with torch.no_grad():
        assert not softmax(x).requires_grad
    with torch.inference_mode():
        assert not softmax(x).requires_grad
    assert softmax(x).requires_grad


# ---------------------------------------------------------------------------------------------------------
# torch.compile: the call is an operator of the graph
# ---------------------------------------------------------------------------------------------------------


def _recording_backend(inner: str, graphs: list):
    from torch._dynamo.backends.registry import lookup_backend

    def backend(gm, example_inputs):
        graphs.append(str(gm.graph))
        return lookup_backend(inner)(gm, example_inputs)

    return backend


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_compile_fullgraph_forward_and_backward(backend, device, gen):
    torch._dynamo.reset()
    graphs = []
    f = torch.compile(lambda x: softmax(x, 0) * 2.0, backend=_recording_backend(backend, graphs), fullgraph=True)
    x = _draw((5, 33), device, gen).requires_grad_()
    dy = _draw((5, 33), device, gen)
    y = f(x)
    y.backward(dy)
    _assert_matches_float64(y / 2.0, x, 0)
    _assert_grad_matches_float64(x.grad / 2.0, x, dy, 0)
    assert any("kernel_lab.softmax" in g for g in graphs)


@pytest.mark.slow
def test_ops_pass_opcheck(device, gen):
    x = _draw((4, 20), device, gen)
    y = softmax(x, 1)
    torch.library.opcheck(torch.ops.kernel_lab.softmax.default, (x, 1, "auto"))
    torch.library.opcheck(torch.ops.kernel_lab.softmax_backward.default, (y, _draw((4, 20), device, gen), 1, "auto"))


# ---------------------------------------------------------------------------------------------------------
# GPU: raw launches, self-resetting split-row counters, streams, CUDA graphs, Inductor
# ---------------------------------------------------------------------------------------------------------


@needs_gpu
def test_eager_routes_launch_raw_on_cuda(fresh_routes, gen):
    for shape, dtype in [((1, 1024), torch.float32), ((2, 100000), torch.bfloat16)]:
        x = _draw(shape, "cuda", gen, dtype)
        _assert_matches_float64(softmax(x), x)
    routes = list(softmax_module._ROUTES.values())
    assert [r.plan.impl for r in routes] == ["single_block", "split_row"]
    assert [r.launch.mode for r in routes] == ["raw", "raw"]


@needs_gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_split_row_counters_reset_themselves(dtype, gen):
    n_rows, n_cols = 3, 100000
    for _ in range(20):  # a counter left behind would shift every later launch's tickets
        x = _draw((n_rows, n_cols), "cuda", gen, dtype).requires_grad_()
        dy = _draw((n_rows, n_cols), "cuda", gen, dtype, scale=1.0)
        y = softmax(x)
        y.backward(dy)
        _assert_matches_float64(y.detach(), x)
        _assert_grad_matches_float64(x.grad, x, dy)
    torch.cuda.synchronize()
    plan = softmax_module.plan_softmax(n_rows, n_cols, dtype)
    *partials, sync = softmax_module._stream_workspace(torch.device("cuda", 0), n_rows, (n_rows * plan.splits,) * 2)
    assert plan.impl == "split_row" and not sync.any()


@needs_gpu
def test_split_row_on_two_streams_at_once(gen):
    streams = [torch.cuda.Stream(), torch.cuda.Stream()]
    xs = [_draw((4, 100000), "cuda", gen, torch.bfloat16) for _ in range(8)]
    torch.cuda.synchronize()
    ys = []
    for i, x in enumerate(xs):
        with torch.cuda.stream(streams[i % 2]):
            ys.append(softmax(x))
    torch.cuda.synchronize()
    for x, y in zip(xs, ys):
        _assert_matches_float64(y, x)


@needs_gpu
@pytest.mark.parametrize("shape,dtype", [((1, 1024), torch.float32), ((3, 100000), torch.bfloat16),
                                         ((4, 7, 33), torch.float32)], ids=str)
def test_cuda_graph_replays_eager_calls(shape, dtype, gen):
    x = _draw(shape, "cuda", gen, dtype)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm up (plan, bind) outside the capture
        softmax(x)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = softmax(x)
    for _ in range(5):
        x.copy_(_draw(shape, "cuda", gen, dtype))
        graph.replay()
        torch.cuda.synchronize()
        _assert_matches_float64(y, x)


@needs_gpu
def test_graphed_forward_and_backward(gen):
    for shape, dtype in [((2, 1024), torch.float32), ((2, 100000), torch.bfloat16)]:
        x = _draw(shape, "cuda", gen, dtype).requires_grad_()
        graphed = torch.cuda.make_graphed_callables(lambda t: softmax(t), (x,))
        for _ in range(3):
            x = _draw(shape, "cuda", gen, dtype).requires_grad_()
            dy = _draw(shape, "cuda", gen, dtype, scale=1.0)
            y = graphed(x)
            y.backward(dy)
            _assert_matches_float64(y.detach(), x)
            _assert_grad_matches_float64(x.grad, x, dy)


@needs_gpu
@pytest.mark.slow
@pytest.mark.parametrize("mode", ["default", "reduce-overhead"])
def test_inductor_fullgraph(mode, gen):
    torch._dynamo.reset()
    # The op sits inside a larger graph; doubling is exact in floating point (adding 1 would round y away).
    f = torch.compile(lambda x: softmax(x) * 2.0, fullgraph=True, mode=mode)
    for shape, dtype in [((8, 1024), torch.float32), ((2, 100000), torch.bfloat16)]:
        for _ in range(3):  # reduce-overhead records a CUDA graph on a later call and replays it
            x = _draw(shape, "cuda", gen, dtype).requires_grad_()
            dy = _draw(shape, "cuda", gen, dtype, scale=1.0)
            y = f(x)
            y.backward(dy)
            _assert_matches_float64(y.detach() / 2.0, x)
            _assert_grad_matches_float64(x.grad, x, 2.0 * dy)
