"""The probes room: every probe imports on a CPU and declares its question, candidates, shapes and raw outputs;
probes/rounds.toml names every round those outputs belong to; the lab notebook renders one page a round from
them, byte for byte the same twice, skipping (and naming) an output that fails validation."""

from __future__ import annotations

import gzip
import importlib
import json
import pkgutil
import shutil
from pathlib import Path

import pytest

import probes
from lab.publish.notebook import load_rounds, render_notebook

ROOT = Path(__file__).resolve().parents[1]
SHARED = {"harness", "compiled", "int4_parts", "attention_forms"}


def _probes():
    return {m.name: importlib.import_module(f"probes.{m.name}") for m in pkgutil.iter_modules(probes.__path__)
            if m.name not in SHARED}


def test_every_probe_declares_what_it_asks_times_and_wrote():
    declared = {}
    for name, module in _probes().items():
        assert module.__doc__ and isinstance(module.QUESTION, str) and module.QUESTION.endswith("?"), name
        assert module.CANDIDATES and module.SHAPES, name
        for rid, outputs in module.OUTPUTS.items():
            assert rid not in declared, f"{rid} declared by {declared.get(rid)} and {name}"
            declared[rid] = name
            assert outputs and all((ROOT / o).is_file() and o.startswith("notes/probes/") for o in outputs), rid
    rounds, problems = load_rounds(ROOT)
    assert problems == []
    by_id = {r.id: r for r in rounds}
    assert len(by_id) == len(rounds)
    for rid, name in declared.items():  # every declared output is a round of the notebook, from its probe
        assert by_id[rid].probe == f"probes/{name}.py"
        assert sorted(by_id[rid].outputs) == sorted(_probes()[name].OUTPUTS[rid])
    for r in rounds:
        assert not r.probe or (ROOT / r.probe).is_file(), r.id


def test_every_raw_output_the_notes_cite_has_a_round():
    outputs = [*(ROOT / "notes" / "probes").glob("*.json"), *(ROOT / "notes" / "probes").glob("*.json.gz")]
    cited = {p for p in outputs if not p.name.endswith("-record.json.gz")  # run records kept beside the notes
             and any(p.name in n.read_text(encoding="utf-8") for n in (ROOT / "notes").glob("*.md"))}
    rounds, _ = load_rounds(ROOT)
    listed = {ROOT / o for r in rounds for o in r.outputs}
    assert cited and cited <= listed, sorted(str(p) for p in cited - listed)


def test_the_notebook_renders_every_round_and_the_same_bytes_twice():
    pages, problems = render_notebook(ROOT)
    rounds, _ = load_rounds(ROOT)
    assert problems == []
    assert set(pages) == {"probes/index.md"} | {f"probes/{r.id}.md" for r in rounds}
    assert render_notebook(ROOT)[0] == pages
    assert "not evidence" in pages["probes/any-n-17.md"]


def test_a_bad_output_is_skipped_and_named(tmp_path):
    shutil.copytree(ROOT / "notes", tmp_path / "notes")
    (tmp_path / "probes").mkdir()
    shutil.copy(ROOT / "probes" / "rounds.toml", tmp_path / "probes" / "rounds.toml")
    bad = tmp_path / "notes" / "probes" / "2026-11-24-h100-any-n-round1.json.gz"
    data = json.loads(gzip.decompress(bad.read_bytes()))
    data["rows"][0]["pct"] = float("nan")
    bad.write_bytes(gzip.compress(json.dumps(data).encode()))
    (tmp_path / "notes" / "probes" / "2026-11-24-h100-any-n-round2.json.gz").write_bytes(gzip.compress(b"[1, 2]"))
    (tmp_path / "notes" / "probes" / "2026-11-24-h100-any-n-round4.json.gz").write_bytes(b"not gzip")
    pages, problems = render_notebook(tmp_path)
    assert "probes/any-n-1.md" not in pages and "probes/any-n-2.md" not in pages and "probes/any-n-3.md" in pages
    assert "probes/any-n-4.md" not in pages
    assert any("round1.json" in p and "rows[0].pct" in p for p in problems)
    assert any("round2.json" in p and "JSON object" in p for p in problems)
    assert any("round4.json.gz" in p and "gzip" in p for p in problems)


def test_hostile_text_in_an_output_stays_inert(tmp_path):
    shutil.copytree(ROOT / "notes", tmp_path / "notes")
    (tmp_path / "probes").mkdir()
    shutil.copy(ROOT / "probes" / "rounds.toml", tmp_path / "probes" / "rounds.toml")
    path = tmp_path / "notes" / "probes" / "2026-11-25-h100-any-n-round17.json.gz"
    data = json.loads(gzip.decompress(path.read_bytes()))
    data["gpu"] = "<script>alert(1)</script> | [x](javascript:alert(1))"
    path.write_bytes(gzip.compress(json.dumps(data).encode()))
    page = render_notebook(tmp_path)[0]["probes/any-n-17.md"]
    assert "<script>" not in page and "](javascript:" not in page


