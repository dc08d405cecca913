"""A model patched and thrown away without undo leaves no claim on the objects that reuse its memory.

    python -m pytest -q tests/test_patch_id_reuse.py
"""

from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported

import gc  # noqa: E402

from torch import nn  # noqa: E402

import optwin.kernels  # noqa: E402


def test_a_new_model_at_a_freed_models_address_is_patched_whole():
    """patch's record of held swaps was keyed by id(module): once a patched model (its patch never undone) was
    freed, a new module that CPython placed at the same address looked held, and kept its own forward. Fresh
    models until one reuses a freed module's id (CPython's allocator does within a few): every one is swapped."""
    freed: set[int] = set()
    reused = 0
    for i in range(200):
        net = nn.Sequential(nn.Linear(32, 32), nn.LayerNorm(32), nn.LayerNorm(32))
        ids = {id(net[1]), id(net[2])}
        reused += bool(ids & freed)
        h = optwin.kernels.patch(net)  # never undone: the model is thrown away
        swapped = sum("forward" in m.__dict__ for m in net)
        assert swapped == 2, f"model {i}: {swapped} of 2 norms swapped (reused an id: {bool(ids & freed)})"
        freed |= ids
        del net, h
        gc.collect()
        if reused >= 3:
            break
    assert reused, "no module reused a freed one's id: the test saw nothing"
