"""Bad inputs to the public kernel functions get a one-line InputError before any launch (a short weight
would be read past its end), and patched models keep working on what the kernels do not take.

    python -m pytest -q tests/test_kernels_inputs.py
"""

from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported

import pytest  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402

import optwin.kernels  # noqa: E402
from optwin.errors import InputError  # noqa: E402
from optwin.ingest import sketch  # noqa: E402
from optwin.kernels.layernorm import layernorm  # noqa: E402
from optwin.kernels.rmsnorm import rmsnorm  # noqa: E402
from optwin.kernels.rope import rope, rope_from_tables  # noqa: E402
from optwin.kernels.softmax import softmax  # noqa: E402

X = torch.randn(3, 8)
ONES = torch.ones(8)

BAD = {
    "softmax of float64": (lambda: softmax(X.double()), "float16, bfloat16 or float32"),
    "softmax of ints": (lambda: softmax(torch.randint(0, 3, (3, 8))), "torch.int64"),
    "softmax into float64": (lambda: softmax(X, out_dtype=torch.float64), "out_dtype"),
    "softmax over an empty dim": (lambda: softmax(torch.randn(3, 0)), "last dim is empty"),
    "rmsnorm, short weight": (lambda: rmsnorm(X, torch.ones(7)), "weight must be"),
    "rmsnorm, integer weight": (lambda: rmsnorm(X, torch.ones(8, dtype=torch.int32)), "weight must be"),
    "rmsnorm of float64": (lambda: rmsnorm(X.double(), ONES), "float16, bfloat16 or float32"),
    "layernorm, short bias": (lambda: layernorm(X, ONES, torch.ones(5)), "bias must be"),
    "layernorm, 2-d weight": (lambda: layernorm(X, torch.ones(1, 8), ONES), "weight must be"),
    "rope, odd d": (lambda: rope(torch.randn(4, 2, 7), torch.arange(4)), "even"),
    "rope of float64": (lambda: rope(torch.randn(4, 2, 8).double(), torch.arange(4)), "float16"),
    "rope tables of another length": (
        lambda: rope_from_tables(torch.randn(1, 2, 4, 8), torch.randn(1, 3, 8), torch.randn(1, 3, 8)), "cos, sin"),
    "rope tables of another batch": (
        lambda: rope_from_tables(torch.randn(2, 2, 4, 8), torch.randn(3, 4, 8), torch.randn(3, 4, 8)), "cos, sin"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_inputs_get_one_line_errors(case):
    call, words = BAD[case]
    with pytest.raises(InputError) as err:
        call()
    msg = str(err.value)
    assert words in msg and "\n" not in msg


def test_layernorm_without_bias_is_a_zero_bias():
    x, w = torch.randn(5, 40), torch.rand(40) + 0.5
    y, buf = layernorm(x, w, None)
    ref = nn.functional.layer_norm(x, (40,), w, None, 1e-5)
    assert (y - ref).abs().max().item() < 1e-5
    got = optwin.kernels.read_sketch("layernorm", buf, x.shape)
    want = sketch("layernorm", {"x": x, "weight": w, "bias": torch.zeros(40)})
    assert got.keys() == want.keys()
    for k, v in want.items():
        assert got[k] == pytest.approx(v, rel=1e-5, abs=1e-6), k
    from optwin.kernels.layernorm import _zero_bias

    assert _zero_bias(w) is _zero_bias(w.clone())  # made once: no fill kernel on every bias-free call


def test_patch_takes_bias_free_layernorm_and_leaves_float64_alone():
    torch.manual_seed(3)
    net = nn.Sequential(nn.Linear(16, 48), nn.LayerNorm(48, bias=False), nn.GELU(), nn.LayerNorm(48))
    x = torch.randn(5, 16)
    with torch.no_grad():
        net[1].weight.uniform_(0.5, 2.0)
        ref = net(x)
        with optwin.kernels.patch(net) as h:
            got = net(x)
        assert h.calls == {"layernorm": 2}  # the bias-free norm is swapped too
        assert (got - ref).abs().max().item() < 1e-5

        net64, x64 = net.double(), x.double()
        ref64 = net64(x64)
        with optwin.kernels.patch(net64) as h64:
            got64 = net64(x64)
        assert h64.calls == {}  # float64 runs the modules' own code: the kernels compute in float32
        assert torch.equal(got64, ref64)


@pytest.mark.parametrize("positions,base,x_shape,msg", [
    (torch.arange(4.0) + 0.5, 1e4, (4, 2, 8), "'positions' must be an integer tensor"),  # truncated before
    (torch.arange(4) > 1, 1e4, (4, 2, 8), "'positions' must be an integer tensor"),
    (torch.arange(4), 0.5, (4, 2, 8), "base must be a finite number > 1"),  # NaN angles before
    (torch.arange(4), float("nan"), (4, 2, 8), "base must be a finite number > 1"),
    (torch.arange(4), 1e4, (4, 0, 8), "needs heads"),  # ZeroDivisionError before
])
def test_rope_refuses_what_it_would_compute_wrong(positions, base, x_shape, msg):
    with pytest.raises(InputError, match=msg):
        rope(torch.randn(*x_shape), positions, base)
