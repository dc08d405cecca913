"""optwin.kernels.patch(model) on a real GPU: patched outputs against the model's own, the kernel calls per op,
undo, and gradients (which must run the model's own code), for random-weight models built from configs.

    python bench/gpu_patch_check.py            # CUDA; prints and writes $OUT/patch_check.md
    TRITON_INTERPRET=1 python bench/gpu_patch_check.py --smoke   # CPU dry run, tiny models

Models: Llama, Qwen2, Gemma, Gemma2 (attn_logit_softcapping set), Phi (partial rotary), each eager attention
(transformers; skipped, and said so, where it is not installed), and a torch nn.Sequential of nn.LayerNorm and
nn.RMSNorm layers (torch only). Norm weights (and biases) are perturbed, so a dropped weight would show. CUDA:
hidden 1024, 4 layers, 16 heads of 64, batch 2 x seq 512; --smoke: hidden 64, 2 layers, 4 heads of 16, 2 x 9.
Per model and dtype (bfloat16, float16, float32):
  patched vs unpatched: max |logits| difference under torch.no_grad; ok when <= 2 x the dtype noise + atol (or the
    patched model's own distance from the reference <= 1.5 x the noise + atol), the
    noise being the unpatched model in that dtype against the same weights one precision up (float32; float64
    for the float32 rows), atol ATOL_REL x the largest |logit|; the noise cell also gives the patched model's own
    distance from that reference (it should be about the unpatched one's);
  calls: handle.calls after one forward against what patch should swap (Gemma's x * (1 + w) norms and Gemma2's
    soft-capped attention keep the model's code: 0 calls);
  undo: after handle.undo() the outputs equal the unpatched ones bit for bit, no instance forward left;
  grads: with the patch on, a forward + backward (grad enabled) gives the unpatched parameter gradients, with no
    kernel call (the kernels have no backward; patch falls back), and they are not all zero. A nonzero difference
    is held against a second unpatched run's (the GPU's own nondeterminism).
Exits 1 if any verdict fails.
"""

from __future__ import annotations

import argparse
import copy
import os
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

if "--smoke" in sys.argv:  # the CPU dry run needs the interpreter; set before triton is imported
    os.environ.setdefault("TRITON_INTERPRET", "1")

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root, for `optwin`
sys.path.insert(1, str(Path(__file__).resolve().parent))  # bench/, for _bench_common

import torch
from _bench_common import watchdog, write_report
from torch import nn

import optwin.kernels

DTYPES = (torch.bfloat16, torch.float16, torch.float32)
ATOL_REL = 1e-5  # of max |reference output|: float32's ulp-level room, nothing next to a half dtype's noise
ALL = {"rmsnorm": True, "rope": True, "softmax": True}  # op -> launched (True) or left to the model (False)
# (name, config class, model class, config overrides (hidden, heads, head_dim) -> dict, expected calls)
HF_MODELS: tuple[tuple[str, str, str, Callable[[int, int, int], dict], dict[str, bool]], ...] = (
    ("Llama", "LlamaConfig", "LlamaForCausalLM", lambda h, n, d: {}, ALL),
    ("Qwen2", "Qwen2Config", "Qwen2ForCausalLM", lambda h, n, d: {}, ALL),
    ("Gemma", "GemmaConfig", "GemmaForCausalLM", lambda h, n, d: {}, {**ALL, "rmsnorm": False}),
    # a tight cap like the tests' (Gemma2 ships 50), so a softmax swapped in by mistake would show in the logits
    ("Gemma2", "Gemma2Config", "Gemma2ForCausalLM",
     lambda h, n, d: {"attn_logit_softcapping": 5.0, "query_pre_attn_scalar": d}, {**ALL, "rmsnorm": False, "softmax": False}),
    ("Phi", "PhiConfig", "PhiForCausalLM", lambda h, n, d: {"partial_rotary_factor": 0.5, "num_key_value_heads": n},
     {"layernorm": True, "rope": True, "softmax": True}),
)


def perturb_norms(model: nn.Module) -> None:
    """Norm weights away from their init (ones, or Gemma's zeros), biases off zero: a dropped weight or bias, or
    x * w computed for Gemma's x * (1 + w), changes the outputs."""
    with torch.no_grad():
        for m in model.modules():
            if not type(m).__name__.endswith("Norm") or getattr(m, "weight", None) is None:
                continue
            m.weight.uniform_(-0.5, 0.5) if "Gemma" in type(m).__name__ else m.weight.uniform_(0.5, 1.5)
            if getattr(m, "bias", None) is not None:
                m.bias.uniform_(-0.5, 0.5)


def sizes(smoke: bool) -> tuple[int, ...]:
    """(hidden, layers, heads, head_dim, vocab, batch, seq): the tests' tiny model on the CPU, a moderate one on CUDA."""
    return (64, 2, 4, 16, 97, 2, 9) if smoke else (1024, 4, 16, 64, 32000, 2, 512)


