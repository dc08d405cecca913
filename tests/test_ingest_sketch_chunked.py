"""softmax and rope sketches reduce their input in chunks of rows: the same numbers, a bounded working set.

    python -m pytest -q tests/test_ingest_sketch_chunked.py
"""

from __future__ import annotations

import importlib
import math

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from optwin.ingest import sketch_tensor

SK = importlib.import_module("optwin.ingest.sketch")  # the module (optwin.ingest.sketch is also the function)


class _LargestTensor(TorchDispatchMode):
    """Counts the bytes of every tensor an aten op allocates; keeps the largest (the biggest temporary).
    Views (outputs on an input's storage: detach, reshape, row slices) allocate nothing and are skipped."""

    def __init__(self) -> None:
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        held = {a.untyped_storage().data_ptr() for a in tree_leaves((args, kwargs)) if isinstance(a, torch.Tensor)}
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() not in held:
                self.largest = max(self.largest, t.untyped_storage().nbytes())
        return out


def _cases(g: torch.Generator) -> dict[str, dict[str, torch.Tensor]]:
    x = torch.randn(96, 64, generator=g) * 6
    x[3] = -math.inf  # a fully masked row
    x[5, ::3] = -math.inf  # a partly masked row
    x[7, 2] = math.nan
    x[9] *= 40  # a peaked row
    r = torch.randn(24, 4, 32, generator=g) * 3
    r[2, 1, 5] = math.inf
    return {"softmax": {"x": x.half().float()},  # exact in every precision
            "softmax_f16": {"x": x.half()},
            "rope": {"x": r, "positions": torch.arange(24) * 100}}


@pytest.mark.parametrize("chunk_bytes", [8 * 64, 8 * 64 * 5, 8 * 64 * 7 + 3])
def test_chunked_equals_unchunked_and_bounds_each_float64_temporary(chunk_bytes: int, monkeypatch) -> None:
    for name, inp in _cases(torch.Generator().manual_seed(5)).items():
        op = name.split("_")[0]
        names, whole = sketch_tensor(op, inp)  # default budget: one chunk for these sizes
        monkeypatch.setattr(SK, "CHUNK_BYTES", chunk_bytes)
        with _LargestTensor() as seen:
            _, chunked = sketch_tensor(op, inp)
        monkeypatch.undo()
        assert torch.equal(chunked, whole), (name, dict(zip(names, (chunked - whole).tolist())))
        assert whole[names.index("nonfinite")] > 0
        rows = inp["x"].numel() // inp["x"].shape[-1]
        # float64 temporaries of a chunk stay within the budget (one row at least); the per-row sums of
        # squares (rows float64) and the float64 copy of rope's positions are the only other tensors.
        width = inp["x"].shape[-1]
        bound = max(chunk_bytes // (8 * width), 1) * width * 8
        assert seen.largest <= max(bound, 8 * rows), (name, seen.largest, bound)
        assert seen.largest < inp["x"].numel() * 8 / 4  # far below a float64 copy of the whole input
