"""Profiles, cases, inputs and models shared by the decoder-block experiments (not an experiment itself).

One Llama-style decoder layer at a 7-8B-class shape (kernels/reference_decoder.py: hidden 4,096, 32 query and
8 key/value heads of 128, intermediate 14,336), bfloat16, weights drawn once per process from a fixed seed
and shared by every profile. Three ways to run it: torch eager (the plain-PyTorch block, the reference's own
code), torch.compile of that same module, and the lab's block (kernels/decoder_block.py) built from the lab's
kernels where the lab has one; weight-only int8 and int4 lab blocks ride along as extra profiles.

Prefill: B sequences of S tokens, causal. Decode: one new token per sequence against a KV cache already holding
KV positions (drawn, standing for an earlier prefill); the step writes its key and value at position KV and
attends over KV + 1 keys. Inputs are the hidden states (and at decode the two cache tensors): the weights are
the same tensors for every call, as in a served model, and at 436 MB they never fit the L2.
"""

from __future__ import annotations

import functools

import torch

from experiments.spec import COMPUTE, MEMORY, Case, Profile
from kernels._provenance import triton_kernel_names
from kernels.dequant_linear import int4_gluon_refusal
from kernels.decoder_block import FUSED_QKV_MAX_ROWS, LabDecoderBlock, sources_for
from kernels.reference_decoder import LLAMA_8B, REFERENCE_SOURCES, DecoderBlock, DecoderWeights, KVCache

CONFIG = LLAMA_8B
WEIGHT_SEED = 20_261_123
PREFILL = ((1, 1024), (2, 2048), (2, 4096), (4, 4096))  # (B, S): 1k, 4k, 8k and 16k tokens
DECODE = ((1, 1024), (1, 8192), (16, 4096), (64, 1024), (64, 4096))  # (B, KV)
DECODE_ATTENTION = "sdpa"  # which kernel serves attention at decode in the lab's block (see the notes)
_DECODE_ATTENTION_WHY = {  # said in the profiles' descriptions and the evidence boundaries, hence on the pages
    "sdpa": ("at decode attention is torch's F.scaled_dot_product_attention, not the lab's kernel: SDPA's default "
             "backend (cuDNN) beat it at every decode shape of this layer in a probe with no run record "
             "(notes/decoder-block.md); the op tables name the kernel that ran"),
    "lab": "at decode attention is the lab's kernel (kernels/attention.py, one query over the cached keys)",
}
DECODE_ATTENTION_WHY = _DECODE_ATTENTION_WHY[DECODE_ATTENTION]

BLOCK_SOURCES = ("kernels/reference_decoder.py", "kernels/kv_cache.py")
LAB_SOURCES = ("kernels/decoder_block.py", "kernels/reference_decoder.py", "kernels/kv_cache.py", "kernels/rotary.py",
               "kernels/rmsnorm_linear.py",
               "kernels/rmsnorm_gemv.py", "kernels/_rmsnorm_linear_tiled.py", "kernels/_gemv.py",
               "kernels/attention.py", "kernels/attention_kernels.py", "kernels/attention_gluon.py", "kernels/attention_choice.py",
               "kernels/attention_bwd_gluon.py", "kernels/attention_bwd_q_gluon.py", "kernels/_gluon_host.py",
               "kernels/add_rmsnorm.py", "kernels/swiglu.py", "kernels/_launch.py",
               "kernels/_checks.py")
QUANT_SOURCES = LAB_SOURCES + ("kernels/dequant_linear.py", "kernels/int4_gluon.py", "kernels/quantize.py")
# gemlite's blocks: the plain block, its projections packed by gemlite from the lab's quantised values
# (experiments/dequant_linear_decode.py packs them, as on that experiment's pages).
GEMLITE_SOURCES = BLOCK_SOURCES + ("kernels/quantize.py", "experiments/dequant_linear_decode.py")
GEMLITE_LAYERS = {"int8": "gemlite: A16W8 (int8 per channel)", "int4": "gemlite: A16Wn (int4, group 128, zero points 8)"}

# ‖out − ref‖ / ‖ref‖ against the float64 block on the same (unquantised) weights. The output is x plus two
# branches of bf16 products and norms; the small blocks of tests/test_decoder_block.py measure at most 1.2e-2
# for the lab's block (the interpreter truncates bf16, about twice the rounding error a GPU makes). The
# quantised profiles carry the quantisation's own error on every projection, per-channel int8 about 2^-8 of
# each weight and group-wise int4 about 2^-4: bounded at 5e-2 and 0.3. A dropped rotary, a wrong head grouping
# or a missing residual changes the output by O(1) and misses every bound.
TOLERANCE = {torch.bfloat16: 2.5e-2}
INT8_TOLERANCE = {torch.bfloat16: 5e-2}
INT4_TOLERANCE = {torch.bfloat16: 3e-1}

