"""Two patched models, each under its own "warn" monitor, run alternately: each monitor's rope streams of its own
model carry its own model's max position and base, though both monitors take the same fused buffer of a call.

    python -m pytest -q tests/test_patch_s48_two_monitors.py

A patched rotary call hands its sketch buffer to every active monitor (optwin.kernels.sketch_sink._Fanout), and
each monitor writes the two features the kernel cannot know (max |position|, base: slots 8 and 9) into that
shared buffer before reading it. Model A runs at positions past 100000 (where fp32 angles lose the position, the
fault rope's fingerprints track) and base 10000, model B at positions 0..7 and base 500000: a monitor reading the
other's write would see the other model's fault driver. Tiny random-weight Llamas run our Triton kernels under
TRITON_INTERPRET=1.
"""

from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported

import pytest  # noqa: E402
import torch  # noqa: E402

import optwin.kernels  # noqa: E402
import optwin.monitor as om  # noqa: E402
from _monitor_fixture import eager_llama  # noqa: E402

SEQ = 8




def _own_ropes(mon: om.Monitor) -> dict[str, tuple[float, float]]:
    """(max_pos, base) of the monitor's rope streams inside its model's attention (q and k)."""
    return {k[0]: (v["max_pos"], v["base"]) for k, v in mon.last_sketches.items()
            if k[1] == "rope" and k[0].startswith("model.layers.0.self_attn:")}


@pytest.mark.parametrize("a_outer", [True, False])  # _Fanout hands the buffer to the innermost monitor first
def test_each_monitor_reads_its_own_models_rope_tail_from_the_shared_buffer(db, a_outer):
    a, b = eager_llama(10000.0, 0), eager_llama(500000.0, 1)
    ids = torch.randint(1, 100, (1, SEQ), generator=torch.Generator().manual_seed(1))
    far = torch.arange(SEQ)[None] + 100000  # (1, SEQ): A's fault-inducing positions
    kw = {"db": db, "sampling": "always", "ops": ("rope",)}
    with torch.no_grad(), optwin.kernels.patch(a) as ha, optwin.kernels.patch(b) as hb:
        ma, mb = om.Monitor(a, **kw), om.Monitor(b, **kw)
        first, second = (ma, mb) if a_outer else (mb, ma)
        with first, second:
            for _ in range(2):  # alternately, so each monitor's last rotary call is its own model's or the other's
                a(ids, position_ids=far)
                b(ids)
    # the fused path for both models: the rotary is a global of the modeling module, patched by the first handle
    assert ha.sketched["rope"] == 8 and not hb.sketched  # 2 forwards x 2 models x (q, k)
    want_a, want_b = (SEQ - 1 + 100000.0, 10000.0), (SEQ - 1.0, 500000.0)
    assert _own_ropes(ma) == {"model.layers.0.self_attn:q:rope": want_a, "model.layers.0.self_attn:k:rope": want_a}
    assert _own_ropes(mb) == {"model.layers.0.self_attn:q:rope": want_b, "model.layers.0.self_attn:k:rope": want_b}
