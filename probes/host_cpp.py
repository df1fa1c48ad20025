"""Probe (GPU for the timing; the C++ builds anywhere with a C++ compiler and ninja): what softmax(x) would cost
the host if one C++ call allocated the output and launched the lab's compiled Triton kernel.

    python -m probes.host_cpp [OUT_DIR]

notes/host-overhead.md puts the Python floor above torch.softmax's whole call: Triton 3.6's C launcher
(about 5.5 us on the H100 host) plus one allocation from Python (3.8 us) leave under a microsecond for the
rest. This builds a small extension (torch.utils.cpp_extension.load_inline) whose `Launcher` is bound once
per route to the route's compiled kernel (its CUfunction, grid, warps, shared memory and the fixed
arguments laid out as the kernel's parameters, as Triton's launcher lays them) and then, per call,
allocates with at::empty_like and calls the driver's cuLaunchKernel, found with dlsym (no CUDA headers).
The stream comes from the caller. It times, host time per call over back-to-back calls at 1 x 1024 fp32 and
bf16: torch.softmax, the lab's softmax, the C++ launcher behind the lab's route lookup, and the C++ launcher
alone; each C++ output is compared with the lab's first. A tuning instrument, not evidence. Writes
OUT_DIR/probe_host_cpp.json (OUT_DIR defaults to $OUT, else the current directory).
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import time
from pathlib import Path

import torch

QUESTION = "How much of the lab's host time per call would one C++ call that allocates and launches take away?"
CANDIDATES = ("torch.softmax", "lab softmax", "C++ launcher behind the route lookup", "C++ launcher alone")
SHAPES = ((1, 1024), (1, 131072))
OUTPUTS = {"host-cpp": ("notes/probes/2026-11-25-h100-host-cpp.json",)}

if __package__ in (None, ""):  # run as a script: the repository root on the path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

CPP = r"""
#include <torch/extension.h>
#include <dlfcn.h>
#include <cstring>
#include <vector>

namespace {

using LaunchFn = int (*)(void*, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, void*,
                         void**, void**);

LaunchFn driver_launch() {
  static LaunchFn fn = nullptr;
  if (fn == nullptr) {
    void* lib = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_GLOBAL);
    TORCH_CHECK(lib != nullptr, "probe_host_cpp: libcuda.so.1 not found");
    fn = reinterpret_cast<LaunchFn>(dlsym(lib, "cuLaunchKernel"));
    TORCH_CHECK(fn != nullptr, "probe_host_cpp: cuLaunchKernel not found in libcuda.so.1");
  }
  return fn;
}

constexpr int kMaxParams = 32;

// One compiled kernel over one grid. `values` and `sizes` are the kernel's parameters in order (constexprs
// left out, the two scratch pointers included); `input` and `output` index the two tensor pointers.
struct Launcher {
  void* function;
  unsigned gx, gy, gz, threads, shared;
  std::vector<uint64_t> values;
  int input, output;

  Launcher(int64_t function, int64_t gx, int64_t gy, int64_t gz, int64_t threads, int64_t shared,
           std::vector<int64_t> values, int64_t input, int64_t output)
      : function(reinterpret_cast<void*>(function)), gx(gx), gy(gy), gz(gz), threads(threads), shared(shared),
        input(input), output(output) {
    TORCH_CHECK(values.size() <= kMaxParams, "probe_host_cpp: too many kernel parameters");
    for (int64_t v : values) this->values.push_back(static_cast<uint64_t>(v));
  }

