"""Row softmax, forward and backward, differentiable, on any dim: `softmax(x, dim, impl=...)`.

    y = softmax(x),  y_j = exp(x_j - m) / d,  m = max_k x_k,  d = sum_k exp(x_k - m)
    dx = y * (dy - dot),  dot = <dy, y> = sum_k dy_k * y_k

Five files, read in this order: the kernels and the bytes each schedule moves (kernels/softmax_kernels.py,
and kernels/softmax_split_row_kernels.py for rows cut across programs), the launch plan, which picks a
schedule and its settings from the row length and dtype (kernels/softmax_plan.py), each plan's launch
described once (kernels/softmax_launch.py), and this module, which runs those launches.

`impl="auto"` takes single-block up to a row length set per direction and dtype, and split-row beyond it
(online under the interpreter, or past MAX_SPLITS slices); AUTO_SINGLE_BLOCK_MAX_N records the measurements
behind those thresholds. `impl="single_block"` and `impl="online"` force a schedule.

A call costs host time as well as GPU time, and for small inputs only host time shows (notes/host-overhead.md).
Each launch is described once (kernels/softmax_launch.py: _fwd_launch, _bwd_launch) and run three ways:

* eager calls look a route up by everything that fixes the plan and the compiled kernel: shape, strides,
  dtype, device, dim, impl and 16-byte alignment. A new layout is checked, planned and bound once
  (kernels/_launch.py); later calls allocate the output and launch, nothing else. A split-row launch takes
  its counters from a per-stream workspace that its kernels leave zeroed, so it needs no memset; captured
  into a CUDA graph, it gets counters of its own, zeroed inside the graph. A split-row backward whose plan
  says `cluster` launches its rows' slices as clusters (kernels/_launch.py) and needs no counters.
* under torch.compile (and torch.export) the call is the operator torch.ops.kernel_lab.softmax, with its
  backward kernel_lab::softmax_backward registered for autograd; the kernels sit in the graph
  (torch.library.triton_op and wrap_triton; under the interpreter the ops are opaque custom ops). A graph's
  launcher knows no clusters, so traced calls are planned without them.
* softmax_fwd and softmax_bwd launch one given plan on 2-D row matrices, as the experiments time them.
"""

from __future__ import annotations

import torch
from triton.runtime.jit import JITFunction

from kernels._checks import check_device, check_dtype, normalize_dim
from kernels._launch import bind
from kernels.softmax_kernels import (  # noqa: F401  (re-exported: the tuning probes import the kernels from here)
    _softmax_bwd_online_kernel,
    _softmax_bwd_row_kernel,
    _softmax_bwd_rows_pipelined_kernel,
    _softmax_bwd_single_block_kernel,
    _softmax_fwd_online_kernel,
    _softmax_fwd_row_kernel,
    _softmax_fwd_rows_pipelined_kernel,
    _softmax_fwd_single_block_kernel,
)
from kernels.softmax_split_row_kernels import _softmax_bwd_split_row_kernel, _softmax_fwd_split_row_kernel
from kernels.softmax_plan import (  # noqa: F401  (re-exported: the plan is imported from here)
    AUTO_SINGLE_BLOCK_MAX_N,
    DIRECTIONS,
    IMPLS,
    MAX_SINGLE_BLOCK_N,
    MAX_SPLITS,
    SoftmaxPlan,
    _next_power_of_2,
    choose_impl,
    device_clusters,
    device_sms,
    plan_softmax,
    single_block_lanes,
)

from kernels.softmax_launch import (  # noqa: F401  (re-exported: tools and tests import them from here)
    _as_rows,
    _bwd_launch,
    _cut_rows,
    _fresh_workspace,
    _from_rows,
    _fwd_launch,
    _matrix_view,
    _row_offsets_fit_int32,
    _split_row_sync,
    _starts_aligned,
    _stream_workspace,
    softmax_bwd,
    softmax_fwd,
)

SUPPORTED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


# --------------------------------------------------------------------------------------------------------
# Eager calls: one route per input layout, planned and bound once (kernels/_launch.py)
# --------------------------------------------------------------------------------------------------------

_ROUTE_LIMIT = 4096  # layouts remembered; past this many the cache starts over
_ROUTES: dict[tuple, _Route] = {}


