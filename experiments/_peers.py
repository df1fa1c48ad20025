"""What the pages say about optional peers that a machine may lack (not an experiment itself)."""

QUACK_NOTE = (
    "QuACK (pip package quack-kernels) is written in NVIDIA's CuTe DSL and imports only with the "
    "nvidia-cutlass-dsl wheels (their CUDA 13 libraries alone about 92 MB), apache-tvm-ffi and torch-c-dlpack-ext "
    "installed beside torch"
)
