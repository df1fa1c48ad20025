"""The decode GEMV of rmsnorm_linear (kernels/rmsnorm_gemv.py, kernels/_gemv.py): both forms, split-K, the
plan table on each side of every threshold, and the cached call path, against float64 references.

Bounds as in tests/test_rmsnorm_linear.py (one row per dtype): the "fma" form is fp32 throughout and rounds
once at the output; the "dot" form also rounds x * gamma to the storage dtype. Under Triton 3.6's
interpreter fp32 -> bf16 truncates, so bf16 gets 1.6e-2; a dropped gamma (≈ 0.1 here), a skipped K-tile, a
lost split or a wrong r exceed these by an order of magnitude.
"""

from __future__ import annotations

import importlib
import math
import re
from dataclasses import replace

import pytest
import torch

from accuracy import rel_err
from kernels import _gemv, reference
from kernels import rmsnorm_gemv as rg
from kernels._gemv import GemvPlan, choose_split_k, counters_at_rest
from kernels.rmsnorm_linear import plan_rmsnorm_linear, rmsnorm_linear

rl_module = importlib.import_module("kernels.rmsnorm_linear")

BOUNDS = {torch.float16: 2e-3, torch.bfloat16: 1.6e-2}
DTYPES = list(BOUNDS)
EPS = 1e-6


def _draw(shape, dtype, device, gen, scale=1.0, offset=0.0):
    return (torch.randn(shape, generator=gen, dtype=torch.float64) * scale + offset).to(dtype).to(device)


def _operands(m, k, n, dtype, device, gen):
    return (_draw((m, k), dtype, device, gen), _draw((n, k), dtype, device, gen, scale=1 / math.sqrt(k)),
            _draw((k,), dtype, device, gen, scale=0.1, offset=1.0))


def _check(y, x, weight, gamma):
    ref = reference.rmsnorm_linear_float64(x, weight, gamma, EPS)
    assert y.shape == ref.shape and y.dtype == x.dtype
    assert not torch.isnan(y).any(), "an output element is NaN (unwritten, or a lost split)"
    err = rel_err(y, ref)
    assert err <= BOUNDS[x.dtype], f"relative error {err:.3e}"


# ---------------------------------------------------------------------------------------------------------
# Both forms, every split, poisoned outputs
# ---------------------------------------------------------------------------------------------------------

# (form, BLOCK_M, BLOCK_N, BLOCK_K, SPLIT_K, swap): one row on the CUDA cores with and without split-K; two
# and four rows held in registers; the tensor cores with W first or second, split 2 and 5 (more splits than
# K-tiles at K = 100, BLOCK_K = 32: empty splits still count in), and a 32-row tile.
PLANS = [
    ("fma", 1, 16, 32, 1, False), ("fma", 1, 8, 32, 3, False), ("fma", 2, 8, 32, 1, False), ("fma", 4, 16, 64, 2, False),
    ("dot", 16, 16, 32, 5, True), ("dot", 16, 32, 32, 2, False), ("dot", 32, 16, 32, 1, True),
]


