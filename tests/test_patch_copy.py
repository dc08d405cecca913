"""A deepcopy of a patched model computes with its own parameters; torch.save of a patched model works.

    python -m pytest -q tests/test_patch_copy.py
"""

from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported

import copy  # noqa: E402
import io  # noqa: E402

import torch  # noqa: E402
from torch import nn  # noqa: E402

import optwin.kernels  # noqa: E402


def _net() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.LayerNorm(16), nn.Linear(16, 16), nn.RMSNorm(16))


def test_a_deepcopy_of_a_patched_model_runs_with_its_own_weights():
    """The swapped forward was a closure over the patched module: deepcopy kept it, so the clone computed with the
    original's weights (clone(x) ignored every change to the clone). The clone now runs its own code with its own
    parameters; the patch, its counts and its undo stay the original's."""
    net = _net()
    x = torch.randn(3, 8, generator=torch.Generator().manual_seed(1))  # (3, 8)
    with torch.no_grad(), optwin.kernels.patch(net) as h:
        clone = copy.deepcopy(net)
        clone[1].weight.fill_(2.0), clone[1].bias.fill_(5.0), clone[3].weight.fill_(3.0)
        got, mine = clone(x), net(x)
        h1 = nn.functional.layer_norm(clone[0](x), (16,), clone[1].weight, clone[1].bias, clone[1].eps)
        want = nn.functional.rms_norm(clone[2](h1), (16,), clone[3].weight, clone[3].eps)  # the clone's own maths
    assert torch.allclose(got, want, atol=1e-6), (got - want).abs().max().item()
    assert h.calls == {"layernorm": 1, "rmsnorm": 1}  # the original's call only
    assert not torch.allclose(mine, got)


def test_torch_save_of_a_patched_model_loads_a_working_model():
    """torch.save pickles the module's instance forward: a closure could not be pickled ("Can't pickle local
    object"); a bound method pickles as getattr(module, "forward"), which on load is the class's forward."""
    net = _net()
    x = torch.randn(3, 8, generator=torch.Generator().manual_seed(1))
    buf = io.BytesIO()
    with torch.no_grad():
        ref = net(x)
        with optwin.kernels.patch(net):
            torch.save(net, buf)
        buf.seek(0)
        loaded = torch.load(buf, weights_only=False)
        assert torch.equal(loaded(x), ref)
