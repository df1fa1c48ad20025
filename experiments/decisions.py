"""Decision records: the project's conclusions, each fed by the live verdicts of its experiments."""

from experiments.spec import Decision

DECISIONS = (
    Decision(
        slug="row-softmax",
        title="Row softmax",
        question="May the site present the lab's row-softmax kernel as a win over PyTorch at the seed shape?",
        experiments=("softmax-row-fusion",),
        if_supported="Present the row-softmax kernel as a measured win at 4096x1024 on the GPUs listed, and only there.",
        if_rejected="Do not present the row-softmax kernel as a win: a peer was faster at 4096x1024.",
        otherwise="Make no claim either way until the evidence is fresh and decisive.",
    ),
    Decision(
        slug="softmax-dispatch",
        title="Softmax dispatch (impl='auto')",
        question="Does impl='auto' pick a schedule that keeps the lab's softmax level with the best peer at every row length?",
        experiments=("softmax-fwd-sweep", "softmax-short-rows", "softmax-long-rows", "softmax-bwd-sweep",
                     "softmax-bwd-long-rows"),
        if_supported="Keep the current dispatch threshold and settings tables: they hold parity with the best peer at every measured point.",
        if_rejected="Treat the dispatch as unfinished: at some row lengths a peer is faster; the sweep pages show where.",
        otherwise="Keep the dispatch, but claim no parity until every sweep is fresh and decisive.",
    ),
    Decision(
        slug="rmsnorm-linear-fusion",
        title="Fused RMSNorm + linear",
        question="Should the lab recommend its fused RMSNorm + linear kernel over the unfused PyTorch pair for inference?",
        experiments=("rmsnorm-linear-decode", "rmsnorm-linear-prefill"),
        if_supported=(
            "Recommend the fused kernel at the measured decode and prefill shapes on the GPUs listed: it beat the "
            "best PyTorch path by the declared margins."
        ),
        if_rejected=(
            "Do not present the fused kernel as a speed-up: at some measured shape the unfused PyTorch pair or "
            "torch.compile was faster; the experiment pages show where and by how much."
        ),
        otherwise="Make no claim for or against the fusion until both shape classes have fresh, decisive evidence.",
    ),
    Decision(
        slug="fused-add-rmsnorm-swiglu",
        title="Fused residual add + RMSNorm and SwiGLU",
        question=(
            "May the lab present its fused residual add + RMSNorm and SwiGLU kernels as at least as fast as "
            "torch.compile and Liger for training, forward and backward?"
        ),
        experiments=("add-rmsnorm-fwd", "add-rmsnorm-bwd", "swiglu-fwd", "swiglu-bwd"),
        if_supported=(
            "Present both kernels as level with or faster than the best peer, forward and backward, at the measured "
            "shapes on the GPUs listed."
        ),
        if_rejected=(
            "Do not present them as a speed-up over the peers: at some shape and direction a peer was faster; the "
            "experiment pages show where and by how much."
        ),
        otherwise="Make no claim either way until all four experiments have fresh, decisive evidence.",
    ),
)
