"""Test set-up: without CUDA the kernels run through Triton's interpreter; with CUDA, compiled, unchanged.

TRITON_INTERPRET must be set before Triton decorates the kernels, so it is set when pytest is configured,
before any test module imports `kernels`. Under `-n N` the process that hands tests to the workers runs none
and imports no torch.
"""

from __future__ import annotations

import os

import pytest

# Under `-n N` each worker computes on one thread: N workers already fill N cores, and torch's and OpenBLAS's
# own threads only spin waiting for each other (15% more CPU time for the same interpreter tests on 2 cores).
# Likewise torch.compile compiles in the worker itself: a pool of compile processes, each importing torch, cost
# each worker that compiles about 5 CPU seconds more (2 cores). Set before torch and numpy load, which read
# these once.
if os.environ.get("PYTEST_XDIST_WORKER"):
    for _threads in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "TORCHINDUCTOR_COMPILE_THREADS"):
        os.environ.setdefault(_threads, "1")

HAS_CUDA = False  # both set in pytest_configure, before test modules import them
DEVICE = "cpu"


def pytest_configure(config):
    global HAS_CUDA, DEVICE
    if _hands_out_tests_only(config):
        return
    import torch

    HAS_CUDA = torch.cuda.is_available()
    if not HAS_CUDA:
        os.environ.setdefault("TRITON_INTERPRET", "1")
    DEVICE = "cuda" if HAS_CUDA else "cpu"
    if os.environ.get("TRITON_INTERPRET") == "1":
        _speed_up_the_interpreter()
    if not HAS_CUDA and os.environ.get("KERNEL_LAB_TEST_INDUCTOR") != "1":
        _compile_with_aot_eager(torch)


def _compile_with_aot_eager(torch) -> None:
    """Without CUDA, torch.compile with inductor (its default) compiles with aot_eager instead: the same capture
    by dynamo and AOTAutograd (graph breaks under fullgraph, guards, recompiles, the backward graph), run by
    torch's own kernels instead of inductor's generated C++. No record ever measures inductor's CPU code: on a
    GPU, where the peers are timed, inductor writes Triton kernels, and the GPU tests compile with it unchanged.
    Inductor's first compile in a process costs about 5 s (its import and the C++ build); the two workers paid
    it in every test that ran a torch.compile peer. KERNEL_LAB_TEST_INDUCTOR=1 keeps inductor."""
    import functools

    real = getattr(torch.compile, "replaced", torch.compile)

    @functools.wraps(real)
    def compile(model=None, *, backend="inductor", mode=None, options=None, **kwargs):
        if backend == "inductor":  # aot_eager takes neither inductor's mode nor its options
            return real(model, backend="aot_eager", **kwargs)
        return real(model, backend=backend, mode=mode, options=options, **kwargs)

    compile.replaced = real
    torch.compile = compile


