"""bench/ab_snapshot.py: a frozen copy of the package runs beside the live one (same kernels, same
results, its own workspace), and every sketched launch leaves the workspace at its identities.

    python -m pytest -q tests/test_kernels_ab.py
"""

from __future__ import annotations

import importlib
import os
import sys

import pytest
import torch

os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported

from _kernel_checks import bench_script  # after TRITON_INTERPRET


def _ab_module():
    return bench_script("ab_snapshot")


@pytest.mark.parametrize("rev", [None, "HEAD"])
def test_snapshot_runs_beside_the_live_package(tmp_path, rev):
    from optwin.kernels.rmsnorm import rmsnorm
    from optwin.kernels.sketch_buffer import read_sketch

    dest = _ab_module().snapshot("abtest", rev, tmp_path)
    assert (dest / "kernels" / "rmsnorm.py").read_text().count("from optwin_abtest.") >= 3
    assert "from optwin." not in (dest / "kernels" / "rmsnorm.py").read_text()
    sys.path.insert(0, str(tmp_path))
    try:
        frozen = importlib.import_module("optwin_abtest.kernels.rmsnorm")
        frozen_buf = importlib.import_module("optwin_abtest.kernels.sketch_buffer")
        g = torch.Generator().manual_seed(0)
        x = torch.randn(5, 300, generator=g).to(torch.bfloat16)
        w = torch.rand(300, generator=g).to(torch.bfloat16)
        y_live, s_live = rmsnorm(x, w)
        y_frozen, s_frozen = frozen.rmsnorm(x, w)
        assert torch.equal(y_live, y_frozen)
        assert read_sketch("rmsnorm", s_live) == frozen_buf.read_sketch("rmsnorm", s_frozen)
        assert frozen_buf._WS is not importlib.import_module("optwin.kernels.sketch_buffer")._WS
    finally:
        sys.path.remove(str(tmp_path))
        for name in [n for n in sys.modules if n.startswith("optwin_abtest")]:
            del sys.modules[name]


def test_snapshot_name_is_checked(tmp_path):
    with pytest.raises(SystemExit, match="use lower-case"):
        _ab_module().snapshot("Bad-Name", None, tmp_path)


@pytest.mark.parametrize("op", ["rmsnorm", "layernorm", "softmax", "rope"])
def test_sketched_launch_leaves_the_workspace_at_its_identities(op):
    """The last program reads the slots (read_slot) and resets them (reset_workspace): after a launch
    over inputs with NaN, inf and -inf, every float slot holds its identity again and every count 0."""
    from optwin.kernels import layernorm, rmsnorm, rope, softmax
    from optwin.kernels.sketch_buffer import (
        SLOTS,
        read_sketch,
        workspace,
        workspace_identities,
    )

    g = torch.Generator().manual_seed(1)
    x = torch.randn(6, 4, 64, generator=g)
    x[0, 0, 3], x[2, 1, 5], x[3, 2, 7] = float("nan"), float("inf"), -float("inf")
    w = torch.rand(64, generator=g)
    if op == "rmsnorm":
        _, buf = rmsnorm.rmsnorm(x, w)
    elif op == "layernorm":
        _, buf = layernorm.layernorm(x, w, torch.zeros(64))
    elif op == "softmax":
        _, buf = softmax.softmax(x)
    else:
        _, buf = rope.rope(x, torch.arange(6))
    feats = read_sketch(op, buf)
    assert feats["nonfinite"] >= 2
    f, i = workspace(op, x.device)
    idents = torch.tensor(workspace_identities(op), dtype=torch.float64)
    assert torch.equal(f[:SLOTS], idents) and torch.equal(f[SLOTS:], idents)
    assert torch.equal(i, torch.zeros_like(i))
