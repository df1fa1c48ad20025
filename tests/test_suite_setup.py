"""What tests/conftest.py sets up for the whole suite changes how fast it runs, never what a test computes."""

from __future__ import annotations

import inspect
import os

import pytest
import torch


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="the interpreter runs only without CUDA")
def test_the_interpreter_patches_exactly_the_builtins_it_listed_and_restores_them():
    import triton.language as tl
    from triton.runtime import interpreter

    listed = getattr(interpreter._patch_builtin, "builtins", None)
    for pkg in (tl, tl.tensor, tl.math, tl.core, tl.core.tensor_descriptor_base):
        # Outside a launch, after the kernels the tests ran so far. (Triton leaves some of a helper's patches in
        # place, so fewer members may be builtins now than when the list was made; none may be new.)
        before = dict(inspect.getmembers(pkg))
        builtins = sorted(name for name, member in before.items() if tl.core.is_builtin(member))
        assert builtins, pkg
        if listed is not None:
            assert set(builtins) <= set(listed[pkg]), f"{pkg}: a builtin that was not listed"
        for _ in range(2):  # listed on the first call, read from the list on the second
            scope = interpreter._LangPatchScope()
            interpreter._patch_builtin(pkg, interpreter.interpreter_builder, scope)
            assert sorted(name for _, name, _ in scope._changes) == builtins, pkg
            assert not any(tl.core.is_builtin(getattr(pkg, name)) for name in builtins), "every builtin is patched"
            scope.restore()
            assert all(getattr(pkg, name) is before[name] for name in builtins), "and put back"


def test_a_worker_computes_on_one_thread():
    if not os.environ.get("PYTEST_XDIST_WORKER") or os.environ.get("OMP_NUM_THREADS") != "1":
        pytest.skip("only pytest-xdist's workers are held to one thread, unless OMP_NUM_THREADS says otherwise")
    assert torch.get_num_threads() == 1


def test_the_set_up_the_tests_import_is_the_one_pytest_configured():
    import conftest

    assert conftest.HAS_CUDA == torch.cuda.is_available()
    assert conftest.DEVICE == ("cuda" if torch.cuda.is_available() else "cpu")
    assert conftest.HAS_CUDA or os.environ.get("TRITON_INTERPRET") == "1"


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="the interpreter runs only without CUDA")
def test_the_numpy_dtype_kept_for_a_triton_type_is_the_one_it_would_work_out():
    import triton.language as tl
    from triton.runtime import interpreter

    uncached = getattr(interpreter._get_np_dtype, "uncached", interpreter._get_np_dtype)
    scalars = [tl.int1, tl.int8, tl.uint8, tl.int16, tl.uint16, tl.int32, tl.uint32, tl.int64, tl.uint64, tl.float16,
               tl.bfloat16, tl.float32, tl.float64, tl.float8e5, tl.float8e4nv]
    types = [*scalars, *(tl.pointer_type(t) for t in scalars), *(tl.block_type(t, [16, 32]) for t in scalars),
             *(tl.block_type(t, [8]) for t in scalars), *(tl.block_type(tl.pointer_type(t), [4]) for t in scalars)]
    for _ in range(2):  # asked afresh, then kept
        for t in types:
            assert interpreter._get_np_dtype(t) == uncached(t), t
    with pytest.raises(KeyError):
        interpreter._get_np_dtype(tl.void)


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="the interpreter runs only without CUDA")
def test_a_tuple_reads_the_type_it_was_given_or_would_have_been():
    import triton
    import triton.language as tl

    core = tl.core
    replaced = getattr(core.tuple.__init__, "replaced", None)
    if triton.__version__ == "3.6.0":
        assert replaced is not None, "Triton 3.6's tuple constructor is the one conftest replaces"
    if replaced is None:
        pytest.skip("this Triton's tuple is as Triton made it")

    def eager(values, type=None):
        made = core.tuple.__new__(core.tuple)
        replaced(made, values, type)
        return made

    for values in ([], [1, 2.5, tl.float32], [core.constexpr(4), 8], [core.tuple([1, 2]), 3]):
        lazy, before = core.tuple(values), eager(values)
        assert (lazy.type.name, lazy.type.fields) == (before.type.name, before.type.fields), values
        assert lazy.type is lazy.type, "made once"
    given = core.tuple_type([core.constexpr_type(1), core.constexpr_type(2)], ["a", "b"])
    assert core.tuple([1, 2], given).type is given and core.tuple([1, 2], given).a == 1
    listed = core.tuple([1, 2], [core.constexpr_type(1), core.constexpr_type(2)])
    assert listed.type.name == eager([1, 2], [core.constexpr_type(1), core.constexpr_type(2)]).type.name
    changed, before = core.tuple([1, 2]), eager([1, 2])
    changed._setitem(core.constexpr(0), 7)
    before._setitem(core.constexpr(0), 7)
    assert changed.type.name == before.type.name == core._type_for_tuple_values([7, 2]).name
