"""Which roof a figure is a share of (lab.publish.ceilings), the notes a page adds, the quantised decoder
profiles' own byte models, and hosts named by alias on the pages and in the published records."""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent / "fixtures" / "lab"))
sys.path.insert(0, str(Path(__file__).parent))

import lab_synthetic as syn  # noqa: E402

from experiments.spec import COMPUTE, MEMORY, READ, READ2_WRITE, Case, Profile  # noqa: E402
from lab.evidence.records import CopyCeiling, MatmulPeak  # noqa: E402
from lab.publish import ceilings  # noqa: E402
from lab.publish import formatting as fmt  # noqa: E402

BYTES = 128  # lab_synthetic's byte model: 128 bytes a call
MS_AT_1_GBPS = BYTES / 1e9 * 1e3  # the median that makes 128 bytes 1 GB/s


def _run(point, **fields):
    return replace(syn.run([point]), copy_ceiling=CopyCeiling(10.0, 1 << 30, (1.0,)), **fields)


def _point(ms=MS_AT_1_GBPS, flops=None, name="subject"):
    return replace(syn.point({name: syn.timed([ms] * 3)}), flops=flops)


def test_a_memory_bound_point_is_a_share_of_the_ceiling_matching_its_traffic():
    point = _point(MS_AT_1_GBPS / 4)  # 4 GB/s
    run = _run(point, read_ceiling=CopyCeiling(8.0, 1 << 30, (1.0,)),
               read2_write_ceiling=CopyCeiling(5.0, 1 << 30, (1.0,)))
    for traffic, pct in (("copy", "40% of copy"), (READ, "50% of read"), (READ2_WRITE, "80% of 2:1")):
        experiment = replace(syn.experiment(), traffic=traffic)
        got = ceilings.share(experiment, point, run, "subject", point.results["subject"], MS_AT_1_GBPS / 4)
        assert got.pct == pct and got.rate == "4.0 GB/s" and not got.above
        assert ceilings.notes(experiment, run, [got], [point]) == ""


def test_a_figure_above_its_ceiling_is_marked_and_the_page_says_why():
    point = _point(MS_AT_1_GBPS / 12)  # 12 GB/s against a 10 GB/s copy ceiling
    run = _run(point)
    experiment = syn.experiment()
    got = ceilings.share(experiment, point, run, "subject", point.results["subject"], MS_AT_1_GBPS / 12)
    assert got.above and got.pct == f"120% of copy{ceilings.ABOVE_MARK}"
    note = ceilings.notes(experiment, run, [got], [point])
    assert note.startswith(f"{ceilings.ABOVE_MARK} Above its ceiling: ") and "L2" in note
    close = ceilings.share(experiment, point, run, "subject", point.results["subject"], MS_AT_1_GBPS / 10.2)
    assert close.above and close.pct == f"102% of copy{ceilings.ABOVE_MARK}"
    assert "within the spread" in ceilings.notes(experiment, run, [close], [point])
    declared = replace(experiment, above_ceiling="the gains vector is re-read from the L2 by every row")
    assert "re-read from the L2 by every row" in ceilings.notes(declared, run, [got], [point])
    under = ceilings.share(experiment, point, run, "subject", point.results["subject"], MS_AT_1_GBPS / 9)
    assert not under.above and ceilings.notes(experiment, run, [under], [point]) == ""


def test_a_run_without_the_declared_ceiling_falls_back_to_copy_and_says_so():
    point = _point(MS_AT_1_GBPS / 11)
    run = _run(point)  # made before read ceilings existed
    experiment = replace(syn.experiment(), traffic=READ2_WRITE)
    top = ceilings.roof(experiment, point, run)
    assert top.stand_in and top.name == "copy" and top.value == 10.0
    got = ceilings.share(experiment, point, run, "subject", point.results["subject"], MS_AT_1_GBPS / 11)
    note = ceilings.notes(experiment, run, [got], [point])
    assert "predates the 2:1 ceiling" in note and "streams faster than a copy" in note


def test_a_compute_bound_point_is_tflops_against_the_matmul_peak():
    flops = 10**12
    point = _point(1000.0, flops=flops)  # 1 TFLOP/s
    peak = MatmulPeak(4.0, 8, 8, 8, "bfloat16", (2 * 8**3 / 4.0 / 1e9,))
    experiment = replace(syn.experiment(), bound=COMPUTE)
    got = ceilings.share(experiment, point, _run(point, matmul_peak=peak), "subject", point.results["subject"], 1000.0)
    assert got.rate == "1.00 TFLOP/s" and got.pct == "25% of matmul peak"
    older = ceilings.share(experiment, point, _run(point), "subject", point.results["subject"], 1000.0)
    assert older.rate == "1.00 TFLOP/s" and older.pct == "no matmul peak in this run"


def test_the_bound_may_depend_on_the_case_and_an_unreadable_case_is_memory_bound():
    experiment = replace(syn.experiment(), bound=lambda case: COMPUTE if case["S"] > 1 else MEMORY)
    assert experiment.bound_of(Case("p", {"S": 4})) == COMPUTE
    assert experiment.bound_of(Case("d", {"S": 1})) == MEMORY
    assert experiment.bound_of(Case("old", {"M": 2})) == MEMORY  # no S: a KeyError reads as memory-bound
    with pytest.raises(ValueError, match="Experiment.traffic"):
        replace(syn.experiment(), traffic="write")
    with pytest.raises(ValueError, match="Experiment.bound"):
        replace(syn.experiment(), bound="latency")