class _Route:
    """What softmax(x, dim, impl) runs for one layout of x (shape, strides, dtype, device, alignment): its
    forward, and its backwards by layout of dy. `direct`: x and y are passed as they are, with no view."""

    __slots__ = ("forward", "backwards", "plan", "launch", "dim", "impl", "direct", "rows_shape")


def _bind(spec: tuple, n_own: int, device: torch.device, n_rows: int, parts: tuple, cluster: int = 1):
    """A launcher of the launch `spec` describes that takes the call's own tensors (its first n_own); a
    split-row launch gets the current stream's partials and counters after them. cluster: programs a
    cluster (a clustered split-row plan's splits)."""
    kernel, grid, args, meta = spec
    split_row = kernel in (_softmax_fwd_split_row_kernel, _softmax_bwd_split_row_kernel)
    launch = bind(kernel, grid, args, varying=n_own + (len(parts) + 1 if split_row else 0), cluster=cluster, **meta)
    if not split_row:
        return launch

    def run(*tensors):
        launch(*tensors, *_stream_workspace(device, n_rows, parts))

    run.mode = launch.mode
    return run


def _new_route(x: torch.Tensor, dim: int, impl: str) -> _Route:
    """Plan and bind the route of x's layout (checked inputs with at least one element)."""
    n_cols = x.shape[dim]
    n_rows, dtype, device, shape = x.numel() // n_cols, x.dtype, x.device, x.shape
    route = _Route()
    route.dim, route.impl, route.rows_shape, route.backwards = dim, impl, (n_rows, n_cols), {}
    x_rows = _matrix_view(x, dim)
    route.direct = x_rows is not None
    row_stride = x_rows.stride(0) if route.direct else None
    route.plan = plan = plan_softmax(n_rows, n_cols, dtype, impl, row_stride=row_stride, sms=device_sms(device))
    if route.direct:
        alloc = torch.empty_like if x.is_contiguous() else lambda t: torch.empty(shape, dtype=dtype, device=device)
        y_rows = alloc(x).view(n_rows, n_cols)
    else:
        x_rows, y_rows = _as_rows(x, dim), torch.empty((n_rows, n_cols), dtype=dtype, device=device)
    parts = (n_rows * plan.splits,) * 2
    route.launch = run = _bind(_fwd_launch(x_rows, y_rows, plan, _stream_workspace), 2, device, n_rows, parts)

    def forward(x):
        y = alloc(x)
        run(x, y)
        return y

    def forward_through_rows(x):
        y_rows = torch.empty((n_rows, n_cols), dtype=dtype, device=device)
        run(_as_rows(x, dim), y_rows)
        return _from_rows(y_rows, x, dim)

    route.forward = forward if route.direct else forward_through_rows
    if device.type != "cuda":  # the interpreter may be switched off between calls: check on every one
        unchecked = route.forward

        def forward_checked(x):
            check_device("softmax", x)
            return unchecked(x)

        route.forward = forward_checked
    return route


def _new_backward(route: _Route, y: torch.Tensor, dy: torch.Tensor):
    """Plan and bind the backward of `route` for dy's layout; y is the forward's output."""
    (n_rows, n_cols), dim, dtype, device = route.rows_shape, route.dim, y.dtype, y.device
    plan = plan_softmax(n_rows, n_cols, dtype, route.impl, direction="backward", clusters=device_clusters(device))
    parts, cluster = (n_rows * plan.splits,), plan.splits if plan.cluster else 1
    dy_rows = _matrix_view(dy, dim) if route.direct and dy.dtype == dtype else None
    if dy_rows is not None:  # y is contiguous here (allocated by the forward), and so is dx
        spec = _bwd_launch(y.view(n_rows, n_cols), dy_rows, torch.empty_like(y).view(n_rows, n_cols), plan,
                           _stream_workspace)
        run = _bind(spec, 3, device, n_rows, parts, cluster)

        def backward(y, dy):
            dx = torch.empty_like(y)
            run(y, dy, dx)
            return dx

        return backward
    dx_rows = torch.empty((n_rows, n_cols), dtype=dtype, device=device)
    spec = _bwd_launch(_as_rows(y, dim), _as_rows(dy.to(dtype), dim), dx_rows, plan, _stream_workspace)
    run = _bind(spec, 3, device, n_rows, parts, cluster)

    def backward_through_rows(y, dy):
        dx_rows = torch.empty((n_rows, n_cols), dtype=dtype, device=device)
        run(_as_rows(y, dim), _as_rows(dy.to(dtype), dim), dx_rows)
        return _from_rows(dx_rows, dy, dim)

    return backward_through_rows