def build_hf(transformers: Any, spec: tuple, smoke: bool, device: str) -> tuple[nn.Module, Callable]:
    """The float32 model on `device`, and its input for a dtype."""
    _, cfg_cls, model_cls, extra, _ = spec
    h, layers, n, d, vocab, batch, seq = sizes(smoke)
    kw = {"vocab_size": vocab, "hidden_size": h, "intermediate_size": 2 * h if smoke else 2816,
          "num_hidden_layers": layers, "num_attention_heads": n, "num_key_value_heads": n // 2 if smoke else n // 4,
          "head_dim": d, "max_position_embeddings": max(64, seq), "attn_implementation": "eager"}
    cfg = getattr(transformers, cfg_cls)(**{**kw, **extra(h, n, d)})
    torch.manual_seed(0)
    with torch.device(device):  # initialised on the GPU: the CPU init of a 32k vocabulary is seconds per model
        model = getattr(transformers, model_cls)(cfg).eval()
    assert model.config._attn_implementation == "eager"  # the softmax swap only reaches eager attention
    ids = torch.randint(0, vocab, (batch, seq), generator=torch.Generator().manual_seed(1)).to(device)
    return model, lambda dtype: ids


def build_sequential(smoke: bool, device: str) -> tuple[nn.Module, Callable]:
    """Torch norms only: biased and bias-free LayerNorm, RMSNorm with eps=None (the input dtype's) and a set one."""
    h, *_, batch, seq = sizes(smoke)
    torch.manual_seed(0)
    with torch.device(device):
        model = nn.Sequential(nn.Linear(h, h), nn.LayerNorm(h), nn.GELU(), nn.Linear(h, h), nn.RMSNorm(h),
                              nn.Linear(h, h), nn.LayerNorm(h, bias=False), nn.Linear(h, h), nn.RMSNorm(h, eps=1e-5))
    x = torch.randn(batch, seq, h, generator=torch.Generator().manual_seed(1)).to(device)
    return model.eval(), lambda dtype: x.to(dtype)


