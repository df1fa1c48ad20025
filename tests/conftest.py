"""Test set-up: without CUDA the kernels run through Triton's interpreter; with CUDA, compiled, unchanged.

TRITON_INTERPRET must be set before Triton decorates the kernels, so it is set here, before any test
module imports `kernels`.
"""

from __future__ import annotations

import os

import pytest
import torch

HAS_CUDA = torch.cuda.is_available()
if not HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")

DEVICE = "cuda" if HAS_CUDA else "cpu"


@pytest.fixture
def device() -> str:
    return DEVICE


@pytest.fixture
def gen() -> torch.Generator:
    """A seeded generator on the CPU: inputs are drawn there and moved, so a failure reproduces anywhere."""
    g = torch.Generator()
    g.manual_seed(20261122)
    return g



# Under `-n N`, the tests of each of these modules share one worker process: one embedded Ray serves all of
# test_lab_cluster's, and one browser, one server and one visit per page serve all of test_site_browser's.
TOGETHER = ("tests/test_lab_cluster.py", "tests/test_site_browser.py")


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """xdist's default "load" scheduling, except that each TOGETHER module's tests travel together (xdist's
    loadscope with every other test a scope of its own)."""
    if config.getvalue("dist") != "load":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class TogetherScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            return module if module in TOGETHER else nodeid

    return TogetherScheduling(config, log)
