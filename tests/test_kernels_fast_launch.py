"""optwin.kernels.fast_launch: the specialization key it caches compiled kernels under, its hook test,
and its launches under the interpreter (where it hands every call to Triton). The direct path itself
runs only on a GPU: bench/launch_cost.py times it there, and the GPU checks (bench/row_records_check.py,
bench/gpu_kernels.py, bench/gpu_attention.py) launch every kernel through it."""

from __future__ import annotations

import os
import sys

os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported (the kernels read it at decoration)

import torch  # noqa: E402
from _kernel_checks import bench_script  # noqa: E402

from optwin.kernels import fast_launch  # noqa: E402
from optwin.kernels.fast_launch import _arg_key, _hooked  # noqa: E402


def test_int_key_separates_what_triton_specializes():
    keys = {v: _arg_key(v) for v in (1, 2, 16, 17, 32, 2**31 - 16, 2**31, -16, 2**40)}
    assert keys[1] != keys[2]  # == 1 is a constant to Triton
    assert keys[16] != keys[17] and keys[16] == keys[32]  # divisible by 16, or not
    assert keys[2**31 - 16] != keys[2**31]  # int32 against int64 arguments
    assert keys[-16] == keys[16]  # the same specialization: one compiled kernel for both
    assert _arg_key(True) != _arg_key(1) and _arg_key(False) != _arg_key(0)  # bools by value


def test_tensor_key_is_dtype_and_16_byte_alignment():
    x = torch.zeros(64, dtype=torch.float32)
    assert _arg_key(x) == (torch.float32, True)
    assert _arg_key(x[1:]) == (torch.float32, False)  # 4 bytes in: not aligned
    assert _arg_key(x[4:]) == (torch.float32, True)
    assert _arg_key(x.to(torch.float16)) != _arg_key(x)
    assert _arg_key(torch.nn.Parameter(x)) == _arg_key(x)  # a subclass keys as a tensor


def test_other_arguments_key_by_value_and_floats_by_type():
    assert _arg_key(1e-6) == _arg_key(2.5)  # fp32 scalars: never specialized
    assert _arg_key(None) is None
    assert _arg_key("evict_first") == "evict_first"


class _Chain:
    def __init__(self, calls):
        self.calls = calls


def test_hooks_count_only_when_something_listens():
    assert not _hooked(None)
    assert not _hooked(_Chain([]))  # Triton 3.5+ always holds an empty chain
    assert _hooked(_Chain([print]))
    assert _hooked(print)  # older Triton: a plain callable


def test_interpreter_launches_go_through_triton():
    from optwin.kernels.rmsnorm import rmsnorm

    assert fast_launch._state["direct"] is False  # TRITON_INTERPRET=1 in the tests
    x = torch.randn(5, 48)
    w = torch.ones(48)
    y, _ = rmsnorm(x, w, 1e-6, sketch=False)
    want = x / torch.sqrt((x * x).mean(-1, keepdim=True) + 1e-6)
    assert torch.allclose(y, want, rtol=1e-5, atol=1e-6)
    assert not fast_launch._PLANS  # nothing cached: every call was Triton's own


def test_host_pow2_and_cdiv_match_triton():
    import triton

    from optwin.kernels._common import cdiv, next_pow2

    assert all(next_pow2(v) == triton.next_power_of_2(v) for v in [*range(0, 4100), 65535, 65536, 65537, 2**40 + 3])
    assert all(cdiv(a, b) == triton.cdiv(a, b) for a in range(-40, 300) for b in range(1, 33))


def test_launch_cost_host_table_runs_on_cpu():
    """bench/launch_cost.py --host: our launchers' own Python, timed with the kernel call left out."""
    launch_cost = bench_script("launch_cost")
    launch_cost.ROUNDS, launch_cost.CALLS = 1, 3
    table = launch_cost.host_only()
    rows = [line for line in table.splitlines() if line.startswith("| ") and line.split("|")[1].strip() in
            ("rmsnorm", "layernorm", "softmax", "rope")]
    assert len(rows) == 4
    assert all(float(c) > 0 for r in rows for c in r.strip("|").split("|")[1:])
    deferred_rows = [line for line in table.splitlines() if line.startswith(("| softmax x", "| layernorm x"))]
    assert len(deferred_rows) == 2 and all(float(c) > 0 for r in deferred_rows for c in r.strip("|").split("|")[1:])
    from optwin.kernels import launch_plan, softmax_long

    assert launch_plan.launch_keyed is fast_launch.launch_keyed  # the kernel calls are back after the bench
    assert softmax_long.launch is fast_launch.launch


