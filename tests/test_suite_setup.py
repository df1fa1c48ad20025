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
    if os.environ.get("TORCHINDUCTOR_COMPILE_THREADS") == "1":
        from torch._inductor import config

        assert config.compile_threads == 1, "torch.compile compiles in the worker, with no pool of processes"


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


def _replaced_constructor(cls):
    """Triton's own constructor of `cls` (a triton.language.core class) that conftest replaced: there on Triton
    3.6, which conftest was written against; elsewhere the test skips, as conftest leaves the class alone."""
    import triton

    replaced = getattr(cls.__init__, "replaced", None)
    if triton.__version__ == "3.6.0":
        assert replaced is not None, f"Triton 3.6's {cls.__name__} constructor is the one conftest replaces"
    if replaced is None:
        pytest.skip(f"this Triton's {cls.__name__} is as Triton made it")
    return replaced


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="the interpreter runs only without CUDA")
def test_a_tuple_reads_the_type_it_was_given_or_would_have_been():
    import triton.language as tl

    core = tl.core
    replaced = _replaced_constructor(core.tuple)

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


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="the interpreter runs only without CUDA")
def test_a_helper_inside_a_launch_skips_only_patching_that_would_change_nothing(monkeypatch):
    import types

    import triton
    import triton.language as tl
    from triton.runtime import interpreter

    unskipped = getattr(interpreter._patch_lang, "unskipped", None)
    if triton.__version__ == "3.6.0":
        assert unskipped is not None, "Triton 3.6's _patch_lang is the one conftest wraps"
    if unskipped is None:
        pytest.skip("this Triton's interpreter patches as Triton made it")

    # _patch_lang reads only the function's globals: which of triton.language and triton.language.core it sees.
    def seeing(**modules):
        return types.FunctionType((lambda: None).__code__, dict(modules))

    sees_tl, sees_both = seeing(tl=tl), seeing(tl=tl, core=tl.core)

    # What a helper's patching changes once its launch has patched the same language: only what the launch
    # changed already (no builtin is left to replace; the rest is set again to the same stateless functions).
    # A helper that also sees triton.language.core changes more.
    launch = unskipped(sees_tl)
    try:
        done = {(id(obj), name) for obj, name, _ in launch._changes}
        for helper, more in ((sees_tl, False), (sees_both, True)):
            again = unskipped(helper)
            changed = {(id(obj), name) for obj, name, _ in again._changes}
            again.restore()
            assert changed and bool(changed - done) == more, helper.__globals__.keys()
    finally:
        launch.restore()

    # The wrapper skips a helper only inside a launch that patched every language module the helper sees.
    patched = interpreter._patch_lang.patched
    assert patched == [], "no launch in progress between tests"
    outside = interpreter._patch_lang(sees_tl)
    assert outside._changes, "outside a launch: patched"
    outside.restore()
    patched.append({id(tl)})
    try:
        assert interpreter._patch_lang(sees_tl)._changes == [], "sees only what the launch patched: skipped"
        scope = interpreter._patch_lang(sees_both)
        assert scope._changes and patched[-1] == {id(tl), id(tl.core)}, "sees triton.language.core too: patched"
        assert interpreter._patch_lang(sees_both)._changes == [], "and from then on skipped"
        scope.restore()
    finally:
        patched.pop()

    # And a launch with a helper computes the same bits either way; with the wrapper, each program's call of the
    # helper skipped the patching.
    x = torch.linspace(-3, 3, 100, dtype=torch.float32)
    wrapper, outs = interpreter._patch_lang, []
    for patch_lang in (wrapper, unskipped):
        monkeypatch.setattr(interpreter, "_patch_lang", patch_lang)
        skipped = wrapper.skipped
        y = torch.full_like(x, float("nan"))
        _add_helper_kernel[(2,)](x, y, x.numel(), BLOCK=64)
        outs.append(y)
        assert wrapper.skipped - skipped == (2 if patch_lang is wrapper else 0)
    assert torch.equal(outs[0], outs[1]) and not outs[0].isnan().any()
    torch.testing.assert_close(outs[0], 0.5 * torch.exp(x) + x, rtol=1e-6, atol=1e-6)


if os.environ.get("TRITON_INTERPRET") == "1":  # a kernel for the test above; the interpreter runs it on the CPU
    import triton
    import triton.language as tl

    @triton.jit
    def _scaled_exp(x):
        return 0.5 * tl.exp(x)

    @triton.jit
    def _add_helper_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
        offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offsets < n
        x = tl.load(x_ptr + offsets, mask=mask)
        tl.store(y_ptr + offsets, _scaled_exp(x) + x, mask=mask)


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="the interpreter runs only without CUDA")
def test_a_block_type_is_made_as_triton_makes_it_or_refused_alike():
    import triton.language as tl

    core = tl.core
    replaced = _replaced_constructor(core.block_type)

    def eager(element_ty, shape):
        made = core.block_type.__new__(core.block_type)
        replaced(made, element_ty, shape)
        return made

    def made(make, element_ty, shape):
        try:
            t = make(element_ty, shape)
        except Exception as exc:  # noqa: BLE001 - refused: by the same exception, saying the same
            return type(exc), str(exc)
        assert type(t.shape) is core.tuple
        return t.element_ty, list(t.shape), t.numel, t.name, str(t), t

    shapes = [[16], [16, 32], [1, 64, 2], core.tuple([8, 4]), [core.constexpr(32), 2], core.tuple([core.constexpr(2)]),
              [0, 4], [True, 2], [], [3], [2.0], (4, 4), [1 << 21], [core.constexpr(3)]]
    for element_ty in (tl.float32, tl.bfloat16, tl.int1, tl.pointer_type(tl.float16)):
        for shape in shapes:
            for _ in range(2):  # checked, then known
                fast, before = made(core.block_type, element_ty, shape), made(eager, element_ty, shape)
                if len(before) == 2:  # refused
                    assert fast == before, (element_ty, shape)
                else:
                    assert fast[:-1] == before[:-1], (element_ty, shape)
                    assert fast[-1] == before[-1] and fast[-1].shape is not before[-1].shape
    a, b = core.block_type(tl.float32, [4, 4]), core.block_type(tl.float32, [4, 4])
    assert a.shape is not b.shape, "each type its own shape"


@pytest.mark.skipif(torch.cuda.is_available() or os.environ.get("KERNEL_LAB_TEST_INDUCTOR") == "1",
                    reason="only without CUDA does torch.compile's default backend become aot_eager")
def test_without_cuda_torch_compile_keeps_dynamos_capture_and_skips_inductor():
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    x = torch.randn(3, 5)
    f = torch.compile(lambda t: torch.softmax(t, -1) * 2.0, fullgraph=True, mode="max-autotune")
    torch.testing.assert_close(f(x), torch.softmax(x, -1) * 2.0)
    assert counters["aot_autograd"]["ok"] == 1 and not counters["inductor"], dict(counters)

    def breaks(t):  # a graph break still fails under fullgraph, as it would on a GPU
        torch._dynamo.graph_break()
        return t + 1

    with pytest.raises(torch._dynamo.exc.Unsupported):
        torch.compile(breaks, fullgraph=True)(x)
    named = torch.compile(lambda t: t * 3.0, backend="eager")  # a backend named is kept
    torch.testing.assert_close(named(x), x * 3.0)
    assert not counters["inductor"]
