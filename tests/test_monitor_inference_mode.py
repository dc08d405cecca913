"""A "warn" monitor on a model patched with our kernels, under torch.inference_mode (the README's advice).

    python -m pytest -q tests/test_monitor_inference_mode.py

Inference tensors keep no version counter (reading `_version` raises). The monitor's rope tail
cache (max |position| per rotary call) used it to notice positions changed in place, so every
forward raised "Inference tensors do not track version counter". A tiny random-weight Llama runs
the Triton kernels under TRITON_INTERPRET=1.
"""

from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported

import torch  # noqa: E402

import optwin.kernels  # noqa: E402
import optwin.monitor as om  # noqa: E402
from optwin.ingest.models import load_llama_tiny  # noqa: E402

SEQ = 9
IDS = torch.randint(0, 1000, (2, SEQ), generator=torch.Generator().manual_seed(1))  # (batch, seq)
KEY = ("model.layers.1.self_attn:k:rope", "rope", "fp32-angles", "float32")


def test_patched_warn_monitor_runs_under_inference_mode_and_follows_in_place_positions(db):
    model = load_llama_tiny("eager").module
    with torch.inference_mode():
        pos = torch.arange(SEQ).repeat(2, 1)  # (batch, seq), an inference tensor
        with optwin.kernels.patch(model) as handle, \
                om.monitor(model, db=db, sampling="always", ops=("rope",)) as mon:
            model(input_ids=IDS, position_ids=pos)
            first = dict(mon.last_sketches[KEY])
            pos.mul_(3)  # the same tensor changed in place: no version counter tells
            model(input_ids=IDS, position_ids=pos)
    assert handle.sketched["rope"] == 8  # 2 forwards x 2 layers x (q, k), all fused
    assert mon.stats.skipped == 0
    assert first["max_pos"] == SEQ - 1
    assert mon.last_sketches[KEY]["max_pos"] == 3 * (SEQ - 1)  # the second rotary call's positions


def test_in_place_positions_without_a_new_rotary_call_still_refresh_outside_inference_mode(db):
    # Outside inference mode the version counter still catches an in-place change seen by the same
    # rotary call (what the cache was keyed on before).
    model = load_llama_tiny("eager").module
    with torch.no_grad(), optwin.kernels.patch(model), om.monitor(model, db=db, sampling="always", ops=("rope",)) as mon:
        rec = mon._rec
        rec.last_positions = pos = torch.arange(SEQ).repeat(2, 1)
        assert rec.rope_tail(10000.0).tolist() == [SEQ - 1, 10000.0]
        assert rec.rope_tail(10000.0) is rec.rope_tail(10000.0)  # cached: once per rotary call
        pos.add_(10)
        assert rec.rope_tail(10000.0).tolist() == [SEQ + 9, 10000.0]
