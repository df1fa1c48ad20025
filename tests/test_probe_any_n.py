"""The any-N softmax probes (probes/softmax_any_n*.py): every round resolves to a runner, and the
plans each round would time are valid plans of the row they are for (CPU; the timing itself needs a GPU)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from labtools import run_compiled
from probes import harness
from probes import softmax_any_n_backward as backward
from probes import softmax_any_n_forward as forward


def test_every_round_has_a_runner():
    for k in range(2, 6):
        assert callable(getattr(forward, f"run_round{k}"))
    for k in range(6, 11):
        assert callable(getattr(backward, f"run_round{k}"))


@pytest.mark.parametrize("plans", [harness.lab_plans, forward.round2_plans, backward.round6_plans,
                                   backward.round7_plans, backward.round8_plans, backward.round9_plans,
                                   backward.round10_plans])
@pytest.mark.parametrize("n,dtype", [(9512, torch.bfloat16), (50257, torch.bfloat16), (4396, torch.float32)])
def test_round_plans_are_plans_of_the_row(plans, n, dtype, monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda *a: type("P", (), {"multi_processor_count": 132}))
    m = 1000
    for direction in ("forward", "backward"):
        for name, plan in plans(m, n, dtype, direction):
            assert isinstance(name, str) and name
            lanes = plan.block_n * plan.splits if plan.impl == "split_row" else plan.block_n + plan.tail_n
            assert plan.impl == "online" or lanes >= n or plan.edges, (name, plan)
            assert plan.grid >= 1 and plan.num_warps in (1, 2, 4, 8, 16, 32)


@pytest.mark.parametrize("n", [40, 64, 77])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("passes", [2, 3])
def test_round11_forward_reading_the_row_again_matches_float64(n, dtype, passes):
    """The forward variant round 11 times: cut and uncut rows, both pass counts, NaN-free and within bounds."""
    from kernels import reference

    x = (torch.randn(5, n, generator=torch.Generator().manual_seed(n)) * 3).to(dtype)
    y = forward.reload_forward(x, 4, passes, "test")()
    want = reference.softmax_float64(x)
    assert not torch.isnan(y).any()
    assert (y.double() - want).abs().max() <= (2e-2 if dtype == torch.bfloat16 else 1e-6)
    assert callable(forward.run_round11)


@pytest.mark.parametrize("n", [9512, 21439, 75029, 262144])
def test_round12_cluster_settings_cover_the_row(n):
    from probes import softmax_any_n_cluster as cluster

    settings = cluster.cluster_settings(n)
    assert settings and callable(cluster.run_round12)
    for size, block_n, warps in settings:
        assert 2 <= size <= cluster.MAX_CLUSTER and size * block_n >= n + (n % 16 != 0) * 16
        assert warps in (2, 4, 8, 16)
    assert all(cluster.cluster_settings(length) for length, _ in cluster.ROUND12_N + cluster.ROUND13_N)
    assert callable(cluster.run_round13)


_COMPILE_FOR_HOPPER = """
import sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
sys.path[:0] = [sys.argv[1]]
from probes import softmax_any_n_cluster as cluster
signature = {"x_ptr": "*bf16", "y_ptr": "*bf16", "part_m_ptr": "*fp32", "part_d_ptr": "*fp32", "n_cols": "i32",
             "x_row_stride": "i32", "y_row_stride": "i32"}
constexprs = {"BLOCK_N": 2048, "CLUSTER": 3, "CLUSTER_POW2": 4, "EDGES": sys.argv[2] == "1", "VEC": 8}
src = ASTSource(fn=cluster._fwd_cluster_kernel, signature={**signature, **dict.fromkeys(constexprs, "constexpr")},
                constexprs=constexprs)
