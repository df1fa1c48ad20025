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
                   "_rmsnorm_linear_fwd_kernel", "_int8_linear_kernel", "_int4_linear_kernel", "_int4_gemv_kernel"):
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


# --------------------------------------------------------------------------------------------------------
# gemlite's blocks: the peer of the lab's quantised blocks
# --------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("experiment", [BLOCK, GRAPHED])
def test_gemlite_blocks_are_peers_of_the_quantised_lab_blocks(experiment):
    """Each quantised lab profile has a gemlite profile beside it: same byte model and tolerance, gemlite
    named as the source of exactly the four projections, the same peer requirement, decode only."""
    import torch

    suffix = "-graph" if experiment is GRAPHED else ""
    decode = next(c for c in experiment.cases if dec.is_decode(c))
    for quant in ("int8", "int4"):
        lab, peer = _profile(experiment, f"lab-{quant}{suffix}"), _profile(experiment, f"gemlite-{quant}{suffix}")
        assert peer.requires == "gemlite" and lab.requires is None
        assert peer.tolerance == lab.tolerance == {"int8": dec.INT8_TOLERANCE, "int4": dec.INT4_TOLERANCE}[quant]
        assert peer.bytes_moved(decode, torch.bfloat16) == lab.bytes_moved(decode, torch.bfloat16) \
            == dec.bytes_moved(decode, torch.bfloat16, quant=quant)
        plan = peer.plan(decode, torch.bfloat16)
        gemlite_ops = sorted(label for label, source in plan.items() if source.startswith("gemlite:"))
        assert gemlite_ops == ["down_proj", "gate_up_proj", "o_proj", "qkv_proj"], plan
        assert "experiments/dequant_linear_decode.py" in peer.sources  # gemlite's packing lives there
        if not torch.cuda.is_available():
            assert "CUDA" in peer.unsupported(decode, torch.bfloat16)


def test_gemlite_blocks_decline_prefill_with_the_reason(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    prefill = next(c for c in BLOCK.cases if not dec.is_decode(c))
    decode = next(c for c in BLOCK.cases if dec.is_decode(c))
    for quant in ("int8", "int4"):
        peer = _profile(BLOCK, f"gemlite-{quant}")
        assert "decode only" in peer.unsupported(prefill, torch.bfloat16)
        assert peer.unsupported(decode, torch.bfloat16) is None


def test_the_gemlite_block_runs_each_projection_on_its_own_quantised_weights(monkeypatch, device):
    """With gemlite's layer stood in for by an exact dequantise-and-multiply, the gemlite block computes the
    plain block on the lab block's dequantised weights: a projection given another projection's weights, or
    the rows reshaped wrongly, misses by O(1)."""
    import torch

    from experiments import dequant_linear_decode
    from kernels.decoder_block import LabDecoderBlock
    from kernels.quantize import dequantize_int4, dequantize_int8
    from kernels.reference_decoder import DecoderBlock, DecoderConfig, DecoderWeights, KVCache

    config = DecoderConfig(hidden=128, n_heads=2, n_kv_heads=1, head_dim=64, intermediate=256)
    seen = []

    def stand_in(x, weight, scales, **_):
        seen.append(weight.data_ptr())
        assert x.dim() == 2
        if weight.dtype == torch.int8:
            w = dequantize_int8(weight, scales, dtype=torch.float64)
        else:
            w = dequantize_int4(weight, scales, group_size=128, dtype=torch.float64)
        return (x.double() @ w.T).to(x.dtype)

    monkeypatch.setattr(dequant_linear_decode, "gemlite_linear", stand_in)
    weights = DecoderWeights.random(config, torch.bfloat16, device, 3)
    for quant in ("int8", "int4"):
        lab = LabDecoderBlock(weights, config, quant=quant, decode_attention="sdpa", group_size=128)
        peer = dec.GemliteDecoderBlock(weights, lab)
        plain = DecoderBlock(lab.effective_weights(torch.float64), config)  # float64, on the same weights
        gen = torch.Generator().manual_seed(4)
        x = torch.randn(3, 1, config.hidden, generator=gen, dtype=torch.float64)
        k, v = (torch.randn(3, 1, 9, 64, generator=gen, dtype=torch.float64) for _ in range(2))
        seen.clear()
        out = peer.decode(x.to(device, torch.bfloat16), KVCache(k.to(device, torch.bfloat16), v.to(device, torch.bfloat16)), 8)
        ref = plain.decode(x.to(device), KVCache(k.clone().to(device), v.clone().to(device)), 8)
        assert sorted(seen) == sorted(w.data_ptr() for w, _ in peer.projections.values())
        err = (out.double() - ref).norm() / ref.norm()
        assert err < 2.5e-2, f"{quant}: relative error {err:.3e}"


def test_the_int4_kernel_that_runs_is_named_in_the_plan(monkeypatch):
    """The lab-int4 plan names kernels/int4_gluon.py where the Gluon kernel serves the block, else
    kernels/dequant_linear.py."""
    decode = next(c for c in BLOCK.cases if dec.is_decode(c))
    for impl, source in (("gluon", "kernels/int4_gluon.py"), ("triton", "kernels/dequant_linear.py")):
        monkeypatch.setattr(dec, "int4_impl", lambda dtype=None, impl=impl: impl)
        plan = dec.op_sources("lab-int4", decode)
        assert {dec._source_name(plan[op]) for op in ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")} == {source}
    with pytest.raises(ValueError, match="int4_impl must be one of"):
        sources_for("int4", dec.DECODE_ATTENTION, "decode", 1, int4_impl="auto")
