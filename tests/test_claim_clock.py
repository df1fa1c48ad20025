"""The verdict that stands alone is the verdict on the claim's clock, named: on the home table, the experiments
index, the decision pages and the snippets posts embed. An eager-call claim whose kernel wins on GPU time but
loses per call is Rejected there, not Supported."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent / "fixtures" / "lab"))

import lab_synthetic as syn  # noqa: E402

from experiments.spec import EAGER_CALL, GPU_TIME, PARITY, Claim, Decision, Margin  # noqa: E402
from lab import REPO_ROOT  # noqa: E402
from lab.evidence.records import EagerMethod, EagerResult  # noqa: E402
from lab.evidence.verdict import REJECTED, SUPPORTED, verdicts_by_gpu  # noqa: E402
from lab.publish.collect import Evidence, collect_evidence  # noqa: E402
from lab.publish.indexes import decision_context, index_rows, summary_rows  # noqa: E402
from lab.publish.render import render_outputs  # noqa: E402

METHOD = EagerMethod("host clock", 1 << 20, 1, 12, 0.004, 10, 1000, 64)


def _eager(ms: float) -> EagerResult:
    samples = tuple(ms * (1 + 0.001 * (i % 3)) for i in range(12))
    return EagerResult(samples_ms=samples, host_samples_ms=samples, calls_per_sample=100, p20_ms=ms, p50_ms=ms,
                       p80_ms=ms, host_p50_ms=ms)


def _evidence(clock: str) -> Evidence:
    """One GPU, one point: the subject 2x faster on GPU time (1 ms against 2 ms), 1.5x slower per call
    (15 µs against 10 µs)."""
    experiment = syn.experiment(kind=PARITY, slug="call-cost", margin=0.02)
    claim = replace(experiment.claim, statement="a call of subject costs no more than a call of base", clock=clock,
                    margin=Margin(0.02, "gpu spread", Margin(0.1, "eager spread")))
    experiment = replace(experiment, claim=claim)
    point = syn.point({"subject": syn.timed([1.0] * 30, eager=_eager(0.015)),
                       "base": syn.timed([2.0] * 30, eager=_eager(0.010))})
    run = replace(syn.run([point], slug=experiment.slug), eager=METHOD)
    decision = Decision("use-it", "Use it?", "Should callers use it?", (experiment.slug,), "yes", "no", "open")
    return Evidence(experiments={experiment.slug: experiment}, decisions=(decision,), runs={experiment.slug: [run]},
                    verdicts={experiment.slug: verdicts_by_gpu(experiment, [run], {}, GPU_TIME)},
                    current_hashes={experiment.slug: {}},
                    eager_verdicts={experiment.slug: verdicts_by_gpu(experiment, [run], {}, EAGER_CALL)})


@pytest.mark.parametrize("clock, state, other, ratio", [
    (EAGER_CALL, REJECTED, SUPPORTED, "0.667×"),
    (GPU_TIME, SUPPORTED, REJECTED, "2.000×"),
])
def test_every_lone_verdict_is_on_the_claims_clock_and_names_it(clock, state, other, ratio):
    evidence = _evidence(clock)
    assert evidence.verdicts["call-cost"][syn.GPU_A[0]].state == SUPPORTED, "on GPU time the subject wins"
    name = "Eager call, margin ±10.0%" if clock == EAGER_CALL else "GPU time, margin ±2.0%"
    (row,) = index_rows(evidence, "/experiments/")
    assert f"kl-badge--{state.lower()}" in row["standing"] and f"kl-badge--{other.lower()}" not in row["standing"]
    assert f'<span class="kl-clock">{name}</span>' in row["standing"] and ratio in row["standing"]
    assert row["claim"] == "a call of subject costs no more than a call of base", "the claim in words"
    (summary,) = summary_rows(evidence, "call-cost")
    assert f"kl-badge--{state.lower()}" in summary["verdict"] and summary["clock"] == name
    assert f"kl-badge--{other.lower()}" in summary["other"], "the other clock stands beside it, labelled"
    context = decision_context(evidence, evidence.decisions[0], "../experiments/")
    assert context["calls"][0]["outcome"] == state
    assert name in context["experiments"][0]["cells"][0]
    outputs = render_outputs(evidence)
    home = outputs["generated/verdicts.md"]
    assert f"kl-badge--{state.lower()}" in home and f"kl-badge--{other.lower()}" not in home
    assert f"kl-badge--{state.lower()}" in outputs["experiments/index.md"]
    snippet = outputs["generated/call-cost.md"]
    assert snippet.index(f"kl-badge--{state.lower()}") < snippet.index(f"kl-badge--{other.lower()}")
    margins = "±10.0% (Eager call); ±2.0% (GPU time)" if clock == EAGER_CALL else "±2.0% (GPU time); ±10.0% (Eager call)"
    assert margins in snippet and margins in outputs["experiments/call-cost.md"]


def test_softmax_call_overhead_stands_on_its_eager_verdict():
    from experiments import all_experiments
    from lab.evidence.hashing import source_hashes

    experiments = {"softmax-call-overhead": all_experiments()["softmax-call-overhead"]}
    evidence = collect_evidence(experiments, [], REPO_ROOT / "records",
                                {s: source_hashes(e, REPO_ROOT) for s, e in experiments.items()})
    key = "nvidia-h100-80gb-hbm3"
    eager = evidence.eager_verdicts["softmax-call-overhead"][key]
    gpu = evidence.verdicts["softmax-call-overhead"][key]
    assert evidence.claim_verdicts("softmax-call-overhead")[key] is eager
    (row,) = index_rows(evidence, "")
    margin = experiments["softmax-call-overhead"].claim.margin_on(EAGER_CALL).fraction
    assert f'<span class="kl-clock">Eager call, margin ±{margin:.1%}</span>' in row["standing"]
    assert f"kl-badge--{eager.state.lower()}" in row["standing"]
    low_eager = min(j.speedup.ratio for j in eager.points if j.speedup)
    low_gpu = min(j.speedup.ratio for j in gpu.points if j.speedup)
    assert low_eager < 1 < low_gpu, "per call the lab's softmax is slower at some point; on GPU time it never is"
    assert f"{low_eager:.3f}×" in row["standing"] and f"{low_gpu:.3f}×" not in row["standing"]