print(triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 2}).asm["ptx"])
"""


@pytest.mark.parametrize("edges", [False, True])
def test_round12_kernel_meets_at_the_cluster_barrier_after_storing_its_partials(edges, tmp_path):
    """Compiled for Hopper without a GPU (outside the interpreter): the partials are stored before the barrier
    and read after it, past L1."""
    ptx = run_compiled(["-c", _COMPILE_FOR_HOPPER, str(Path(__file__).resolve().parents[1]), str(int(edges))], tmp_path)
    arrive = ptx.index("barrier.cluster.arrive")
    assert ptx.index("barrier.cluster.wait") > arrive
    body = ptx[:arrive]
    assert body.count("st.global.b32") >= 2  # m and d, before the barrier
    assert "ld.global.cg" in ptx[arrive:] and "ld.global.cg" not in body


@pytest.mark.parametrize("n", [40, 64, 77, 300])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_round14_packed_forward_matches_the_lab_kernel_bit_for_bit(n, dtype):
    """Round 14's kernels under the interpreter (one slice a row, and one row a program): the words unpacked,
    reduced and packed back give the lab's forward within one unit of the last place (its sums may add in
    another order), cut rows (n not a multiple of 16) included."""
    from probes import softmax_any_n_packed as packed

    from kernels import reference
    from kernels.softmax import softmax

    x = (torch.randn(5, n, generator=torch.Generator().manual_seed(n)) * 3).to(dtype)
    want = softmax(x)
    for y in (packed.split_forward(x, 512, 4, False)(), packed.row_forward(x, 4)()):
        assert not torch.isnan(y).any()
        assert (y.double() - want.double()).abs().max() <= torch.finfo(dtype).eps
    assert (want.double() - reference.softmax_float64(x)).abs().max() <= 4e-3


@pytest.mark.parametrize("n,dtype", [(2057, torch.bfloat16), (4610, torch.bfloat16), (9177, torch.bfloat16),
                                     (9512, torch.bfloat16), (19211, torch.bfloat16), (4396, torch.float32),
                                     (8244, torch.float32)], ids=str)
def test_round14_plans_are_one_row_plans_that_hold_the_row(n, dtype, monkeypatch):
    """The lab-kernel variants of round 14, planned as on a GPU of 132 SMs (the pipelined plans among them):
    one row a program, every lane of the row held, and under the interpreter equal to the auto plan's output."""
    import dataclasses

    from probes import softmax_any_n_packed as packed

    from kernels.softmax import softmax_fwd

    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda *a: type("P", (), {"multi_processor_count": 132}))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    plans = packed.round14_plans(1000, n, dtype, "forward")
    assert plans[0][0] == "auto" and len({name for name, _ in plans}) == len(plans) > 1
    x = (torch.randn(2, n, generator=torch.Generator().manual_seed(n)) * 3).to(dtype)
    want = softmax_fwd(x, dataclasses.replace(plans[0][1], stages=1, grid=2))
    for name, plan in plans[1:]:
        assert plan.impl == "single_block" and plan.stages == 1 and plan.rows_per_program == 1, name
        assert plan.block_n + plan.tail_n >= n + 16 * plan.edges, name
        y = softmax_fwd(x, dataclasses.replace(plan, grid=2))
        assert (y.double() - want.double()).abs().max() <= torch.finfo(dtype).eps, name


def test_round14_candidates_cover_the_rows_they_name():
    from probes import softmax_any_n_packed as packed

    assert all(dtype == torch.float32 for _, dtype in packed.ROUND14_FP32_N)
    for n, dtype in packed.ROUND14_N + packed.ROUND14_SINGLE_N:
        assert dtype in packed.NEG_INF_PAIR
        names = [name for name, _ in packed.round14_candidates(n)]
        assert names and len(set(names)) == len(names)
        for block_n, _, _ in packed.ROUND14_SPLITS:
            assert packed.slices(n, block_n) * block_n >= n + (n % 16 != 0) * 16
    assert callable(packed.run_round14)
    with pytest.raises(ValueError, match="2-byte"):
        packed.row_forward(torch.zeros(2, 64), 4)


_COMPILE_PACKED_FOR_HOPPER = """
import sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
sys.path[:0] = [sys.argv[1]]
import torch
from probes import softmax_any_n_packed as packed
kernel = packed._fwd_split_packed_kernel
signature = {"x_ptr": "*bf16", "y_ptr": "*bf16", "part_m_ptr": "*fp32", "part_d_ptr": "*fp32", "sync_ptr": "*i32",
             "n_cols": "i32", "n_splits": "i32", "x_row_stride": "i32", "y_row_stride": "i32"}
constexprs = {"BLOCK_N": 8192, "SPLITS_POW2": 8, "EDGES": True, "VEC": 8, "CLUSTER": False, "IS_BF16": True,
              "NEG_INF": packed.NEG_INF_PAIR[torch.bfloat16], "OPAQUE": True}
attrs = {(kernel.arg_names.index(k),): [["tt.divisibility", 16]] for k, v in signature.items() if v[0] == "*"}
src = ASTSource(fn=kernel, signature={**signature, **dict.fromkeys(constexprs, "constexpr")}, constexprs=constexprs,
                attrs=attrs)
print(triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4}).asm["ptx"])
"""


def test_round14_kernel_loads_words_as_vectors_and_unpacks_them_again_after_the_wait(tmp_path):
    """Compiled for Hopper with the launch's pointer alignment, without a GPU: the body is loaded and stored as
    16-byte vectors of words, and the words are unpacked again after the row's slices have met."""
    ptx = run_compiled(["-c", _COMPILE_PACKED_FOR_HOPPER, str(Path(__file__).resolve().parents[1])], tmp_path)
    assert ptx.count("ld.global.v4.b32") == 8 and ptx.count("st.global.v4.b32") == 8  # 64 lanes a thread
    wait = ptx.index("release.exch")  # the last slice's reset of the row's counter, in the arrival
    assert ptx.count("ex2.approx", 0, wait) >= 64 and ptx.count("ex2.approx", wait) >= 64  # exp again for the store