# --------------------------------------------------------------------------------------------------------
# Traced calls (torch.compile, torch.export): the same launches as operators a graph holds
# --------------------------------------------------------------------------------------------------------


def _traceable(kernel):
    # wrap_triton makes a launch a node of the traced graph; the interpreter's kernels are not JITFunctions.
    return torch.library.wrap_triton(kernel) if isinstance(kernel, JITFunction) else kernel


def _softmax_op(x: torch.Tensor, dim: int, impl: str) -> torch.Tensor:
    x_rows = _as_rows(x, dim)
    y_rows = torch.empty(x_rows.shape, dtype=x.dtype, device=x.device)
    plan = plan_softmax(x_rows.shape[0], int(x_rows.shape[1]), x.dtype, impl, row_stride=x_rows.stride(0),
                        sms=device_sms(x.device))
    kernel, grid, args, meta = _fwd_launch(x_rows, y_rows, plan, _fresh_workspace)
    meta.pop("maxnreg", None)  # a launch option a traced graph's launcher does not pass on: compiled uncapped
    _traceable(kernel)[grid](*args, **meta)
    return _from_rows(y_rows, x, dim)


def _softmax_backward_op(y: torch.Tensor, dy: torch.Tensor, dim: int, impl: str) -> torch.Tensor:
    y_rows, dy_rows = _as_rows(y, dim), _as_rows(dy.to(y.dtype), dim)
    dx_rows = torch.empty(y_rows.shape, dtype=y.dtype, device=y.device)
    plan = plan_softmax(y_rows.shape[0], int(y_rows.shape[1]), y.dtype, impl, direction="backward", clusters=False)
    kernel, grid, args, meta = _bwd_launch(y_rows, dy_rows, dx_rows, plan, _fresh_workspace)
    _traceable(kernel)[grid](*args, **meta)
    return _from_rows(dx_rows, dy, dim)