def test_rows_holding_one_result_a_candidate_are_summarised_per_candidate():
    from lab.publish.notebook import _candidates_table

    rows = [{"seq_k": 128, "plan": {"us": 10.0, "rel_error": 1e-3}, "cudnn": {"us": 4.0}, "fast": {"error": "wrong"}},
            {"seq_k": 256, "plan": {"us": 30.0}, "cudnn": {"us": float("inf")}, "shape": {"batch": 2}}]
    table = "\n".join(_candidates_table(rows))
    assert "median µs" in table
    assert "| `plan` | 2 | 20 | 10 | 30 | 0 |" in table  # two shapes, their median, min and max
    assert "| `cudnn` | 1 | 4 | 4 | 4 | 0 |" in table  # a value that is no finite number is no timing
    assert "| `fast` | 0 | – | – | – | 1 |" in table
    assert "`shape`" not in table  # an object with neither a timing nor an error is no candidate
    # rows that name their candidate keep that form, and rows with neither still say so
    flat = "\n".join(_candidates_table([{"variant": "a", "tflops": 2.0}, {"variant": "b", "error": "x"}]))
    assert "median TFLOP/s" in flat and "| `a` | 1 | 2 | 2 | 2 | 0 |" in flat and "| `b` | 0 |" in flat
    assert _candidates_table([{"seq_k": 1}]) == ["1 rows; no candidate names or timings to summarise."]
    page = render_notebook(ROOT)[0]["probes/attention-fixed-cost.md"]
    assert "no candidate names" not in page and "`cudnn`" in page and "`persistent`" in page
    # host time leads where a row times both clocks of a call
    host = "\n".join(_candidates_table([{"m": 1, "jit": {"host_us": 60.0, "gpu_us": 10.0}, "bound": {"host_us": 20.0}}]))
    assert "median µs of host time" in host and "| `jit` | 1 | 60 | 60 | 60 | 0 |" in host


def test_the_attention_line_fit_reproduces_the_fits_its_rounds_recorded():
    from probes.harness import key_tile_fit, line_fit

    data = json.loads((ROOT / "notes/probes/2026-11-27-h100-attention-ramp-overlap-timed.json").read_text())
    for name, recorded in data["fits"].items():
        fit = key_tile_fit(data["walk"], name, data["sms"], 4)
        assert all(abs(fit[k] - recorded[k]) <= 1e-9 * abs(recorded[k]) for k in fit), (name, fit, recorded)
    exact = line_fit([1, 2, 4], [5.0, 7.0, 11.0])  # T = 3 + 2n
    assert abs(exact["fixed_us"] - 3) < 1e-12 and abs(exact["per_key_tile_us"] - 2) < 1e-12
    assert exact["worst_residual"] < 1e-12


def test_the_overlap_fault_forms_still_apply_to_the_overlap_probe():
    """Each form of probes/attention_overlap_fault.py is the overlap probe's source with one change: every
    change must still find its one place there, and the form must still be Python that differs from the base."""
    import ast

    from probes.attention_overlap_fault import SOURCE, form_source

    assert form_source("base") == SOURCE
    for name in ("dbg", "locate", "pad", "lockstep", "swap", "trace", "static"):
        text = form_source(name)
        ast.parse(text)
        assert text != SOURCE, name
    assert form_source("dbg").count("_dump(mask_ptr") == 2
    assert form_source("locate").count("_locate_q(mask_ptr") == form_source("locate").count("_locate_md(mask_ptr") == 1
    assert "def _loader" in form_source("swap") and "WG * Q_BUFFERS + nqb" in form_source("swap")
    trace = form_source("trace")
    assert "def _consume_tiles" in trace and trace.count("_trace(mask_base, c, WG") == 1
    static = form_source("static")
    assert static.count("_consume_tiles(o, p_prev, m, d, q_static") == 4 and "_consume_tiles(o, p_prev, m, d, q_view" not in static