def test_round14_caps_the_lab_plans_whose_compiled_kernels_fit_fewer_programs(monkeypatch):
    """The capped lab candidates: the pipelined 16-warp plan (21,439 on a GPU of 132 SMs) at 64 registers, the
    split-row 8192 x 4 plan at 80, nothing else; a capped launch writes what the plan's launch writes."""
    from probes import softmax_any_n_packed as packed

    from kernels import softmax_plan
    from kernels.softmax import plan_softmax, softmax

    monkeypatch.setattr(softmax_plan, "device_sms", lambda *a: 132)
    names = {n: [name for name, _ in packed.lab_capped_candidates(4000, n, torch.bfloat16)]
             for n in (9512, 21439, 41187)}
    assert names == {9512: [], 21439: ["lab:auto-r64"], 41187: ["lab:auto-r80"]}
    x = (torch.randn(3, 77, generator=torch.Generator().manual_seed(1)) * 3).to(torch.bfloat16)
    y = packed.lab_capped(x, plan_softmax(3, 77, torch.bfloat16, "auto", True, "forward"), 64)()
    assert torch.equal(y, softmax(x))


@pytest.mark.parametrize("n,dtype", [(1881, torch.bfloat16), (2490, torch.float16), (4610, torch.bfloat16),
                                     (6445, torch.float16), (8192, torch.bfloat16), (21439, torch.bfloat16),
                                     (4396, torch.float32)], ids=str)
def test_round15_rules_change_only_what_they_name(n, dtype, monkeypatch):
    """Each rule plan of round 15 differs from the auto plan only in what its rule names, holds the whole row,
    and gives the auto plan's output under the interpreter."""
    import dataclasses

    from probes import softmax_any_n_rules as rules

    from kernels.softmax import softmax_fwd

    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda *a: type("P", (), {"multi_processor_count": 132}))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    plans = dict(rules.rule_plans(1000, n, dtype, sms=132))
    auto = plans.pop("auto")
    if dtype == torch.float32:
        assert not plans
        return
    x = (torch.randn(2, n, generator=torch.Generator().manual_seed(n)) * 3).to(dtype)
    want = softmax_fwd(x, dataclasses.replace(auto, stages=1, grid=2))
    for name, plan in plans.items():
        changed = {f.name for f in dataclasses.fields(plan) if getattr(plan, f.name) != getattr(auto, f.name)}
        allowed = {"rule:half-warps": {"num_warps"}, "rule:wide-tail-4096": {"block_n", "tail_n", "num_warps"},
                   "rule:pipelined-one-per-sm": {"grid"}}[name]
        assert changed and changed <= allowed, (name, changed)
        if name == "rule:half-warps":
            assert plan.block_n * dtype.itemsize // (32 * plan.num_warps) == 64
        if name == "rule:pipelined-one-per-sm":
            assert plan.grid == 132 < auto.grid
            continue
        assert plan.block_n + plan.tail_n >= n
        y = softmax_fwd(x, dataclasses.replace(plan, grid=2))
        assert (y.double() - want.double()).abs().max() <= torch.finfo(dtype).eps, name


def test_round15_shapes_are_the_draws_2_byte_lengths():
    from probes import softmax_any_n_rules as rules

    from experiments._any_n import draw_row_lengths

    shapes = rules.round15_shapes()
    assert all(dtype in (torch.bfloat16, torch.float16) for _, dtype in shapes)
    assert len(set(shapes)) == len(shapes)
    drawn = set(draw_row_lengths())
    assert {n for n, _ in shapes} - set(rules.POW2_N) <= drawn
    assert callable(rules.run_round15)
    shapes16 = rules.round16_shapes()
    assert {n for n, dt in shapes16 if dt == torch.float32} >= {n for n in drawn if n >= rules.SPLIT_MIN_N}
    for n, dtype in shapes16:
        if dtype != torch.float32:  # rows filling 80-92% of a block the halved-warps rule covers
            block = 1 << (n - 1).bit_length()
            assert block in rules.HALF_WARPS_LANES and 0.8 <= n / block <= 0.92
    assert callable(rules.run_round16)


