"""A patched rotary call that runs the model's own code (here: under autograd) is still monitored, as unpatched.

    python -m pytest -q tests/test_monitor_s48_rope_fallback.py

With the patch applied before the monitor, the monitor's wrapper of apply_rotary_pos_emb wraps our patched
function and, under a "warn" monitor, left the call's sketch to the kernel. The patched function runs HF's own
code on the calls its kernel cannot take (gradients, tensors off the kernels' device, float64, partial rotary,
unsqueeze_dim other than 1: optwin.kernels.patching, rotary_runs), and then no kernel handed a sketch over: the
monitor lost its rope streams. A tiny random-weight Llama under torch.enable_grad(), whose weights require grad,
so every patched call runs the model's code; our Triton kernels run under TRITON_INTERPRET=1.
"""

from __future__ import annotations

import os
from contextlib import nullcontext

os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported

import pytest  # noqa: E402
import torch  # noqa: E402

import optwin.kernels  # noqa: E402
import optwin.monitor as om  # noqa: E402
from _matcher_fixture import cached_db  # noqa: E402


@pytest.fixture(scope="module")
def db(tmp_path_factory) -> str:
    return cached_db(str(tmp_path_factory.mktemp("fp") / "fp.duckdb"))


def _llama() -> torch.nn.Module:
    import transformers  # imports triton: after TRITON_INTERPRET is set

    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=100, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                                   num_attention_heads=2, num_key_value_heads=2, attn_implementation="eager")
    return transformers.LlamaForCausalLM(cfg).eval()


IDS = torch.randint(1, 100, (1, 8), generator=torch.Generator().manual_seed(1))  # (1, 8)


def test_a_patched_rope_running_the_models_code_is_monitored(db):
    model = _llama()

    def monitored(patched: bool) -> tuple[set, int, object]:
        with torch.enable_grad(), optwin.kernels.patch(model) if patched else nullcontext() as h, \
                om.Monitor(model, db=db, sampling="always") as mon:
            model(IDS)
        return set(mon.streams), mon.stats.checked, h

    want, want_checked, _ = monitored(False)
    got, got_checked, h = monitored(True)
    assert not h.calls  # every call ran the model's code
    assert got == want and got_checked == want_checked
    assert {k[0] for k in got if k[1] == "rope"} == {"model.layers.0.self_attn:q:rope", "model.layers.0.self_attn:k:rope"}