def test_a_profile_with_its_own_byte_model_is_divided_by_it_even_in_an_older_record():
    point = _point(MS_AT_1_GBPS)
    run = _run(point)
    experiment = syn.experiment()
    own = replace(experiment, profiles=tuple(replace(p, bytes_moved=lambda case, dtype: BYTES // 2)
                                             if p.name == "subject" else p for p in experiment.profiles))
    result = point.results["subject"]
    assert ceilings.share(experiment, point, run, "subject", result, MS_AT_1_GBPS).rate == "1.0 GB/s"
    assert ceilings.share(own, point, run, "subject", result, MS_AT_1_GBPS).rate == "0.5 GB/s"  # declared
    recorded = replace(result, bytes_moved=BYTES // 4)
    assert ceilings.share(own, point, run, "subject", recorded, MS_AT_1_GBPS).rate == "0.2 GB/s"  # the record's own


def test_compute_bound_pages_show_the_share_of_the_matmul_peak():
    from lab.publish.render import render_outputs
    from lab.publish.collect import collect_evidence
    from lab.evidence.store import write_record

    point = _point(1000.0, flops=2 * 10**12)
    peak = MatmulPeak(8.0, 8, 8, 8, "bfloat16", (2 * 8**3 / 8.0 / 1e9,))
    experiment = replace(syn.experiment(slug="bound-page"), bound=COMPUTE, flops=lambda case, dtype: 2 * 10**12)
    run = replace(_run(point, matmul_peak=peak), experiment=experiment.slug)
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        write_record(run, Path(folder))
        evidence = collect_evidence({experiment.slug: experiment}, (), Path(folder), {experiment.slug: {}})
    page = render_outputs(evidence)[f"experiments/{experiment.slug}.md"]
    assert "2.00 TFLOP/s (25% of matmul peak)" in page
    assert "% of copy" not in page


# --------------------------------------------------------------------------------------------------------
# The decoder block's quantised profiles count their own weights


def test_the_quantised_decoder_profiles_count_quantised_weights_and_scales():
    from experiments import _decoder as dec
    from experiments.decoder_block import EXPERIMENT

    case, dtype = dec.decode_case(1, 1024), torch.bfloat16
    base = EXPERIMENT.bytes_moved(case, dtype)
    rest = base - dec.PARAMETERS * 2  # hidden states and KV cache, alike for every profile
    projections = sum(n * k for n, k in dec.PROJECTION_SHAPES)
    rows = sum(n for n, _ in dec.PROJECTION_SHAPES)
    assert projections + dec.NORM_PARAMETERS == dec.PARAMETERS
    int8 = EXPERIMENT.profile("lab-int8").bytes_moved(case, dtype)
    int4 = EXPERIMENT.profile("lab-int4").bytes_moved(case, dtype)
    assert int8 == rest + projections + 2 * rows + 2 * dec.NORM_PARAMETERS  # 1 byte a weight, a bf16 scale a row
    assert int4 == rest + projections // 2 + 2 * sum(n * (k // 128) for n, k in dec.PROJECTION_SHAPES) \
        + 2 * dec.NORM_PARAMETERS  # half a byte a weight, a bf16 scale per 128 inputs
    assert int4 < int8 < base
    assert EXPERIMENT.profile("lab").bytes_moved is None  # the unquantised block keeps the experiment's model
    assert EXPERIMENT.bound_of(case) == MEMORY and EXPERIMENT.bound_of(dec.prefill_case(1, 1024)) == COMPUTE
    assert EXPERIMENT.traffic == READ


# --------------------------------------------------------------------------------------------------------
# Hosts


def test_a_host_is_named_by_a_stable_alias_unless_real_names_are_asked_for(monkeypatch):
    import hashlib

    monkeypatch.delenv(fmt.SHOW_HOSTS, raising=False)
    alias = fmt.host_label("gpu-node-17.internal")
    assert alias == "host-" + hashlib.sha256(b"gpu-node-17.internal").hexdigest()[:6]
    assert alias == fmt.host_label("gpu-node-17.internal") != fmt.host_label("gpu-node-18.internal")
    assert fmt.host_label(None) == "" and fmt.host_label("") == ""
    monkeypatch.setenv(fmt.SHOW_HOSTS, "1")
    assert fmt.host_label("gpu-node-17.internal") == "gpu-node-17.internal"


def test_pages_and_published_records_never_name_the_host(monkeypatch, tmp_path):
    from lab.evidence.store import write_record
    from lab.publish.collect import collect_evidence
    from lab.publish.render import render_outputs
    from sitetools import load_tool

    monkeypatch.delenv(fmt.SHOW_HOSTS, raising=False)
    host = "secret-node-42"
    experiment = syn.experiment(slug="host-page")
    run = replace(syn.run([_point()], slug=experiment.slug),
                  environment={"gpu_key": syn.GPU_A[0], "gpu_name": syn.GPU_A[1], "host": host})
    path = write_record(run, tmp_path)
    evidence = collect_evidence({experiment.slug: experiment}, (), tmp_path, {experiment.slug: {}})
    outputs = render_outputs(evidence)
    assert not any(host in text for text in outputs.values() if isinstance(text, str))
    assert f"host {fmt.host_label(host)}" in outputs[f"experiments/{experiment.slug}.md"]

    hooks = load_tool("mkdocs_hooks")
    assert hooks.host_alias(host) == fmt.host_label(host)
    import gzip

    raw = gzip.open(path).read() if path.suffix == ".gz" else path.read_bytes()
    published = json.loads(hooks.published_record(raw))
    assert published["environment"]["host"] == fmt.host_label(host) and host not in json.dumps(published)
    assert json.loads(raw)["environment"]["host"] == host  # the record itself keeps the name
    monkeypatch.setenv(fmt.SHOW_HOSTS, "1")
    assert hooks.published_record(raw) == raw
