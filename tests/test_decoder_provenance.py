"""Which op of the decoder experiments comes from where: the lab profile's description (read from
kernels/decoder_block.py's table), the decode attention it names, and the classifier that tells the lab's
kernels from torch's by name in a profiler trace."""

import pytest

from experiments import _decoder as dec
from experiments.decoder_block import EXPERIMENT as BLOCK
from experiments.decoder_block_graphed import EXPERIMENT as GRAPHED
from kernels.decoder_block import sources_for


def _profile(experiment, name):
    return next(p for p in experiment.profiles if p.name == name)


@pytest.mark.parametrize("phase, rows", [("prefill", 1024), ("decode", 1), ("decode", 64)])
def test_the_lab_description_names_every_op_and_where_it_comes_from(phase, rows):
    text = _profile(BLOCK, "lab").description
    for label, source in sources_for(None, dec.DECODE_ATTENTION, phase, rows=rows).items():
        assert label in text, label
        assert dec._source_name(source) in text, source


def test_the_decode_attention_is_named_on_both_pages():
    lab, graphed = _profile(BLOCK, "lab").description, _profile(GRAPHED, "lab-graph").description
    decode = sources_for(None, dec.DECODE_ATTENTION, "decode", rows=1)["attention"]
    for text in (lab, graphed, BLOCK.evidence_boundary, GRAPHED.evidence_boundary):
        assert dec.DECODE_ATTENTION_WHY in text
    for text in (lab, graphed):
        assert f'DECODE_ATTENTION = "{dec.DECODE_ATTENTION}"' in text
        assert dec._source_name(decode) in text
    # Prefill attention is the lab's kernel, and the description says so in the prefill part.
    prefill_part = lab.split("Decode:")[0]
    assert "attention (kernels/attention.py)" in prefill_part


def test_the_lab_description_follows_the_table(monkeypatch):
    """Served by the lab's kernel at decode, the description moves attention to the lab's side."""
    monkeypatch.setattr(dec, "DECODE_ATTENTION", "lab")
    text = dec.decode_provenance(None)
    lab_side, torch_side = text.split("; torch for ")[0], text.split("; torch for ")[1]
    assert "attention (kernels/attention.py" in lab_side and "attention" not in torch_side.split(".")[0]
    assert text.endswith("at decode attention is the lab's kernel (kernels/attention.py, one query over the cached keys)")


def test_the_classifier_tells_the_labs_kernels_from_torchs():
    names = dec.classify.lab_kernels
    for kernel in ("_rotary_qkv_kernel", "_add_rmsnorm_fwd_kernel", "_swiglu_fwd_kernel", "_attention_fwd_kernel",
                   "_rmsnorm_linear_fwd_kernel", "_int8_linear_kernel", "_int4_linear_kernel"):
        assert kernel in names and dec.classify.is_lab(kernel)
    for kernel in ("nvjet_tst_128x64_64x4_1x2_h_bz_coopA_TNT", "triton_poi_fused_add_mul_0",
                   "cudnn_generated_fort_native_sdpa_sm90_flash_fprop", "void at::native::elementwise_kernel<4>"):
        assert not dec.classify.is_lab(kernel)
    # Op names: the innermost label, else a class of the kernel's name.
    assert dec.classify("nvjet_tst", ("block", "o_proj")) == "o_proj"
    assert dec.classify("_rmsnorm_linear_fwd_kernel", ()) == "projections (matmul)"
    assert dec.classify("cudnn_generated_fort_native_sdpa_sm90_flash_fprop", ()) == "attention"
    assert dec.classify("something_else", ()) == "other"


def test_both_experiments_profile_op_by_op_with_the_provenance_classifier():
    assert BLOCK.breakdown is dec.classify and GRAPHED.breakdown is dec.classify
    from kernels._provenance import triton_kernel_names

    assert triton_kernel_names(("README.md", "../kernels/x.py", "kernels/rotary.py")) == {"_rotary_qkv_kernel"}
