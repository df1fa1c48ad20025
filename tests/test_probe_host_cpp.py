"""probes/host_cpp.py's parameter layout, without building the extension or a GPU: the Launcher it binds
gets the kernel's parameters in order, constexprs left out, the two scratch pointers added, and the slots of
the input and output pointers."""

from __future__ import annotations

from types import SimpleNamespace


from probes import host_cpp as probe_host_cpp  # noqa: E402


def _route(signature: dict, tail: tuple, mode: str = "raw", **meta):
    gx, gy, gz = 7, 1, 1
    metadata = SimpleNamespace(num_ctas=1, global_scratch_size=0, profile_scratch_size=0, num_warps=4, shared=96)
    for name, value in meta.items():
        setattr(metadata, name, value)
    compiled = SimpleNamespace(metadata=metadata, src=SimpleNamespace(signature=signature), function=1234)

    def launch(*varying):
        return gx, gy, gz, tail

    launch.compiled, launch.mode = compiled, mode
    return SimpleNamespace(launch=launch)


class _Ext:
    @staticmethod
    def Launcher(*args):
        return args


def test_parameters_in_kernel_order_without_constexprs():
    signature = {"x_ptr": "*fp32", "y_ptr": "*fp32", "n_cols": "i32", "x_stride": "i32", "y_stride": "constexpr",
                 "BLOCK_N": "constexpr", "EDGES": "constexpr"}
    got = probe_host_cpp.launcher_for(_Ext, _route(signature, (1000, 1024, 1, 1024, False)))
    function, gx, gy, gz, threads, shared, values, input_slot, output_slot = got
    assert (function, gx, gy, gz, threads, shared) == (1234, 7, 1, 1, 128, 96)
    assert values == [0, 0, 1000, 1024, 0, 0]  # x, y, n_cols, x_stride, then the two scratch pointers
    assert (input_slot, output_slot) == (0, 1)


def test_routes_it_cannot_bind_are_refused():
    signature = {"x_ptr": "*fp32", "y_ptr": "*fp32"}
    assert probe_host_cpp.launcher_for(_Ext, _route(signature, (), mode="jit")) is None
    assert probe_host_cpp.launcher_for(_Ext, _route(signature, (), global_scratch_size=64)) is None
    assert probe_host_cpp.launcher_for(_Ext, _route(signature, (), num_ctas=2)) is None
    assert probe_host_cpp.launcher_for(_Ext, _route({**signature, "d": "nvTmaDesc"}, (0,))) is None
