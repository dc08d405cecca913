"""The rotary table check runs once per capture for a model built under torch.inference_mode too.

    python -m pytest -q tests/test_capture_s48b_rope_check_inference.py

_table_reason keeps its verdict while the module's inv_freq buffer, base, dtype, device and width stay; the
buffer's version counter was part of the key, and an inference tensor has none: the check and its host
sync re-ran on every forward (20 of 20 decode steps). Such a buffer's verdict is now kept by its identity
(HF assigns a new buffer to change it); a normal buffer changed in place is still checked again.
"""

from __future__ import annotations

import pytest
import importlib

import torch

from optwin.ingest.models import load_llama_tiny

# the module, not the `capture` function optwin.ingest exports under the same name: `import optwin.ingest.capture
# as C` binds whichever the package attribute holds, the function once another test imported it from the package
C = importlib.import_module("optwin.ingest.capture")


@pytest.fixture
def checks(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many times the table check computed (its amax over the tables), not returned a kept verdict."""
    n, inside = [0], [False]
    orig_reason, orig_amax = C._table_reason, torch.Tensor.amax

    def amax(self, *a, **k):  # noqa: ANN001, ANN002, ANN003, ANN202
        if inside[0]:
            n[0] += 1
        return orig_amax(self, *a, **k)

    def reason(*a, **k):  # noqa: ANN002, ANN003, ANN202
        inside[0] = True
        try:
            return orig_reason(*a, **k)
        finally:
            inside[0] = False

    monkeypatch.setattr(torch.Tensor, "amax", amax)
    monkeypatch.setattr(C, "_table_reason", reason)
    return n


def _ids() -> torch.Tensor:
    return torch.randint(1, 999, (1, 9), generator=torch.Generator().manual_seed(0))


def test_built_under_inference_mode_checks_once(checks: list[int]) -> None:
    with torch.inference_mode():
        m = load_llama_tiny("sdpa").module
    with torch.inference_mode(), C.capture(m) as rec:
        m.generate(_ids(), max_new_tokens=20, do_sample=False)
        assert checks[0] == 2  # cos and sin, once
        rot = m.model.rotary_emb
        rot.inv_freq = rot.inv_freq.clone()  # a new buffer (as HF's dynamic rope assigns one): checked again
        m(input_ids=_ids())
    assert checks[0] == 4
    assert sum(r["op"] == "rope" for r in rec.records()) == 4 * 21 and not rec.skipped  # q, k x 2 layers x 21 forwards


def test_a_normal_buffer_changed_in_place_is_checked_again(checks: list[int]) -> None:
    m = load_llama_tiny("sdpa").module
    with torch.no_grad(), C.capture(m) as rec:
        m(input_ids=_ids())
        m(input_ids=_ids())
        assert checks[0] == 2
        m.model.rotary_emb.inv_freq.mul_(1.0)  # same values, a new version: the verdict is not kept
        m(input_ids=_ids())
    assert checks[0] == 4 and not rec.skipped