  torch::Tensor operator()(const torch::Tensor& x, int64_t stream) const {
    torch::Tensor y = at::empty_like(x);
    uint64_t slots[kMaxParams];
    void* params[kMaxParams];
    const size_t n = values.size();
    std::memcpy(slots, values.data(), n * sizeof(uint64_t));
    slots[input] = reinterpret_cast<uint64_t>(x.data_ptr());
    slots[output] = reinterpret_cast<uint64_t>(y.data_ptr());
    for (size_t i = 0; i < n; ++i) params[i] = &slots[i];  // a 4-byte parameter reads its slot's low bytes
    int status = driver_launch()(function, gx, gy, gz, threads, 1, 1, shared, reinterpret_cast<void*>(stream),
                                 params, nullptr);
    TORCH_CHECK(status == 0, "probe_host_cpp: cuLaunchKernel returned ", status);
    return y;
  }
};

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  pybind11::class_<Launcher>(m, "Launcher")
      .def(pybind11::init<int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, std::vector<int64_t>, int64_t,
                          int64_t>())
      .def("__call__", &Launcher::operator());
}
"""

# Bytes a parameter of each Triton type takes; every one of them sits in a 64-bit slot.
_SIZES = {"i1": 1, "i8": 1, "u8": 1, "i16": 2, "u16": 2, "i32": 4, "u32": 4, "fp32": 4, "i64": 8, "u64": 8,
          "fp64": 8}


def build():
    from torch.utils.cpp_extension import load_inline

    return load_inline(name="kernel_lab_host_probe", cpp_sources=CPP, extra_cflags=["-O2"], verbose=False)


def launcher_for(ext, route):
    """An extension Launcher bound to `route`'s forward kernel, or None when the route does not launch raw."""
    launch = route.launch
    compiled = getattr(launch, "compiled", None)
    if compiled is None or getattr(launch, "mode", None) != "raw":
        return None
    closure = dict(zip(launch.__code__.co_freevars, (c.cell_contents for c in launch.__closure__ or ())))
    tail, (gx, gy, gz) = closure["tail"], (closure["gx"], closure["gy"], closure["gz"])
    meta = compiled.metadata
    if meta.num_ctas != 1 or meta.global_scratch_size or meta.profile_scratch_size:
        return None
    args = [0, 0, *tail]  # the input and output pointers first, as the route passes them
    values, positions = [], []
    for i, (name, ty) in enumerate(compiled.src.signature.items()):
        if ty == "constexpr":
            continue
        if not (ty.startswith("*") or ty in _SIZES):
            return None
        positions.append(i)
        values.append(int(args[i]))
    values += [0, 0]  # global and profile scratch: none
    return ext.Launcher(compiled.function, gx, gy, gz, 32 * meta.num_warps, meta.shared, values,
                        positions.index(0), positions.index(1))


def per_call_us(fn, calls: int = 4000, repeats: int = 5) -> float:
    best = float("inf")
    for _ in range(repeats):
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - start) / calls * 1e6)
        torch.cuda.synchronize()
    return best


def main(argv=None) -> int:
    out_dir = Path((argv or sys.argv[1:] or [os.environ.get("OUT", ".")])[0])
    if not torch.cuda.is_available():
        print("probe_host_cpp: needs a CUDA GPU for the timing", file=sys.stderr)
        return 2
    started = time.time()
    ext = build()
    module = importlib.import_module("kernels.softmax")
    raw_stream = torch._C._cuda_getCurrentRawStream
    result = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "build_s": time.time() - started,
              "timing": "host time per call: wall time over 4,000 back-to-back calls, best of 5", "rows": []}
    for dtype in (torch.float32, torch.bfloat16):
        x = torch.randn(1, 1024, device="cuda", dtype=dtype)
        want = module.softmax(x)
        key = (x.__class__, x.shape, x.stride(), x.dtype, x.device, int, -1, "auto", x.data_ptr() % 16)
        route = module._ROUTES[key]
        cpp = launcher_for(ext, route)
        row = {"dtype": str(dtype).removeprefix("torch."), "shape": [1, 1024]}
        if cpp is None:
            row["error"] = "the route does not launch raw"
            result["rows"].append(row)
            continue
        device = x.device.index
        got = cpp(x, raw_stream(device))
        row["cpp_equal_to_lab"] = bool(torch.equal(got, want))
        routes = {key: cpp}

        def through_route(x=x):
            launcher = routes[x.__class__, x.shape, x.stride(), x.dtype, x.device, int, -1, "auto", x.data_ptr() % 16]
            return launcher(x, raw_stream(x.device.index))

        row["us"] = {
            "torch.softmax": per_call_us(lambda: torch.softmax(x, -1)),
            "lab softmax": per_call_us(lambda: module.softmax(x)),
            "C++ launcher behind the route lookup": per_call_us(through_route),
            "C++ launcher alone": per_call_us(lambda: cpp(x, 0)),
        }
        result["rows"].append(row)
        print(json.dumps(row), flush=True)
    result["wall_s"] = time.time() - started
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "probe_host_cpp.json").write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
