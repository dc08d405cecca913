"""The Triton kernels' sketches give +0.0, never -0.0, for the magnitude features of all-zero inputs (+0.0 or
-0.0 entries), as optwin.ingest does, under TRITON_INTERPRET=1: every op's launch, and softmax's three ways
to its features (persistent, a program per row, the long rows' chunked kernel).

    python -m pytest -q tests/test_kernels_sketch_zero_sign.py
"""

from __future__ import annotations

import math
import os

os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported (the kernels read it at decoration)

import pytest  # noqa: E402
import torch  # noqa: E402
from _kernel_checks import seed  # noqa: E402

from optwin.ingest.sketch import SIGNED_FEATURES  # noqa: E402
from optwin.kernels import read_sketch  # noqa: E402
from optwin.kernels.sketch_buffer import new_buffer  # noqa: E402


def _negative_zeros(sk: dict[str, float]) -> list[str]:
    """The unsigned features (counts, shapes, magnitudes) that read -0.0."""
    return [n for n, v in sk.items() if n not in SIGNED_FEATURES and math.copysign(1.0, v) < 0]


def _softmax(x: torch.Tensor, **launch) -> dict[str, float]:
    from optwin.kernels.softmax import _softmax_launch

    buf = new_buffer("softmax", x.device)
    _softmax_launch(x, torch.empty_like(x), buf, **launch)
    return read_sketch("softmax", buf, x.shape)


@pytest.mark.parametrize("sign", [1.0, -1.0], ids=["+0", "-0"])
@pytest.mark.parametrize("launch", [{}, {"variant": 10, "rows": True}, {"piece": 64}],
                         ids=["persistent", "per-row", "long"])
def test_softmax_absmax_of_zeros_is_positive_zero(sign: float, launch: dict) -> None:
    x = torch.zeros(5, 200, dtype=torch.float16).mul(sign)
    sk = _softmax(x, **launch)
    assert sk["absmax"] == 0.0 and math.copysign(1.0, sk["absmax"]) == 1.0, sk
    assert not _negative_zeros(sk), sk


@pytest.mark.parametrize("sign", [1.0, -1.0], ids=["+0", "-0"])
def test_other_ops_magnitudes_of_zeros_are_positive_zero(sign: float) -> None:
    from optwin.kernels.attention import attention
    from optwin.kernels.layernorm import layernorm
    from optwin.kernels.rmsnorm import rmsnorm
    from optwin.kernels.rope import rope

    g = seed("zero-sign", sign)
    z = lambda *s: torch.zeros(*s).mul(sign)  # noqa: E731
    r = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    calls = {
        "layernorm, all zero": ("layernorm", (4, 64), lambda: layernorm(z(4, 64), z(64), z(64))),
        "layernorm, zero bias": ("layernorm", (4, 64), lambda: layernorm(r(4, 64), r(64), z(64))),
        "rmsnorm, all zero": ("rmsnorm", (4, 64), lambda: rmsnorm(z(4, 64), z(64))),
        "rope, all zero": ("rope", (5, 2, 8), lambda: rope(z(5, 2, 8), torch.zeros(5, dtype=torch.int64))),
        "attention, all zero": ("attention", (1, 2, 6, 16), lambda: attention(z(1, 2, 6, 16), z(1, 2, 9, 16), z(1, 2, 9, 16))),
        "attention, zero v": ("attention", (1, 2, 6, 16), lambda: attention(r(1, 2, 6, 16), r(1, 2, 9, 16), z(1, 2, 9, 16))),
    }
    for what, (op, shape, call) in calls.items():
        _, buf = call()
        sk = read_sketch(op, buf, shape)
        assert not _negative_zeros(sk), f"{what}: {sk}"
