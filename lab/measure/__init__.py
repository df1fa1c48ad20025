"""Measuring on the GPU: the clocks, one run of an experiment into one record, the environment it ran on, the
profiler's facts, and runs spread over many GPUs through Ray (lab.measure.cluster, lab.measure.dispatch). The
only room that needs a GPU to do real work (on the CPU it runs the same code through Triton's interpreter,
and its figures are never performance evidence)."""
