"""Shared helpers of the kernel tests (tests/test_kernels_*.py): seeds, sketch comparison, output bits,
a softmax launch by sketch layout, and loading a bench script as a module. Not a test module; the
tests import it as `_kernel_checks`.

    from _kernel_checks import bench_script, bits, close, seed, softmax_layout

Kernel modules are imported inside the functions, so a test module sets TRITON_INTERPRET=1 before
anything imports triton, whatever the order of its imports.
"""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path
from types import ModuleType

import torch

BENCH = Path(__file__).resolve().parents[1] / "bench"


def bench_script(name: str) -> ModuleType:
    """bench/<name>.py loaded as the module `name` (registered in sys.modules: dataclasses look their
    module up)."""
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def seed(*key: object) -> torch.Generator:
    """A generator seeded from the test's key (stable across runs and processes)."""
    return torch.Generator().manual_seed(sum(map(ord, repr(key))) * 7919 % 2**31)


def close(got: dict[str, float], want: dict[str, float], rtol: float = 1e-5) -> None:
    """Same feature names in the same order, each value within rtol (NaN nowhere equal)."""
    assert list(got) == list(want)
    for k, w in want.items():
        assert math.isclose(got[k], w, rel_tol=rtol, abs_tol=1e-30), f"{k}: kernel {got[k]} != want {w}"


def bits(y: torch.Tensor) -> torch.Tensor:
    """y's bit patterns as integers (2- or 4-byte dtypes), for bit-identity checks."""
    return y.view(torch.int16) if y.element_size() == 2 else y.view(torch.int32)


def softmax_layout(x: torch.Tensor, variant: int | None) -> tuple[dict[str, float], bool]:
    """(sketch of x by softmax layout `variant`, y bit-identical to the kernel without the sketch)."""
    from optwin.kernels import read_sketch
    from optwin.kernels.sketch_buffer import new_buffer
    from optwin.kernels.softmax import _softmax_launch
    from optwin.kernels.softmax_window import WINDOW_LAYOUTS

    x2 = x.reshape(-1, x.shape[-1])  # (rows, n)
    y1, y0 = torch.empty_like(x2), torch.empty_like(x2)
    buf = new_buffer("softmax", x.device)
    _softmax_launch(x2, y1, buf, variant=variant)
    _softmax_launch(x2, y0, None, window=variant is None or variant in WINDOW_LAYOUTS)  # the sketched launch's rows
    return read_sketch("softmax", buf, x.shape), bool(torch.equal(bits(y1), bits(y0)))


def norm_inputs(op: str, x: torch.Tensor) -> dict[str, torch.Tensor]:
    """rmsnorm / layernorm inputs around x: seeded weight (and bias) of x's width and dtype."""
    g = seed("norm-params", op, x.shape[-1])
    n = x.shape[-1]
    inp = {"x": x, "weight": (1 + 0.2 * torch.randn(n, generator=g)).to(x.dtype)}
    if op == "layernorm":
        inp["bias"] = (0.1 * torch.randn(n, generator=g)).to(x.dtype)
    return inp


def run_norm(op: str, inp: dict[str, torch.Tensor], sketch: bool = True, **kw) -> tuple[torch.Tensor, dict[str, float] | None]:
    """(y, sketch or None) of the Triton rmsnorm / layernorm on 2-D inputs; kw are launch overrides."""
    from optwin.kernels import read_sketch
    from optwin.kernels.sketch_buffer import new_buffer

    x = inp["x"]
    y = torch.empty_like(x)
    buf = new_buffer(op, x.device) if sketch else None
    if op == "layernorm":
        from optwin.kernels.layernorm import EPS, _layernorm_launch

        _layernorm_launch(x, inp["weight"], inp["bias"], y, buf, EPS, **kw)
    else:
        from optwin.kernels.rmsnorm import EPS, _rmsnorm_launch

        _rmsnorm_launch(x, inp["weight"], y, buf, EPS, **kw)
    return y, (read_sketch(op, buf, x.shape) if sketch else None)