PARAMETERS = CONFIG.parameter_count()  # the projections' weights and the two norms' gains
PROJECTION_SHAPES = tuple(s for s in DecoderWeights.shapes(CONFIG).values() if len(s) == 2)  # [N, K] each
NORM_PARAMETERS = sum(s[0] for s in DecoderWeights.shapes(CONFIG).values() if len(s) == 1)
INT4_GROUP = 128  # inputs per int4 scale (the lab-int4 block is built with it)

BYTE_MODEL = (
    "the projections' weights read once (218.1 M parameters · size), the hidden states read and written once "
    "(2·T·4096·size for T tokens) and, at decode, the KV cache read once (2·B·8·(KV+1)·128·size): the least a "
    "layer moves. The int8 and int4 profiles count their own weights instead: one byte per weight plus one "
    "scale per output row (int8), half a byte per weight plus one scale per 128 inputs of a row (int4), "
    "scales and the norms' gains at size"
)
FLOP_MODEL = (
    "2·T·218.1 M for the projections, plus attention's 4·B·32·128·S²/2 at causal prefill or 4·B·32·128·(KV+1) "
    "at decode"
)


def prefill_case(batch: int, seq: int) -> Case:
    return Case(f"prefill-b{batch}-s{seq}", {"B": batch, "S": seq, "KV": 0},
                f"prefill of {batch} × {seq} tokens ({batch * seq:,} in all), causal")


def decode_case(batch: int, kv: int) -> Case:
    return Case(f"decode-b{batch}-kv{kv}", {"B": batch, "S": 1, "KV": kv},
                f"decode: {batch} sequence{'s' if batch > 1 else ''} × one new token against {kv:,} cached positions")


def cases() -> tuple[Case, ...]:
    return tuple(prefill_case(b, s) for b, s in PREFILL) + decode_cases()


def decode_cases() -> tuple[Case, ...]:
    return tuple(decode_case(b, kv) for b, kv in DECODE)


def is_decode(case: Case) -> bool:
    return case["KV"] > 0