def output(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    out = model(x)
    return out.logits if hasattr(out, "logits") else out


def grads(model: nn.Module, x: torch.Tensor) -> list[torch.Tensor | None]:
    """Parameter gradients of a scalar loss, grad enabled (the patch must fall back to the model's code). A sum over
    the vocabulary, mean over tokens: a mean over every logit gives float16 gradients that underflow to 0."""
    model.zero_grad(set_to_none=True)
    with torch.enable_grad():
        y = output(model, x).float()
        (y.square().sum() / y.shape[:-1].numel()).backward()
    return [None if p.grad is None else p.grad.clone() for p in model.parameters()]


def grad_diff(a: list, b: list) -> float:
    if [g is None for g in a] != [g is None for g in b]:
        return float("inf")  # a parameter got a gradient in one run only
    return max((float((x.float() - y.float()).abs().max()) for x, y in zip(a, b) if x is not None), default=0.0)


def check(base: nn.Module, inp: Callable, expect: dict[str, bool]) -> list[tuple[list[str], bool]]:
    """One row per dtype: (cells after model | dtype, all ok)."""
    with torch.no_grad():  # one precision up, once per model: float32 for the half dtypes, float64 for float32
        ref = {torch.float32: output(base, inp(torch.float32)).double(),
               torch.float64: output(copy.deepcopy(base).double(), inp(torch.float64))}
    rows = []
    for dtype in DTYPES:
        try:
            rows.append(check_dtype(base, inp(dtype), dtype, ref[torch.float64 if dtype == torch.float32 else torch.float32],
                                    expect))
        except Exception as e:  # noqa: BLE001  a failing model is a FAIL row, the others still run
            rows.append(([str(dtype).removeprefix("torch."), f"FAIL: {type(e).__name__}: {str(e)[:160]}", "", "",
                          "", "", ""], False))
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    return rows


def check_dtype(base: nn.Module, x: torch.Tensor, dtype: torch.dtype, ref: torch.Tensor,
                expect: dict[str, bool]) -> tuple[list[str], bool]:
    model = copy.deepcopy(base).to(dtype)
    with torch.no_grad():
        plain = output(model, x)
        handle = optwin.kernels.patch(model)
        try:
            got = output(model, x)
            calls = Counter(handle.calls)
            g_patched = grads(model, x)  # patch still on, grad enabled
            calls_in_grad = sum((handle.calls - calls).values())  # launches during the grad pass: must be 0
        finally:
            handle.undo()
        again = output(model, x)
    g_plain = grads(model, x)
    # 1. patched vs unpatched, against the dtype's own distance from the higher-precision model
    diff = float((got.double() - plain.double()).abs().max())
    noise = float((plain.double() - ref).abs().max())
    own = float((got.double() - ref).abs().max())  # the patched model's own distance: no further than plain's
    atol = ATOL_REL * max(1.0, float(ref.abs().max()))
    # NaN fails. Or: the patched model no further from the reference than 1.5 x the model's own distance (a
    # small model's bf16 noise is an ulp or two of a logit, which two runs of different roundings can both take)
    ok_out = diff <= 2 * noise + atol or own <= 1.5 * noise + atol
    # 2. kernel calls per op
    wrong = [op for op, on in expect.items() if (calls[op] > 0) != on]
    calls_cell = ", ".join(f"{op} {calls[op]}" for op in sorted(set(expect) | set(calls)))
    calls_cell = ("ok: " if not wrong else f"FAIL ({', '.join(wrong)}): ") + calls_cell
    # 3. undo: the model's own outputs bit for bit, and no instance forward left behind
    ok_undo = torch.equal(again, plain) and not any("forward" in m.__dict__ for m in model.modules())
    # 4. gradients: the same code ran, so exact; else within a second unpatched run's difference
    gd = grad_diff(g_patched, g_plain)
    gmax = max((float(g.abs().max()) for g in g_plain if g is not None), default=0.0)  # 0: nothing was checked
    if gd == 0:
        ok_grad, grad_cell = True, "exact"
    else:
        rerun = grad_diff(grads(model, x), g_plain)
        ok_grad, grad_cell = gd <= rerun, f"{gd:.1e} (rerun {rerun:.1e})"
    ok_grad = ok_grad and calls_in_grad == 0 and 0 < gmax < float("inf")
    grad_cell = f"{'ok' if ok_grad else 'FAIL'}: {grad_cell} (max abs {gmax:.1e}), {calls_in_grad} kernel calls"
    up = "fp64" if dtype == torch.float32 else "fp32"
    cells = [str(dtype).removeprefix("torch."), f"{diff:.2e}", f"{noise:.2e} (patched {own:.2e}; vs {up})",
             "ok" if ok_out else f"FAIL (> 2 x noise + {atol:.0e}, patched > 1.5 x)", calls_cell, "ok" if ok_undo else "FAIL", grad_cell]
    return cells, ok_out and not wrong and ok_undo and ok_grad


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true", help="tiny models on the CPU (TRITON_INTERPRET=1)")
    args = ap.parse_args()
    t0 = time.monotonic()
    device = "cpu" if args.smoke else "cuda"
    if not args.smoke:
        assert torch.cuda.is_available(), "needs CUDA (or --smoke)"
        watchdog(300.0)  # a hung kernel ends the run with tracebacks, not the device call's whole limit
    import triton

    try:
        import transformers
        versions, skipped = f"transformers {transformers.__version__}", []
    except Exception as e:  # noqa: BLE001  absent, or broken against this torch: the torch-only model still runs
        transformers, versions, skipped = None, "transformers not importable", [f"all transformers models ({e})"]
    models: list[tuple[str, Callable[[], tuple], dict[str, bool]]] = [
        ("Sequential(LayerNorm, RMSNorm)", lambda: build_sequential(args.smoke, device),
         {"layernorm": True, "rmsnorm": True})]
    for spec in HF_MODELS if transformers is not None else ():
        if not hasattr(transformers, spec[2]):  # an older transformers without this family
            skipped.append(f"{spec[0]} ({spec[2]} not in transformers {transformers.__version__})")
            continue
        models.append((spec[0], lambda spec=spec: build_hf(transformers, spec, args.smoke, device), spec[4]))
    name = torch.cuda.get_device_name() if device == "cuda" else "CPU (interpreter)"
    lines, all_ok = [], True
    for label, build, expect in models:
        try:
            base, inp = build()
        except Exception as e:  # noqa: BLE001  e.g. a config this transformers rejects: a FAIL row, the rest run
            lines.append(f"| {label} | - | FAIL building: {type(e).__name__}: {str(e)[:160]} | | | | | |")
            all_ok = False
            continue
        perturb_norms(base)
        for cells, ok in check(base, inp, expect):
            lines.append(f"| {label} | " + " | ".join(cells) + " |")
            all_ok &= ok
        del base
    h, layers, n, d, vocab, batch, seq = sizes(args.smoke)
    head = [f"# optwin.kernels.patch on random-weight models; {name}", "",
            f"hidden {h}, {layers} layers, {n} heads of {d}, vocab {vocab}; batch x seq {batch} x {seq}; torch {torch.__version__}, triton {triton.__version__}, {versions}",
            "", "| model | dtype | patched vs unpatched | dtype noise | verdict | calls | undo | grads |",
            "|---|---|---:|---:|---|---|---|---|"]
    tail = ([""] + [f"Skipped: {s}" for s in skipped] if skipped else []) + [
        "", f"{'all ok' if all_ok else 'FAILED'}; wall {time.monotonic() - t0:.0f} s"]
    write_report("\n".join(head + lines + tail) + "\n", "patch_check.md")
    return 0 if all_ok else 1


if __name__ == "__main__":
    sys.exit(main())