def test_experiment_and_decision_pages_list_the_rounds_that_fed_them():
    """A page lists, in order, each notebook round whose `fed` names it, linked, with its kind, kept and dropped;
    a page no round fed has no such section; a round's text shows as text (escaped), never as Markdown or HTML."""
    import sys

    sys.path.insert(0, str(ROOT / "tests" / "fixtures" / "lab"))
    import lab_fixture_experiments as fx
    from lab.publish.collect import collect_evidence
    from lab.publish.notebook import Round
    from lab.publish.render import render_outputs

    evidence = collect_evidence(fx.EXPERIMENTS, fx.DECISIONS, ROOT / "tests/fixtures/lab/records", fx.CURRENT_HASHES)
    base = dict(probe="probes/x.py", outputs=["notes/probes/x.json"], notes="notes/x.md", heading="X",
                question="Which?", why="because")
    rounds = [Round(id="r-one", title="Tiles *swept*", kind="tuning", kept="the 64-wide tile",
                    dropped="<b>the 128</b>", fed="experiments/fixture-single.md", **base),
              Round(id="r-two", title="Second", kind="check", kept="k2", dropped="d2",
                    fed="experiments/fixture-single.md", **base),
              Round(id="r-three", title="Third", kind="host", kept="k3", dropped="d3",
                    fed="decisions/fixture-decision.md", **base)]
    out = render_outputs(evidence, (), rounds)
    single = out["experiments/fixture-single.md"]
    section = single[single.index("## What the lab notebook tried"):single.index("## Run shape")]
    assert "- [Tiles \\*swept\\*](../probes/r-one.md) (tuning). Kept: the 64-wide tile." in section
    assert "<b>" not in section and "&lt;b>the 128&lt;/b>" in section
    assert section.index("r-one.md") < section.index("r-two.md") and "r-three" not in section
    assert "What the lab notebook tried" not in out["experiments/fixture-sweep.md"]
    assert "[Third](../probes/r-three.md) (host). Kept: k3. Dropped: d3." in out["decisions/fixture-decision.md"]
    assert not any("What the lab notebook tried" in page for page in render_outputs(evidence).values())
    # the site as rendered: every round that fed attention-fwd, on its page
    page = (ROOT / "docs/experiments/attention-fwd.md").read_text(encoding="utf-8")
    fed = [r for r in load_rounds(ROOT)[0] if r.fed == "experiments/attention-fwd.md"]
    assert fed and all(f"(../probes/{r.id}.md)" in page for r in fed)


def test_the_attention_kernel_copies_still_apply():
    """The phase-stamp and TMA-epilogue probes edit a copy of kernels/attention_gluon.py's consumer and kernel,
    the backward-stores probe a copy of both Gluon backward kernels' modules: each edit must still find its one
    place, and the copy must be Python that holds the change."""
    import ast

    from probes.attention_phase_stamps import POINTS, form_source as stamped
    from probes.attention_tma_epilogue import form_source as tma, pair_store_source as pairs

    text = stamped(4)
    ast.parse(text)
    assert all(text.count(f"_stamp(mask_ptr, i, WG, {k}, 4,") == 1 for k in range(POINTS))
    text = tma()
    ast.parse(text)
    assert "tma.async_copy_shared_to_global(o_ptr, [b, h, row0, 0], o_view)" in text
    assert "gl.store(o_base + offs" not in text and text.count("tma.store_wait(0)") == 2
    text = pairs()
    ast.parse(text)
    assert "gl.store(o_base + offs, o.to(o_ptr.dtype.element_ty),\n" in text
    assert "gl.convert_layout(o.to(" not in text and text.count("layout=gl.SliceLayout(0, o_layout))") == 1

    from probes.attention_bwd_stores import KV_FILE, Q_FILE, pair_store_source as bwd_pairs

    def stored(text: str) -> list[str]:  # the value each gl.store writes, as source
        return [ast.unparse(node.args[1]) for node in ast.walk(ast.parse(text)) if isinstance(node, ast.Call)
                and ast.unparse(node.func) == "gl.store"]

    for where, values in ((KV_FILE, ["(dk * scale).to(dk_ptr.dtype.element_ty)", "dv.to(dv_ptr.dtype.element_ty)"]),
                          (Q_FILE, ["(dq * scale).to(dq_ptr.dtype.element_ty)"])):
        plan = (ROOT / where).read_text(encoding="utf-8")
        assert stored(plan) == [f"gl.convert_layout({v}, store_layout)" for v in values], where
        text = bwd_pairs(where)
        assert stored(text) == values and "store_layout" not in text, where
        assert text.count("layout=gl.SliceLayout(0, acc_layout))") == 1 + plan.count(
            "layout=gl.SliceLayout(0, acc_layout))"), where


def test_the_causal_dynamic_probe_compares_the_plan_with_one_program_a_tile():
    """probes/attention_causal_dynamic.py times the causal Gluon plan (tiles on demand) against the same plan
    on one program a query tile, by the kernel's flags; a plan that no longer takes tiles on demand is refused."""
    from dataclasses import replace

    import torch

    from kernels.attention import plan_attention
    from probes.attention_causal_dynamic import forms

    plan = plan_attention(2048, 128, torch.bfloat16, True, impl="gluon")
    by_form = forms(plan)
    assert by_form["on-demand"] is plan and (plan.persistent, plan.on_demand) == (True, True)
    assert by_form["one-tile"] == replace(plan, persistent=False, on_demand=False)
    with pytest.raises(ValueError, match="on demand"):
        forms(by_form["one-tile"])