def element_size(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def weight_bytes(quant: str | None, size: int) -> int:
    """Bytes of the layer's weights as a call reads them: every parameter at `size` bytes (quant None), or
    the projections quantised (kernels/quantize.py), int8 with one scale per output row, int4 packed two a
    byte with one scale per INT4_GROUP inputs of a row; scales and the norms' gains at `size`."""
    if quant is None:
        return PARAMETERS * size
    total = NORM_PARAMETERS * size
    for n, k in PROJECTION_SHAPES:
        if quant == "int8":
            total += n * k + n * size
        elif quant == "int4":
            total += n * k // 2 + n * (k // INT4_GROUP) * size
        else:
            raise ValueError(f"weight_bytes: quant must be None, 'int8' or 'int4', got {quant!r}")
    return total


def bytes_moved(case: Case, dtype: torch.dtype, quant: str | None = None) -> int:
    """The byte model (BYTE_MODEL) of the layer with `quant` weights (None: the experiment's, unquantised)."""
    size = element_size(dtype)
    tokens = case["B"] * case["S"]
    total = weight_bytes(quant, size) + 2 * tokens * CONFIG.hidden * size
    if is_decode(case):
        total += 2 * case["B"] * CONFIG.n_kv_heads * (case["KV"] + 1) * CONFIG.head_dim * size
    return total


def bound(case: Case) -> str:
    """Prefill multiplies every weight by thousands of tokens (compute-bound); decode reads every weight for
    a few tokens (memory-bound, reads dominating)."""
    return MEMORY if is_decode(case) else COMPUTE


def tokens(shape) -> int:
    """Tokens one call of the layer processes: B × S at prefill, B (one new token a sequence) at decode."""
    return shape["B"] * shape["S"]


def flops(case: Case, dtype: torch.dtype) -> int:
    tokens = case["B"] * case["S"]
    width = CONFIG.n_heads * CONFIG.head_dim
    if is_decode(case):
        attention = 4 * case["B"] * width * (case["KV"] + 1)
    else:
        attention = 4 * case["B"] * width * case["S"] ** 2 // 2
    return 2 * tokens * PARAMETERS + attention


def make_inputs(case: Case, dtype: torch.dtype, device: str, gen: torch.Generator):
    """x ~ N(0, 1) [B, S, hidden]; at decode also the cache's keys and values [B, 8, KV + 1, 128] ~ N(0, 1),
    drawn on the device from a seed the CPU generator gives (a 64 × 4,096 cache is half a billion values)."""
    x = torch.randn(case["B"], case["S"], CONFIG.hidden, generator=gen, dtype=torch.float32).to(device=device, dtype=dtype)
    if not is_decode(case):
        return {"x": x}
    seed = int(torch.randint(0, 2**62, (1,), generator=gen))
    cache_gen = torch.Generator(device=device).manual_seed(seed)
    shape = (case["B"], CONFIG.n_kv_heads, case["KV"] + 1, CONFIG.head_dim)
    k = torch.randn(shape, generator=cache_gen, device=device, dtype=torch.float32).to(dtype)
    v = torch.randn(shape, generator=cache_gen, device=device, dtype=torch.float32).to(dtype)
    return {"x": x, "k_cache": k, "v_cache": v}


# --------------------------------------------------------------------------------------------------------
# The blocks, built once per process and dtype
# --------------------------------------------------------------------------------------------------------


@functools.cache
def _weights(dtype: torch.dtype, device: str) -> DecoderWeights:
    return DecoderWeights.random(CONFIG, dtype, device, WEIGHT_SEED)


class GemliteDecoderBlock(DecoderBlock):
    """The plain-PyTorch block with its four projections through gemlite's weight-only layers, built from the
    quantised weights of a lab block (`quantised.quantised_projections()`: the very values lab-int8 or lab-int4
    multiply by, in kernels/quantize.py's layout), so the two quantised blocks differ only in the projections'
    kernels. gemlite's layers run on CUDA."""

    def __init__(self, weights: DecoderWeights, quantised: LabDecoderBlock):
        super().__init__(weights, quantised.config)
        self.quant = quantised.quant
        self.projections = quantised.quantised_projections()

    def _linear(self, name: str, x: torch.Tensor) -> torch.Tensor:
        from experiments.dequant_linear_decode import gemlite_linear

        rows = x.reshape(-1, x.shape[-1])
        y = gemlite_linear(rows, *self.projections[name])
        return y.view(*x.shape[:-1], y.shape[-1])


@functools.cache
def block(kind: str, dtype: torch.dtype, device: str):
    """kind: "eager", "float64" (the reference: the same module on float64 copies of the `dtype` weights),
    "lab", "lab-int8", "lab-int4", "gemlite-int8" or "gemlite-int4"."""
    weights = _weights(dtype, device)
    if kind == "float64":
        return DecoderBlock(weights.to(torch.float64), CONFIG)
    if kind == "eager":
        return DecoderBlock(weights, CONFIG)
    if kind.startswith("gemlite-"):
        return GemliteDecoderBlock(weights, block(kind.replace("gemlite", "lab"), dtype, device))
    quant = {"lab": None, "lab-int8": "int8", "lab-int4": "int4"}[kind]
    return LabDecoderBlock(weights, CONFIG, quant=quant, decode_attention=DECODE_ATTENTION, group_size=INT4_GROUP)


@functools.cache
def _compiled(step: str, dtype: torch.dtype, device: str):
    """torch.compile of the eager module's prefill (`forward`) or decode step, compiled once per process."""
    module = block("eager", dtype, device)
    return torch.compile(module if step == "forward" else module.decode)


@functools.cache
def _positions(seq: int, device: torch.device) -> torch.Tensor:
    return torch.arange(seq, device=device)


def _call(kind: str, x: torch.Tensor, k_cache: torch.Tensor | None, v_cache: torch.Tensor | None,
          weights_dtype: torch.dtype):
    device = str(x.device)
    decode = k_cache is not None
    if kind == "compile":
        model = _compiled("decode" if decode else "forward", weights_dtype, device)
    else:
        model = block(kind, weights_dtype, device)
        if decode:
            model = model.decode
    if not decode:
        return model(x, _positions(x.shape[1], x.device))
    return model(x, KVCache(k_cache, v_cache), k_cache.shape[2] - 1)


def float64_reference(x: torch.Tensor, k_cache: torch.Tensor | None = None, v_cache: torch.Tensor | None = None):
    """The plain block in float64 on float64 copies of the weights, one sequence at a time (a 4,096-token
    sequence's 32 heads of float64 scores take 4 GiB; four at once would crowd the run)."""
    outs = []
    for b in range(x.shape[0]):
        kb = None if k_cache is None else k_cache[b:b + 1].to(torch.float64)  # a copy: the step writes into it
        vb = None if v_cache is None else v_cache[b:b + 1].to(torch.float64)
        outs.append(_call("float64", x[b:b + 1].to(torch.float64), kb, vb, x.dtype))
    return torch.cat(outs)


def _runner(kind: str):
    def run(x: torch.Tensor, k_cache: torch.Tensor | None = None, v_cache: torch.Tensor | None = None):
        return _call(kind, x, k_cache, v_cache, x.dtype)
    run.__name__ = f"run_{kind.replace('-', '_')}"
    return run


def _unsupported_on_cpu(case: Case, dtype: torch.dtype) -> str | None:
    if not torch.cuda.is_available() and (case["B"] * case["S"] > 64 or case["KV"] > 256):
        return "a 7-8B-class layer at this size is for the GPU; the interpreter runs the tests' small blocks"
    return None


def _quantised_unsupported(case: Case, dtype: torch.dtype) -> str | None:
    if not is_decode(case):
        return ("the lab's weight-only kernels serve up to 64 rows (decode); a prefill would run them 64 tokens at a "
                "time and read every weight once per chunk")
    return _unsupported_on_cpu(case, dtype)


def _gemlite_unsupported(case: Case, dtype: torch.dtype) -> str | None:
    if not torch.cuda.is_available():
        return "gemlite's kernels run on CUDA only"
    if not is_decode(case):
        return "a peer of the lab's quantised blocks, which serve decode only (see lab-int8)"
    return None


def _gemlite_plan(quant: str):
    def plan(case: Case, dtype: torch.dtype) -> dict[str, str]:
        table = DecoderBlock.op_sources("decode" if is_decode(case) else "prefill")
        return {label: GEMLITE_LAYERS[quant] if source == "torch: F.linear" else source
                for label, source in table.items()}

    return plan


def _quantised_profiles() -> tuple[Profile, ...]:
    """lab-int8, gemlite-int8, lab-int4 and gemlite-int4: the lab's quantised blocks and gemlite's on the same
    quantised weights (decode only)."""
    out = []
    for quant, tolerance in (("int8", INT8_TOLERANCE), ("int4", INT4_TOLERANCE)):
        model = functools.partial(bytes_moved, quant=quant)
        out.append(Profile(f"lab-{quant}", f"the lab's block with weight-only {quant} projections "
                           f"(kernels/dequant_linear.py){_AS_LAB}", _runner(f"lab-{quant}"), QUANT_SOURCES,
                           plan=functools.partial(_kind_sources, f"lab-{quant}"), unsupported=_quantised_unsupported,
                           tolerance=tolerance, bytes_moved=model))
        out.append(Profile(f"gemlite-{quant}", f"the plain-PyTorch block with its projections through "
                           f"{GEMLITE_LAYERS[quant].removeprefix('gemlite: ')}, gemlite 0.6's Triton layer with its "
                           f"default settings, packed outside the clock from the same quantised weights as "
                           f"lab-{quant}", _runner(f"gemlite-{quant}"), GEMLITE_SOURCES, plan=_gemlite_plan(quant),
                           unsupported=_gemlite_unsupported, tolerance=tolerance, bytes_moved=model,
                           requires="gemlite"))
    return tuple(out)


def _kind_sources(kind: str, case: Case, dtype: torch.dtype) -> dict[str, str]:
    return op_sources(kind, case)


def profiles() -> tuple[Profile, ...]:
    return (
        Profile("torch-eager", "the plain-PyTorch block, eager (F.rms_norm, F.linear, SDPA with its default backend)",
                _runner("eager"), BLOCK_SOURCES, unsupported=_unsupported_on_cpu),
        Profile("torch.compile", "the same module through torch.compile (default mode and dynamic-shape policy)",
                _runner("compile"), BLOCK_SOURCES, unsupported=_unsupported_on_cpu),
        Profile("lab", lab_description(None),
                _runner("lab"), LAB_SOURCES, plan=lambda case, dtype: op_sources("lab", case), unsupported=_unsupported_on_cpu),
    ) + _quantised_profiles()


_AS_LAB = "; the other ops as in `lab` at decode"


def op_sources(kind: str, case: Case) -> dict[str, str]:
    """Which implementation serves each op of the lab's block at this case (recorded as the profile's plan)."""
    quant = {"lab": None, "lab-int8": "int8", "lab-int4": "int4"}[kind]
    return dict(sources_for(quant, DECODE_ATTENTION, "decode" if is_decode(case) else "prefill",
                            rows=case["B"] * case["S"], int4_impl=int4_impl() if quant == "int4" else "triton"))


def int4_impl(dtype: torch.dtype = torch.bfloat16) -> str:
    """The int4 kernel LabDecoderBlock's default (int4_impl="auto") picks on this machine's GPU."""
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return "gluon" if int4_gluon_refusal(device, dtype) is None else "triton"


def _source_name(source: str) -> str:
    """ "lab: kernels/rotary.py (writes ...)" -> "kernels/rotary.py"; "torch: F.linear (...)" -> "F.linear"."""
    return source.split(": ", 1)[-1].split(" (", 1)[0]


def _provenance(table: dict[str, str], side: str, decode: bool = False) -> str:
    """The ops of `table` from `side` ("lab" or "torch"), grouped by what serves them (at decode, DECODE_ATTENTION)."""
    by_source: dict[str, list[str]] = {}
    for label, source in table.items():
        if source.startswith(f"{side}:"):
            by_source.setdefault(_source_name(source), []).append(label)
    parts = []
    for name, labels in by_source.items():
        if name == "F.linear":
            name = "F.linear: cuBLAS"
        elif decode and "attention" in labels:
            name += f', DECODE_ATTENTION = "{DECODE_ATTENTION}"'
        parts.append(f"{', '.join(labels)} ({name})")
    return "; ".join(parts) or "none"


def lab_description(quant: str | None) -> str:
    """Which op of the lab's block comes from the lab's kernels and which from torch (kernels/decoder_block.py)."""
    prefill = sources_for(quant, DECODE_ATTENTION, "prefill", rows=1024)
    return (f"the lab's block (kernels/decoder_block.py). Prefill: lab kernels for {_provenance(prefill, 'lab')}; "
            f"torch for {_provenance(prefill, 'torch')}. Decode: {decode_provenance(quant)}")


def decode_provenance(quant: str | None) -> str:
    """The same for the decode step, narrow and wide."""
    narrow = sources_for(quant, DECODE_ATTENTION, "decode", rows=1)
    wide = sources_for(quant, DECODE_ATTENTION, "decode", rows=64)
    changed = [label for label in wide if wide.get(label) != narrow.get(label)]
    text = f"lab kernels for {_provenance(narrow, 'lab', True)}; torch for {_provenance(narrow, 'torch', True)}"
    if changed:
        text += (f"; above {FUSED_QKV_MAX_ROWS} rows {', '.join(changed)} are torch's "
                 f"({', '.join(dict.fromkeys(_source_name(wide[label]) for label in changed))})")
    return f"{text}. So {_DECODE_ATTENTION_WHY[DECODE_ATTENTION]}"


# --------------------------------------------------------------------------------------------------------
# Op-by-op breakdown: the label around a kernel's launch, else a class read from the kernel's name
# --------------------------------------------------------------------------------------------------------

# Kernels launched outside any op annotation (torch.compile's, and every kernel a CUDA graph replays) are
# grouped by what their names say they hold; the first class whose key a name contains wins, so the lab's
# fused RMSNorm + linear (a projection) and dequantising kernels count as projections, not as norms.
_NAME_CLASSES = (
    (("gemm", "gemv", "sm90_xmma", "cutlass", "nvjet", "splitk", "matmul", "dequant", "linear"), "projections (matmul)"),
    (("flash", "fmha", "attention", "attn", "cudnn", "sdpa"), "attention"),
    (("rotary", "rope", "cos", "sin", "neg", "cat"), "rotary (by kernel name)"),
    (("rsqrt", "mean", "rms"), "norms (by kernel name)"),
    (("silu", "sigmoid", "swiglu"), "swiglu (by kernel name)"),
    (("memcpy", "memset", "copy", "index_put", "scatter"), "copies"),
)


class KernelClassifier:
    """An op name for a kernel (the innermost op label around its launch, else a class of its name), and whether
    a kernel is the lab's own (a Triton kernel of `sources`): each op records how many of its kernels are."""

    def __init__(self, sources: tuple[str, ...]):
        self.sources = sources

    def __call__(self, kernel: str, labels: tuple[str, ...]) -> str:
        if labels:
            return labels[-1]
        name = kernel.lower()
        for keys, op in _NAME_CLASSES:
            if any(key in name for key in keys):
                return op
        return "other"

    @functools.cached_property
    def lab_kernels(self) -> frozenset[str]:
        return triton_kernel_names(self.sources)

    def is_lab(self, kernel: str) -> bool:
        return kernel in self.lab_kernels


classify = KernelClassifier(QUANT_SOURCES)