def test_round17_shapes_fit_a_cluster_of_8192_lane_slices():
    from probes import softmax_any_n_cluster as cluster

    from kernels._launch import MAX_CLUSTER

    shapes = cluster.round17_shapes()
    assert shapes and all(dtype in (torch.bfloat16, torch.float16) for _, dtype in shapes)
    for n, _ in shapes:
        settings = cluster.cluster_settings(n, ((8192, 4),))
        assert len(settings) == 1 and 2 <= settings[0][0] <= MAX_CLUSTER
        assert settings[0][0] * 8192 >= n + 16 * (n % 16 != 0)
    assert callable(cluster.run_round17)


def test_round18_shapes_and_variants_are_well_formed():
    """Round 18 (probes/softmax_any_n_smem.py): 2-byte rows that need split rows, every variant's slices tile the
    row's aligned body within the partials a row reads, its chunks tile its slice, names unique; the round is
    offered on the command line."""
    from probes import softmax_any_n_smem as smem

    assert len(set(smem.ROUND18_N)) == len(smem.ROUND18_N)
    assert all(dtype in (torch.bfloat16, torch.float16) and n > 32768 for n, dtype in smem.ROUND18_N)
    names = [smem.variant_name(*v) for v in smem.ROUND18_VARIANTS]
    assert len(set(names)) == len(names) and all(name.startswith("smem-") for name in names)
    for copy, slice_n, warps, cap in smem.ROUND18_VARIANTS:
        assert copy in smem.COPIES and warps in (4, 8) and cap in (0, 32, 40, 48)
        meta = smem._meta(copy, slice_n, warps)
        assert slice_n % (meta["CHUNK_ROWS"] * smem.BOX) == 0
        assert meta["CHUNK_ROWS"] * smem.BOX == smem.LANES_A_THREAD * 32 * warps
        for n, _ in smem.ROUND18_N:
            k = smem.splits(n, slice_n)
            body = n // 8 * 8  # the longest aligned body a row of n has
            assert 1 <= k <= smem.MAX_SPLITS_POW2 and (k - 1) * slice_n < body <= k * slice_n, (n, slice_n)
    assert callable(smem.run_round18)
    assert callable(smem.main)


def test_round18_refuses_what_its_kernel_cannot_take():
    from probes import softmax_any_n_smem as smem

    with pytest.raises(ValueError, match="2-byte"):
        smem.smem_forward(torch.zeros(4, 64), "ld", 8192, 4)
    with pytest.raises(ValueError, match="slices a row"):
        smem.smem_forward(torch.zeros(2, 65 * 8192 + 8, dtype=torch.bfloat16), "ld", 8192, 4)


_COMPILE_SMEM_FOR_HOPPER = """
import json, sys, torch
sys.path[:0] = [sys.argv[1]]
from probes import softmax_any_n_smem as smem
out = {}
for v in smem.ROUND18_VARIANTS:
    if v[1] == 8192 and not v[3]:
        out[smem.variant_name(*v)] = smem.compile_variant(*v, dtype=torch.float16).asm["ptx"]
print(json.dumps(out))
"""


def test_round18_kernels_compile_for_hopper_and_stage_the_slice_in_shared_memory(tmp_path):
    """Compiled for sm_90 without a GPU: each copy fills the shared buffer its own way (a bulk tensor copy a
    row of 256 lanes, an mbarrier wait a chunk; cp.async of 16 bytes; plain 16-byte loads), the body is stored
    as 16-byte vectors, and the row's partials are read after the arrival, past the caches."""
    import json

    from probes import softmax_any_n_smem as smem

    ptx = json.loads(run_compiled(["-c", _COMPILE_SMEM_FOR_HOPPER, str(Path(__file__).resolve().parents[1])],
                                  tmp_path))
    assert set(ptx) == {"smem-tma8192w4", "smem-cp8192w4", "smem-ld8192w4"}
    rows, chunks = 8192 // smem.BOX, 8192 // (smem.LANES_A_THREAD * 32 * 4)
    tma = ptx["smem-tma8192w4"]
    assert tma.count("cp.async.bulk.tensor.2d") == rows and tma.count("mbarrier.try_wait") == chunks
    assert tma.count("mbarrier.arrive.expect_tx") == chunks and "ld.global.v4" not in tma
    assert ptx["smem-cp8192w4"].count("cp.async.cg.shared.global") == 8192 // (8 * 128)
    assert ptx["smem-ld8192w4"].count("ld.global.v4.b32") == 8192 // (8 * 128)
    for name, text in ptx.items():
        assert text.count("st.global.v4.b32") == 8192 // (8 * 128), name  # pass 2: the body as vectors
        assert text.count("ld.shared.v4.b32") >= 8192 // (8 * 128), name
        arrive = text.index("atom.global.gpu.acq_rel.add", text.index("st.global.b32"))
        assert "ld.volatile.global" in text[arrive:] and "ld.volatile.global" not in text[:arrive], name