def test_constexprs_and_options_key_by_value():
    """Constexpr ints must not share a plan by their divisibility: PIECES=32 and PIECES=64 are two kernels
    (the bug of the first GPU run: a 2x262144 launch ran the 5x128256 plan and read half its pieces)."""
    from optwin.kernels.fast_launch import _key, _rest
    from optwin.kernels.softmax_long import _piece_out_kernel as k

    x = torch.zeros(8, 64)

    def key(pieces_const, n_pieces=64, warps=4, **extra):
        args = (x, 64, x, 64, x, x, x, x, x, 2, 64, n_pieces, 2, 0.5)
        return _key(k, 0, (128,), args, {"SKETCH": False, "CHUNK": 4096, "PIECES": pieces_const, "num_warps": warps,
                                          **extra})

    assert key(32) != key(64)  # a constexpr: by value
    assert key(64, warps=4) != key(64, warps=8)  # a launch option: by value
    assert key(64, n_pieces=64) == key(64, n_pieces=32)  # runtime ints: both divisible by 16, one kernel
    assert key(64, n_pieces=64) != key(64, n_pieces=38)
    assert [n for n, _ in _rest(k, 14)] == ["SKETCH", "CHUNK", "PIECES", "ALIGN"]  # from the keywords, in order


def _captured_launches():
    """Every kernel call our launchers make over shapes, dtypes and sketch on/off that share many
    specialization classes (rows 2/3/5, widths with 32/38/64 pieces, ...): (kernel, grid, args, kwargs),
    recorded instead of launched (launch_cost.kernel_calls_replaced)."""
    from optwin.kernels.attention import attention
    from optwin.kernels.sketch_buffer import new_buffer

    launch_cost = bench_script("launch_cost")
    OPS, _sweep_launcher = launch_cost.OPS, sys.modules["gpu_kernels"]._sweep_launcher  # imported by launch_cost
    calls = []
    with launch_cost.kernel_calls_replaced(lambda kernel, grid, *a, **k: calls.append((kernel, grid, a, k))):
        g = torch.Generator().manual_seed(0)
        shapes = {"rmsnorm": [(5, 4096), (2, 8192), (3, 781), (16, 16384), (1, 100000)],
                  "layernorm": [(5, 4096), (2, 8192), (3, 781), (16, 16384), (1, 100000)],
                  "softmax": [(5, 128256), (3, 151936), (2, 262144), (4, 4096), (3, 781), (1, 3)],
                  "rope": [(16, 4096), (7, 2048), (1, 4096)]}
        for op, sh in shapes.items():
            for shape in sh:
                for dt in (torch.bfloat16, torch.float32):
                    inp, params = OPS[op].make(shape, dt, "cpu", g)
                    if op != "rope":
                        inp = {k: (v.reshape(-1, v.shape[-1]) if k == "x" else v) for k, v in inp.items()}
                    y = torch.empty_like(inp["x"])
                    f = _sweep_launcher(op, inp, params, y, {})
                    f(None)
                    f(new_buffer(op, "cpu"))
        for b, h, sq, sk, d in ((1, 2, 40, 40, 16), (2, 3, 129, 77, 64), (1, 4, 256, 256, 128), (1, 1, 17, 300, 128)):
            for dt in (torch.bfloat16, torch.float32):
                q = torch.zeros(b, h, sq, d, dtype=dt)
                kv = torch.zeros(b, h, sk, d, dtype=dt)
                for causal in (False, True):
                    for sk_on in (False, True):
                        attention(q, kv, kv, causal, sketch=sk_on)
    return calls


def test_equal_plan_keys_mean_equal_triton_specializations():
    """The property the direct path rests on: two calls with the same fast_launch key get the same
    kernel from Triton (the same specialization by Triton's own native_specialize_impl for sm_90, and the
    same constexprs and options). The first key broke it for constexpr ints."""
    import pytest

    nvidia = pytest.importorskip("triton.backends.nvidia.compiler")
    from triton._C.libtriton import native_specialize_impl
    from triton.backends.compiler import GPUTarget

    from optwin.kernels.fast_launch import _key, _rest, _signature

    backend = nvidia.CUDABackend(GPUTarget("cuda", 90, 32))
    seen: dict = {}
    calls = _captured_launches()
    assert len(calls) > 40
    for kernel, grid, args, kwargs in calls:
        sig = _signature(kernel)
        values = list(args) + [kwargs.get(n, default) for n, default in _rest(kernel, len(args))]
        triton_spec = tuple(("constexpr", v) if c else native_specialize_impl(backend, v, False, True, True)
                            for v, c in zip(values, sig.constexpr))
        options = tuple(sorted((k, v) for k, v in kwargs.items() if k not in sig.names))
        key = _key(kernel, 0, grid, args, kwargs)
        assert seen.setdefault(key, (triton_spec, options)) == (triton_spec, options), kernel
    assert len(seen) > 10