def _hands_out_tests_only(config) -> bool:
    """Whether this is pytest-xdist's controller, which runs no test itself."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        return False
    return bool(getattr(config.option, "numprocesses", None)) and getattr(config.option, "dist", "no") != "no"


def _speed_up_the_interpreter() -> None:
    """Five things Triton 3.6's interpreter works out again and again, worked out once or only when asked; what
    each kernel computes is unchanged (tests/test_suite_setup.py holds each to what the interpreter does alone).

    * At every call of a @triton.jit helper it re-patches triton.language, listing every member of the
      language's modules and classes (inspect.getmembers) to find the builtins: a fifth of an interpreter
      test's time. Which members are builtins never changes, so they are listed here, once, while the language
      is as Triton made it (no kernel has run yet); each call then patches those of them that are still
      builtins, exactly what the full listing would find.
    * Inside a launch, the patching at every call of a helper changes nothing whenever the launch has already
      patched the language modules the helper sees (triton.language, triton.language.core): the launch patched
      every builtin of them, nothing inside a launch puts one back, and the rest of the patching sets the same
      stateless replacements again. Such a call skips it: a tenth of an interpreter test's time. A helper
      that sees a module the launch did not patch is patched as before.
    * Every value it touches asks which numpy dtype holds its Triton type, and each answer built a table of
      nineteen types first. The answer is a function of the element type alone (a block's is its element's,
      every pointer's is uint64): each is kept.
    * Every tensor it makes builds a tuple of its shape, and every such tuple names its type in a string
      (language.core.tuple), which almost nothing reads. The type is made when it is first read, from the
      same values (a tuple given its type keeps it, as before).
    * Every block type it makes checks its shape and writes its name; both are kept per shape (below)."""
    import inspect

    import triton
    import triton.language as tl
    from triton.runtime import interpreter

    original = getattr(interpreter, "_patch_builtin", None)
    if triton.__version__ != "3.6.0" or original is None or not hasattr(interpreter, "_patch_attr"):
        return  # another Triton: its interpreter as it is
    names = {pkg: tuple(name for name, member in inspect.getmembers(pkg) if tl.core.is_builtin(member))
             for pkg in (tl, tl.core, tl.tensor, tl.math, tl.core.tensor_descriptor_base)}

    def _patch_builtin(pkg, builder, scope):
        if pkg not in names:
            return original(pkg, builder, scope)
        for name in names[pkg]:
            member = getattr(pkg, name)
            if tl.core.is_builtin(member):
                interpreter._patch_attr(pkg, name, member, builder, scope)

    _patch_builtin.builtins = names  # for the test that holds them equal to a full listing
    interpreter._patch_builtin = _patch_builtin

    np_dtype = interpreter._get_np_dtype
    known: dict = {}

    def _get_np_dtype(tt_dtype):
        key = tt_dtype.element_ty if isinstance(tt_dtype, tl.block_type) else tt_dtype
        if isinstance(key, tl.pointer_type):
            key = tl.pointer_type
        try:
            return known[key]
        except KeyError:
            found = known[key] = np_dtype(tt_dtype)
            return found
        except TypeError:  # a type that cannot be a key: asked afresh
            return np_dtype(tt_dtype)

    _get_np_dtype.uncached = np_dtype
    interpreter._get_np_dtype = _get_np_dtype

    patch_lang, launch = interpreter._patch_lang, interpreter.GridExecutor.__call__
    patched: list[set[int]] = []  # per launch in progress (innermost last): the language modules it patched

    def _languages(fn) -> set[int]:
        # what _patch_lang looks for among the function's globals (modules compare by identity)
        return {id(lang) for lang in (tl, tl.core) if any(value is lang for value in fn.__globals__.values())}

    def _patch_lang(fn):
        languages = _languages(fn)
        if patched and patched[-1] and languages <= patched[-1]:
            _patch_lang.skipped += 1
            return interpreter._LangPatchScope()  # a helper inside a launch that patched all it sees
        scope = patch_lang(fn)
        if patched:
            patched[-1] |= languages
        return scope

    def __call__(self, *args, **kwargs):
        patched.append(set())
        try:
            return launch(self, *args, **kwargs)
        finally:
            patched.pop()

    _patch_lang.unskipped, _patch_lang.patched, _patch_lang.skipped = patch_lang, patched, 0  # for the tests
    interpreter._patch_lang = _patch_lang
    interpreter.GridExecutor.__call__ = __call__

    core = tl.core
    _speed_up_block_types(core)
    expected = ("    def __init__(self, args: Sequence, type: Optional[tuple_type] = None):\n"
                "        self.values = [i for i in args]\n"
                "        if isinstance(type, tuple_type):\n"
                "            self.type = type\n"
                "        elif type is not None:  # make_template in ASTFunction.deserialize may pass us a list/tuple\n"
                "            self.type = tuple_type(type)\n"
                "        else:\n"
                "            self.type = _type_for_tuple_values(self.values)\n")
    if inspect.getsource(core.tuple.__init__) != expected or "type" in vars(core.tuple):
        return  # not the constructor this replaces

    def __init__(self, args, type=None):
        self.values = [i for i in args]
        if isinstance(type, core.tuple_type):
            self.type = type
        elif type is not None:
            self.type = core.tuple_type(type)

    class TypeWhenRead:
        """The tuple's type, made from its values on first reading and kept as its attribute from then on."""

        def __get__(self, obj, owner=None):
            if obj is None:
                return self
            made = obj.__dict__["type"] = core._type_for_tuple_values(obj.values)
            return made

    __init__.replaced = core.tuple.__init__
    core.tuple.__init__ = __init__
    core.tuple.type = TypeWhenRead()


def _speed_up_block_types(core) -> None:
    """A block type (language.core.block_type) checks and names its shape each time one is made, and the
    interpreter makes one for nearly every value: the checks and the name's shape part are kept per shape of
    plain ints (each type still gets its own shape tuple); any other shape is made as before."""
    import builtins
    import inspect

    expected = ("    def __init__(self, element_ty: dtype, shape: List):\n"
                "        self.element_ty = element_ty\n"
                "\n"
                "        # Note that block_type's shape is a list of int\n"
                "        # while tensor's shape is a list of constexpr.\n"
                "        assert (isinstance(shape, (list, tuple)))\n"
                "\n"
                "        # shape can be empty ([]) when an input is a 0D tensor.\n"
                "        self.shape = tuple(_unwrap_shape(shape))\n"
                "        if not self.shape:\n"
                "            raise TypeError('0d block_type is forbidden')\n"
                "\n"
                "        self.numel = validate_block_shape(self.shape)\n"
                "        self.name = f'<{self.shape}, {self.element_ty}>'\n")
    if inspect.getsource(core.block_type.__init__) != expected:
        return  # not the constructor this replaces
    made = core.block_type.__init__
    checked: dict[tuple, tuple[int, str]] = {}  # shape -> (numel, the shape as the name shows it)

    def __init__(self, element_ty, shape):
        kind = type(shape)
        values = shape if kind is list else shape.values if kind is core.tuple else None
        ints = values is not None and builtins.tuple(
            v.value if type(v) is core.constexpr else v for v in values)
        if not ints or any(type(v) is not int for v in ints):
            return made(self, element_ty, shape)
        known = checked.get(ints)
        if known is None:
            made(self, element_ty, shape)  # checks it, or raises as before
            known = checked[ints] = (self.numel, str(self.shape))
            return None
        self.element_ty = element_ty
        self.shape = core.tuple(ints)
        self.numel = known[0]
        self.name = f"<{known[1]}, {element_ty}>"
        return None

    __init__.replaced = made
    core.block_type.__init__ = __init__


@pytest.fixture
def device() -> str:
    return DEVICE


@pytest.fixture
def gen():
    """A seeded generator on the CPU (a torch.Generator): inputs are drawn there and moved, so a failure
    reproduces anywhere."""
    import torch

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