def _rows_like(t: torch.Tensor, shape_of: torch.Tensor, dim: int) -> torch.Tensor:
    # What the ops return, without a launch: a rows matrix of t's dtype seen through _from_rows.
    n_cols = shape_of.shape[dim]
    return _from_rows(t.new_empty((shape_of.numel() // n_cols, n_cols)), shape_of, dim)


def _register(name: str, fn, fake):
    if isinstance(_softmax_fwd_row_kernel, JITFunction):
        return torch.library.triton_op(name, fn, mutates_args=())
    # The interpreter's kernels cannot be traced: the op stays opaque to the graph, described by `fake`.
    op = torch.library.custom_op(name, fn, mutates_args=())
    op.register_fake(fake)
    return op


def _softmax_op_fake(x: torch.Tensor, dim: int, impl: str) -> torch.Tensor:
    return _rows_like(x, x, dim)


def _softmax_backward_op_fake(y: torch.Tensor, dy: torch.Tensor, dim: int, impl: str) -> torch.Tensor:
    return _rows_like(y, dy, dim)


def _setup_context(ctx, inputs, output):
    ctx.save_for_backward(output)
    ctx.dim, ctx.impl = inputs[1], inputs[2]


def _softmax_op_backward(ctx, dy):
    (y,) = ctx.saved_tensors
    return torch.ops.kernel_lab.softmax_backward(y, dy, ctx.dim, ctx.impl), None, None


_register("kernel_lab::softmax", _softmax_op, _softmax_op_fake).register_autograd(
    _softmax_op_backward, setup_context=_setup_context)
_register("kernel_lab::softmax_backward", _softmax_backward_op, _softmax_backward_op_fake)


# --------------------------------------------------------------------------------------------------------
# Autograd and the public function
# --------------------------------------------------------------------------------------------------------


class SoftmaxFunction(torch.autograd.Function):
    """Eager autograd around a route: the forward's output is saved, the backward bound per layout of dy."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, route: _Route) -> torch.Tensor:
        y = route.forward(x)
        ctx.save_for_backward(y)
        ctx.route = route
        return y

    @staticmethod
    def backward(ctx, dy: torch.Tensor):
        if torch.is_grad_enabled():  # create_graph=True: dx must refuse a second differentiation
            return _backward_once_differentiable(ctx, dy)
        return _backward(ctx, dy)


def _backward(ctx, dy: torch.Tensor):
    (y,) = ctx.saved_tensors
    backwards = ctx.route.backwards
    try:
        run = backwards[dy.__class__, dy.shape, dy.stride(), dy.dtype, dy.data_ptr() % 16]
    except KeyError:
        run = backwards[dy.__class__, dy.shape, dy.stride(), dy.dtype, dy.data_ptr() % 16] = _new_backward(
            ctx.route, y, dy)
    return run(y, dy), None


# once_differentiable costs microseconds a call, so it runs only when a graph of the backward is recorded.
_backward_once_differentiable = torch.autograd.function.once_differentiable(_backward)


def _check_inputs(x, dim, impl) -> int:
    """The normalised dim; raises for anything softmax refuses, naming what was given and what is accepted."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"softmax: x must be a torch.Tensor, got {type(x).__name__}.")
    check_dtype("softmax", "x", x, SUPPORTED_DTYPES)
    if impl not in IMPLS:
        raise ValueError(f"softmax: impl must be one of {', '.join(map(repr, IMPLS))}, got {impl!r}.")
    dim = normalize_dim("softmax", dim, x.dim())
    check_device("softmax", x)
    return dim


def _softmax_checked(x, dim, impl) -> torch.Tensor:
    """Every call the route cache does not answer: checks, then a new route, or the op, or no launch."""
    dim_n = _check_inputs(x, dim, impl)
    if x.dim() == 0:
        return softmax(x.reshape(1), 0, impl=impl).reshape(())
    if x.numel() == 0:
        return x.clone()  # nothing to compute; clone keeps autograd's graph without a launch
    if torch.compiler.is_compiling() or not _has_storage(x):
        return torch.ops.kernel_lab.softmax(x, dim_n, impl)  # traced: a node of the graph
    if len(_ROUTES) >= _ROUTE_LIMIT:
        _ROUTES.clear()
    route = _ROUTES[_route_key(x, dim, impl)] = _new_route(x, dim_n, impl)
    if x.requires_grad and torch.is_grad_enabled():
        return SoftmaxFunction.apply(x, route)
    return route.forward(x)


def _route_key(x: torch.Tensor, dim, impl) -> tuple:
    # Everything that fixes the plan and the compiled kernel. dim's class keeps dim=True off dim=1's route.
    return x.__class__, x.shape, x.stride(), x.dtype, x.device, dim.__class__, dim, impl, x.data_ptr() % 16


def _has_storage(t: torch.Tensor) -> bool:
    try:
        t.data_ptr()
    except RuntimeError:  # fake and functional tensors, met while tracing
        return False
    return True


def softmax(x: torch.Tensor, dim: int = -1, *, impl: str = "auto") -> torch.Tensor:
    """Softmax of `x` along `dim`, differentiable; same shape and dtype as `x`.

    x: any shape and strides, dtype float32, float16 or bfloat16, on CUDA (or on the CPU with
    TRITON_INTERPRET=1). impl: "auto" (pick by row length and dtype), "single_block" or "online".
    Special values follow torch.softmax: -inf entries give 0; a row that is all -inf, or holds NaN or +inf,
    gives NaN. Math in fp32 whatever the input dtype. Under torch.compile the call becomes the operator
    torch.ops.kernel_lab.softmax (its backward kernel_lab::softmax_backward).
    """
    # Eager calls look their route up by everything that fixes the plan and the compiled kernel (_route_key,
    # inlined): a layout seen before was checked then, so the checks cost nothing here. Anything else takes
    # _softmax_checked.
    if not torch.compiler.is_compiling():
        try:
            route = _ROUTES[x.__class__, x.shape, x.stride(), x.dtype, x.device, dim.__class__, dim, impl,
                            x.data_ptr() % 16]
        except Exception:  # a new layout; or not a tensor, an unhashable argument, a tensor without storage
            return _softmax_checked(x, dim, impl)
        if x.requires_grad and torch.is_grad_enabled():
            return SoftmaxFunction.apply(x, route)
        return route.forward(x)
    return _softmax_checked(x, dim, impl)