@pytest.mark.parametrize("form,bm,bn,bk,split,swap", PLANS, ids=lambda v: str(v))
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_every_plan_matches_float64_and_writes_every_element(dtype, form, bm, bn, bk, split, swap, device, gen):
    plan = GemvPlan(form, bm, bn, bk, split, 4, 2, swap)
    for m in sorted({1, (bm + 1) // 2, bm}):
        x, weight, gamma = _operands(m, 100, 37, dtype, device, gen)  # ragged K-tile, ragged N-tile
        y = torch.full((m, 37), float("nan"), dtype=dtype, device=device)
        r = torch.full((m,), float("nan"), device=device)
        rg.rmsnorm_gemv_fwd(x, weight, gamma, EPS, plan, y, r)
        _check(y, x, weight, gamma)
        assert rel_err(r, torch.rsqrt(x.double().pow(2).mean(-1) + EPS)) < 1e-6
        assert counters_at_rest(x.device)  # the last program of each tile reset its counter


def test_split_k_runs_twice_alike_and_reuses_its_workspace(device, gen):
    x, weight, gamma = _operands(3, 96, 40, torch.bfloat16, device, gen)
    plan = GemvPlan("dot", 16, 16, 32, 3, 4, 2, True)
    y1 = rg.rmsnorm_gemv_fwd(x, weight, gamma, EPS, plan, torch.empty(3, 40, dtype=torch.bfloat16, device=device))
    first = _gemv.split_k_workspace(plan, 40, x.device)
    y2 = rg.rmsnorm_gemv_fwd(x, weight, gamma, EPS, plan, torch.empty(3, 40, dtype=torch.bfloat16, device=device))
    assert torch.equal(y1, y2)
    again = _gemv.split_k_workspace(plan, 40, x.device)
    assert again[0] is first[0] and again[1] is first[1]


def test_workspace_grows_and_keeps_what_it_outgrew(device):
    small = _gemv.workspace(10, 4, torch.device(device))
    big = _gemv.workspace(small[0].numel() + 1, 4, torch.device(device))
    assert big[0].numel() > small[0].numel() and big[1] is small[1]
    assert any(t is small[0] for t in _gemv._RETIRED)  # a captured graph may still point at it
    assert int(big[1].abs().sum()) == 0


def test_captured_launches_take_zeroed_counters_no_one_else_gets(monkeypatch):
    cpu = torch.device("cpu")
    monkeypatch.setattr(_gemv, "_SLABS", {})
    monkeypatch.setattr(_gemv, "_SLABS_DRAWN", set())
    _gemv.renew_slab(cpu, size=16)
    slab = _gemv._SLABS["cpu"][0]
    a, b = _gemv.zeroed_counters(6, cpu), _gemv.zeroed_counters(6, cpu)
    assert a.numel() == b.numel() == 6 and int(a.abs().sum() + b.abs().sum()) == 0
    assert a.data_ptr() + 6 * a.element_size() == b.data_ptr()  # disjoint slices of one slab
    c = _gemv.zeroed_counters(6, cpu)  # 4 left: a zeroed tensor of its own
    assert c.untyped_storage().data_ptr() != slab.untyped_storage().data_ptr() and int(c.abs().sum()) == 0
    _gemv.renew_slab(cpu, size=16)  # a quarter free: kept
    assert _gemv._SLABS["cpu"][0] is slab
    _gemv.zeroed_counters(1, cpu)
    _gemv.renew_slab(cpu, size=16)  # less than a quarter free: renewed, the old one kept alive
    assert _gemv._SLABS["cpu"][0] is not slab and any(t is slab for t in _gemv._RETIRED)


def test_captured_split_k_replays_no_memset_and_graphs_count_apart(device, gen):
    if device != "cuda":
        pytest.skip("CUDA graphs need a GPU")
    plan = GemvPlan("dot", 16, 16, 32, 4, 4, 2, True)
    weight, gamma = _operands(1, 256, 80, torch.bfloat16, device, gen)[1:]
    xs = [_draw((3, 256), torch.bfloat16, device, gen) for _ in range(2)]
    ys = [torch.empty(3, 80, dtype=torch.bfloat16, device=device) for _ in range(2)]
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm up: compile, bound launchers, the slab
        for x, y in zip(xs, ys):
            rg.rmsnorm_gemv_fwd(x, weight, gamma, EPS, plan, y)
    torch.cuda.current_stream().wait_stream(side)
    graphs = []
    for x, y in zip(xs, ys):
        graphs.append(torch.cuda.CUDAGraph())
        with torch.cuda.graph(graphs[-1]):
            rg.rmsnorm_gemv_fwd(x, weight, gamma, EPS, plan, y)
    streams = [torch.cuda.Stream() for _ in graphs]
    for _ in range(20):  # both graphs at once: each counts into its own tiles
        for g, s in zip(graphs, streams):
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                g.replay()
        for s in streams:
            torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    for x, y in zip(xs, ys):
        _check(y, x, weight, gamma)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        graphs[0].replay()
        torch.cuda.synchronize()
    names = [e.name.lower() for e in prof.events()]
    assert any("gemv" in n for n in names), names  # the replay's kernel was seen
    assert not any("memset" in n or "fill" in n for n in names), names


def test_output_rows_may_be_strided_and_nothing_outside_is_written(device, gen):
    x, weight, gamma = _operands(3, 64, 24, torch.bfloat16, device, gen)
    buf = torch.full((5, 40), float("nan"), dtype=torch.bfloat16, device=device)
    out = buf[1:4, 5:29]
    rg.rmsnorm_gemv_fwd(x, weight, gamma, EPS, rg.plan_rmsnorm_gemv(3, 24, 64, torch.bfloat16), out)
    assert torch.isnan(buf[0]).all() and torch.isnan(buf[4]).all()
    assert torch.isnan(buf[:, :5]).all() and torch.isnan(buf[:, 29:]).all()
    _check(out, x, weight, gamma)


@pytest.mark.parametrize("m", [1, 3, 5, 16])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_public_function_at_decode_shapes(dtype, m, device, gen):
    for k, n in ((64, 48), (1, 5), (300, 70)):
        x, weight, gamma = _operands(m, k, n, dtype, device, gen)
        _check(rmsnorm_linear(x, weight, gamma, EPS), x, weight, gamma)


# ---------------------------------------------------------------------------------------------------------
# The plan: a pure function, each threshold tested on both sides
# ---------------------------------------------------------------------------------------------------------


def test_form_threshold():
    assert rg.plan_rmsnorm_gemv(rg.FMA_MAX_M, 4096, 4096, torch.bfloat16).form == "fma"
    above = rg.plan_rmsnorm_gemv(rg.FMA_MAX_M + 1, 4096, 4096, torch.bfloat16)
    assert above.form == "dot" and above.block_m >= 16 and above.swap == rg.DOT_SWAP
    assert rg.plan_rmsnorm_gemv(rg.GEMV_MAX_M, 4096, 4096, torch.bfloat16).form == "dot"
    assert plan_rmsnorm_linear(rg.GEMV_MAX_M + 1, 4096, 4096, torch.bfloat16).shape_class != "gemv"
    for bad in (0, rg.GEMV_MAX_M + 1):
        with pytest.raises(ValueError, match=f"the GEMV serves 1 <= M <= {rg.GEMV_MAX_M} rows, got {bad}"):
            rg.plan_rmsnorm_gemv(bad, 4096, 4096, torch.bfloat16)


def test_the_tensor_core_tile_widens_once_its_tiles_fill_half_the_sms():
    m, k, sms = rg.FMA_MAX_M + 1, 4096, 132
    edge = math.ceil(rg.DOT_WIDE_MIN_TILES_PER_SM * sms) * 128  # N whose 128-row tiles just reach the bound
    wide, narrow = (rg.plan_rmsnorm_gemv(m, n, k, torch.bfloat16, sms) for n in (edge, edge - 128))
    assert (wide.block_n, wide.block_k, wide.num_warps, wide.load_stages) == rg.DOT_TILES[128]
    assert (narrow.block_n, narrow.block_k, narrow.num_warps, narrow.load_stages) == rg.DOT_TILES[64]
    assert rg.plan_rmsnorm_gemv(m, 14336, k, torch.bfloat16, sms).block_n == 128
    assert rg.plan_rmsnorm_gemv(m, 4096, k, torch.bfloat16, sms).block_n == 64


def test_split_k_depends_on_the_sm_count():
    few = rg.plan_rmsnorm_gemv(16, 1024, 4096, torch.bfloat16, sm_count=8)
    many = rg.plan_rmsnorm_gemv(16, 1024, 4096, torch.bfloat16, sm_count=132)
    assert few.split_k == 1  # 8 tiles of 128 rows: one program on every SM of 8
    assert many.block_n == 64 and many.split_k == 8  # 16 tiles of 64 rows, split to 128 >= 66 programs


@pytest.mark.parametrize("tiles,want", [
    (math.ceil(rg.DOT_SPLIT_BELOW_TILES_PER_SM * 132), 1),  # a quarter of the SMs busy: no split
    (math.ceil(rg.DOT_SPLIT_BELOW_TILES_PER_SM * 132) - 1, 4),  # one short: 32 x 4 reaches half the SMs
    (16, 8),
    (1, rg.MAX_SPLIT_K),  # capped
])
def test_dot_split_k_only_when_the_tiles_leave_most_sms_idle(tiles, want):
    assert rg.dot_split_k(tiles, 64, 132) == want
    assert rg.dot_split_k(tiles, 1, 132) == 1  # one K-step cannot be split


def test_fma_block_m_holds_every_row():
    for m in range(1, rg.FMA_MAX_M + 1):
        plan = rg.plan_rmsnorm_gemv(m, 4096, 4096, torch.bfloat16)
        assert plan.block_m >= m and plan.block_m in rg.FMA_TILE


def test_rms_mode_by_form_and_dtype():
    fma, dot = (rg.plan_rmsnorm_gemv(m, 64, 64, torch.float16) for m in (1, rg.FMA_MAX_M + 1))
    assert rg.rms_mode(fma, torch.float16) == rg.rms_mode(fma, torch.bfloat16) == "in-loop"
    assert rg.rms_mode(dot, torch.bfloat16) == "in-loop" and rg.rms_mode(dot, torch.float16) == "pre-pass"


@pytest.mark.parametrize("tiles,steps,want", [
    (rg.MIN_PROGRAMS, 64, 1),  # enough tiles: no split
    (rg.MIN_PROGRAMS - 1, 64, 2),  # one short: the smallest power of two that reaches it
    (rg.MIN_PROGRAMS // 4, 64, 4),
    (rg.MIN_PROGRAMS // 4 + 1, 64, 4),
    (1, 64, rg.MAX_SPLIT_K),  # capped
    (1, 4 * rg.MIN_STEPS_PER_SPLIT, 4),  # each of four splits keeps MIN_STEPS_PER_SPLIT K-steps
    (1, 4 * rg.MIN_STEPS_PER_SPLIT - 1, 2),  # four would leave one short
    (1, 2 * rg.MIN_STEPS_PER_SPLIT - 1, 1),
])
def test_split_k_rule(tiles, steps, want):
    got = choose_split_k(tiles, steps, min_programs=rg.MIN_PROGRAMS, min_steps=rg.MIN_STEPS_PER_SPLIT,
                         max_split=rg.MAX_SPLIT_K)
    assert got == want


def test_plans_at_the_experiment_shapes():
    for m in (1, 2, 4, 8, 16):
        for n, k in ((4096, 4096), (12288, 4096), (14336, 4096), (4096, 8192), (11007, 4096)):
            plan = rg.plan_rmsnorm_gemv(m, n, k, torch.bfloat16)
            if plan.form == "fma":
                assert plan.grid(n)[0] >= 132, (m, n, k, plan)  # every SM of an H100 streams
            else:  # tiles enough for a quarter of the SMs or more: no split
                assert plan.grid(n)[0] >= rg.DOT_SPLIT_BELOW_TILES_PER_SM * 132 and plan.split_k == 1, (m, n, k, plan)
            assert k % plan.block_k == 0  # no masked K-tiles at these shapes (N = 11007 wraps its last tile)


def test_tiles_shrink_to_small_problems():
    plan = rg.plan_rmsnorm_gemv(1, 5, 1, torch.bfloat16)
    assert plan.block_n <= 8 and plan.block_k == 16
    dot = rg.plan_rmsnorm_gemv(rg.FMA_MAX_M + 1, 20, 40, torch.bfloat16)
    assert dot.block_n == 32 and dot.block_k == 64  # never below tl.dot's 16


def test_plan_is_recorded_with_the_form():
    plan = plan_rmsnorm_linear(4, 4096, 4096, torch.bfloat16)
    assert plan.config == rg.plan_rmsnorm_gemv(4, 4096, 4096, torch.bfloat16).as_dict()
    assert GemvPlan(**plan.config) == rg.plan_rmsnorm_gemv(4, 4096, 4096, torch.bfloat16)


# ---------------------------------------------------------------------------------------------------------
# The call path: checks and plans once per layout, nothing else allocated, autograd only when needed
# ---------------------------------------------------------------------------------------------------------


def test_call_layout_is_cached_and_the_checks_still_hold(device, gen, monkeypatch):
    x, weight, gamma = _operands(2, 32, 16, torch.bfloat16, device, gen)
    rl_module._CALLS.clear()
    rmsnorm_linear(x, weight, gamma, EPS)
    assert len(rl_module._CALLS) == 1
    checks = []
    real = rl_module.check_rmsnorm_linear_inputs
    monkeypatch.setattr(rl_module, "check_rmsnorm_linear_inputs", lambda *a: checks.append(a) or real(*a))
    rmsnorm_linear(x.clone(), weight, gamma, EPS)  # same layout: no checks, no new entry
    assert checks == [] and len(rl_module._CALLS) == 1
    with pytest.raises(ValueError, match="eps must be finite and >= 0"):
        rmsnorm_linear(x, weight, gamma, -1.0)  # another eps is another key: checked
    with pytest.raises(TypeError, match="eps must be a real number, got bool"):
        rmsnorm_linear(x, weight, gamma, True)  # True == 1 but is not a valid eps
    with pytest.raises(TypeError, match="gamma has dtype float16"):
        rmsnorm_linear(x, weight, gamma.half(), EPS)
    assert len(checks) == 3


def test_cached_cpu_call_rechecks_the_interpreter(device, gen, monkeypatch):
    if device != "cpu":
        pytest.skip("CPU tensors run only under the interpreter")
    x, weight, gamma = _operands(2, 32, 16, torch.bfloat16, device, gen)
    rmsnorm_linear(x, weight, gamma, EPS)
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET=1"):
        rmsnorm_linear(x, weight, gamma, EPS)


def test_inference_call_keeps_no_graph_and_no_r(device, gen, monkeypatch):
    x, weight, gamma = _operands(2, 32, 16, torch.bfloat16, device, gen)
    kept = []
    real = rl_module._launch_gemv
    monkeypatch.setattr(rl_module, "_launch_gemv", lambda *a, **k: kept.append(a[6]) or real(*a, **k))
    y = rmsnorm_linear(x, weight, gamma, EPS)
    assert y.grad_fn is None and kept == [None]
    y = rmsnorm_linear(x, weight.requires_grad_(), gamma, EPS)
    assert y.grad_fn is not None and kept[1] is not None and kept[1].dtype == torch.float32
    with torch.no_grad():
        assert rmsnorm_linear(x, weight, gamma, EPS).grad_fn is None and kept[2] is None


def test_gradients_through_the_gemv(device, gen):
    x, weight, gamma = (t.requires_grad_() for t in _operands(3, 32, 16, torch.float16, device, gen))
    dy = _draw((3, 16), torch.float16, device, gen)
    rmsnorm_linear(x, weight, gamma, EPS).backward(dy)
    leaves = [t.detach().double().requires_grad_() for t in (x, weight, gamma)]
    reference.rmsnorm_linear_float64(*leaves, EPS).backward(dy.double())
    for t, ref in zip((x, weight, gamma), leaves):
        assert rel_err(t.grad, ref.grad) <= BOUNDS[torch.float16]


def test_forced_in_loop_rms_reaches_the_kernel(device, gen):
    m = rg.FMA_MAX_M + 1  # the tensor-core form: float16 takes the pre-pass
    x, weight, gamma = _operands(m, 32, 16, torch.float16, device, gen)
    plan = plan_rmsnorm_linear(m, 16, 32, torch.float16)
    assert plan.rms == "pre-pass"
    y = rl_module.rmsnorm_linear_fwd(x, weight, gamma, EPS, replace(plan, rms="in-loop"))[0]
    _check(y, x, weight, gamma)  # in range: both modes agree


def test_fusion_post_decode_table_follows_from_the_byte_counts():
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "docs" / "posts" / "kernel-fusion.md").read_text(encoding="utf-8")
    rows = re.findall(r"^\| (\d+) × (\d+) \| ([\d.]+) \| ([\d.]+) \| ([\d.]+) \|$", text, re.MULTILINE)
    assert len(rows) == 4
    from experiments import _rmsnorm_linear as rl

    assert {(int(n), int(k)) for n, k, *_ in rows} == set(rl.DECODE_NK)
    for n, k, weight_mb, saved_1, saved_16 in rows:
        n, k = int(n), int(k)
        assert float(weight_mb) == pytest.approx(2 * n * k / 1e6, abs=0.06)
        for m, saved in ((1, saved_1), (16, saved_16)):  # h = x * r * gamma written and read back, bf16
            assert float(saved) == pytest.approx(2 * 2 * m * k / 1e3, abs=0.06)


def test_bound_launchers_are_kept_per_layout_and_alignment(device, gen):
    x, weight, gamma = _operands(4, 64, 48, torch.bfloat16, device, gen)
    rl_module._CALLS.clear()
    _check(rmsnorm_linear(x, weight, gamma, EPS), x, weight, gamma)
    (call,) = rl_module._CALLS.values()
    assert list(call.bound) == [(False, True, True, True)]
    first = call.bound[(False, True, True, True)]
    _check(rmsnorm_linear(x.clone(), weight, gamma, EPS), x, weight, gamma)
    assert call.bound[(False, True, True, True)] is first  # reused, not rebound
    # A view whose data is not 16-byte aligned: the same shapes and strides, another launcher.
    buf = _draw((4 * 64 + 1,), torch.bfloat16, device, gen)
    shifted = buf[1:].view(4, 64)
    _check(rmsnorm_linear(shifted, weight, gamma, EPS), shifted, weight, gamma)
    assert (False, False, True, True) in call.bound
    # float16 on the tensor cores takes the r pre-pass, through the ordinary launch.
    xh, wh, gh = _operands(4, 64, 48, torch.float16, device, gen)
    _check(rmsnorm_linear(xh, wh, gh, EPS), xh, wh, gh)


def test_cuda_graph_capture_and_replay(device, gen):
    if device != "cuda":
        pytest.skip("CUDA graphs need a GPU")
    from kernels.dequant_linear import int4_linear
    from kernels.quantize import quantize_int4

    x, weight, gamma = _operands(4, 512, 300, torch.bfloat16, device, gen)
    w_packed, scales = quantize_int4(weight, 128)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm up: plans, bound launchers, workspaces
        rmsnorm_linear(x, weight, gamma, EPS)
        int4_linear(x, w_packed, scales, 128)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = rmsnorm_linear(x, weight, gamma, EPS)
        y4 = int4_linear(x, w_packed, scales, 128)
    for _ in range(2):  # new inputs in the captured buffers; the split-K counters must be at rest each time
        x.copy_(_draw((4, 512), torch.bfloat16, device, gen))
        graph.replay()
        torch.cuda.synchronize()
        _check(y, x, weight, gamma)
        ref = reference.int4_linear_reference(x.double(), w_packed, scales.double(), 128)
        assert rel_err(y4, ref) <= BOUNDS[torch.bfloat16]
