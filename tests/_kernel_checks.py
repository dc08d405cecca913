"""Shared helpers of the kernel tests (tests/test_kernels_*.py): seeds, sketch comparison, output bits,
and a softmax launch by sketch layout. Not a test module; the tests import it as `_kernel_checks`.

    from _kernel_checks import bits, close, seed, softmax_layout

Kernel modules are imported inside the functions, so a test module sets TRITON_INTERPRET=1 before
anything imports triton, whatever the order of its imports.
"""

from __future__ import annotations

import math

import torch


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


def softmax_layout(x: torch.Tensor, variant: int) -> tuple[dict[str, float], bool]:
    """(sketch of x by softmax layout `variant`, y bit-identical to the kernel without the sketch)."""
    from optwin.kernels import read_sketch
    from optwin.kernels.sketch_buffer import new_buffer
    from optwin.kernels.softmax import _softmax_launch

    x2 = x.reshape(-1, x.shape[-1])  # (rows, n)
    y1, y0 = torch.empty_like(x2), torch.empty_like(x2)
    buf = new_buffer("softmax", x.device)
    _softmax_launch(x2, y1, buf, variant=variant)
    _softmax_launch(x2, y0, None)
    return read_sketch("softmax", buf, x.shape), bool(torch.equal(bits(y1), bits(y0)))
