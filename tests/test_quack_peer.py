"""QuACK as an optional peer: which experiments declare it, which rows it refuses, and what a machine
without it records (CPU only: nothing here launches a kernel)."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from experiments import _add_rmsnorm as ar
from experiments import _softmax as sm
from experiments import all_experiments
from experiments.spec import Case
from lab.measure import environment
from lab.measure.runner import _unavailable

QUACK_EXPERIMENTS = (
    "softmax-fwd-sweep", "softmax-short-rows", "softmax-long-rows", "softmax-any-n",
    "softmax-bwd-sweep", "softmax-bwd-long-rows", "softmax-any-n-bwd", "add-rmsnorm-fwd", "add-rmsnorm-bwd",
)
HAS_QUACK = importlib.util.find_spec("quack") is not None


@pytest.mark.parametrize("slug", QUACK_EXPERIMENTS)
def test_quack_is_a_baseline_of_the_claim_and_an_optional_profile(slug):
    experiment = all_experiments()[slug]
    assert "quack" in experiment.claim.baselines
    assert "quack" in experiment.claim.statement.lower()
    (profile,) = [p for p in experiment.profiles if p.name == "quack"]
    assert profile.requires == "quack" and "nvidia-cutlass-dsl" in profile.requires_note


def _case(n: int) -> Case:
    return Case(f"n{n}", {"M": 4, "N": n}, "")


# (N, dtype, refused): a row must be a whole number of 16-byte vectors, on each side of that boundary
@pytest.mark.parametrize("n, dtype, refused", [
    (4, torch.float32, False), (3, torch.float32, True), (5, torch.float32, True), (262144, torch.float32, False),
    (8, torch.bfloat16, False), (12, torch.bfloat16, True), (1528, torch.float16, False),
    (1524, torch.float16, True), (10039, torch.bfloat16, True),
])
def test_quack_softmax_refuses_rows_that_are_not_whole_16_byte_vectors(n, dtype, refused):
    reason = sm.quack_limit(_case(n), dtype)
    assert (reason is not None) == refused
    if refused:  # the same words for every refused row: a page groups them into one line
        assert reason == sm.quack_limit(_case(3), torch.float32) and "16-byte vectors" in reason


def test_the_softmax_peers_carry_the_same_row_rule_forward_and_backward():
    assert sm.QUACK.unsupported is sm.quack_limit and sm.BWD_QUACK.unsupported is sm.quack_limit
    assert ar.QUACK.unsupported is None  # hidden sizes of the add + RMSNorm cases are multiples of 8


@pytest.mark.skipif(HAS_QUACK, reason="QuACK imports here: the unavailable path cannot be seen")
@pytest.mark.parametrize("profile", [sm.QUACK, sm.BWD_QUACK, ar.QUACK, ar.BWD_QUACK], ids=lambda p: p.description)
def test_without_quack_the_peer_is_unavailable_and_the_reason_says_why(profile):
    reason = _unavailable(profile)
    assert reason.startswith("quack does not import (")
    assert "nvidia-cutlass-dsl" in reason and "quack-kernels" in reason


def test_a_record_names_the_quack_version_when_it_is_installed(monkeypatch):
    versions = {"quack-kernels": "0.6.5", "nvidia-cutlass-dsl": "4.8.1", "torch": "2.9.0"}

    def version(name):
        if name not in versions:
            raise environment.importlib.metadata.PackageNotFoundError(name)
        return versions[name]

    monkeypatch.setattr(environment.importlib.metadata, "version", version)
    assert environment.package_versions() == versions
