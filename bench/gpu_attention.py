"""GPU check and benchmark of our Triton flash attention (optwin.kernels.attention) against float64
math, the twin's attention/triton and torch's scaled_dot_product_attention.

    python bench/gpu_attention.py            # on a CUDA machine; writes $OUT/attention.md when OUT is set
    python bench/gpu_attention.py --quick    # correctness only
    python bench/gpu_attention.py --sweep-lite   # time only the leading configs of the full sweep
    BENCH_BUDGET_S=120 python bench/gpu_attention.py   # skip timing configs after 120 s (default 230)
    TRITON_INTERPRET=1 python bench/gpu_attention.py --smoke   # CPU dry run of the script, tiny shapes
    BENCH_AB=base python bench/gpu_attention.py --quick-timing  # rounds only, with bench/.ab/optwin_base in them
    BENCH_LAUNCHES='{"ahead1": {"_kv_ahead": 1}, "bn128": {"config": [128, 128, 8, 3], "sketch": false}}' \
        python bench/gpu_attention.py     # more launches in the rounds (keyword arguments; sketch on by default)

Needs torch, triton and numpy only. Correctness: large and odd shapes, every dtype, causal and not;
the output buffer is poisoned with NaN first; ||y - ref|| / ||ref|| and max |y - ref| against float64
sdpa; the sketch against optwin.ingest.sketch (peaked_frac and max_score against an exact float64
pass over every row: ingest samples rows above 2^22 scores, so its max_score is then a lower bound,
checked as one); sketch on vs off must give bit-identical y.
Timing (triton.testing.do_bench, median): [4, 32, 4096, 128] bf16, causal and not; sdpa and the default
launch without and with the sketch in BENCH_ROUNDS interleaved rounds (default 5: the ratio to sdpa), a sweep of
(BLOCK_M, BLOCK_N, num_warps, num_stages) without the sketch, then the best and the default
config with it; TFLOP/s = 4*B*H*S*S*D (/2 causal) over time, against torch sdpa (flash backend).
"""

from __future__ import annotations

import importlib
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root, for `optwin`
sys.path.insert(2, str(Path(__file__).resolve().parent / ".ab"))  # frozen revisions (bench/ab_snapshot.py)

import torch
import torch.nn.functional as F

from optwin.ingest.sketch import _peaked_frac
from optwin.ingest.sketch import sketch as ingest_sketch
from optwin.kernels.attention import (
    LAST_COMPILED,
    attention,
    attention_flops,
    default_config,
)
from optwin.kernels.sketch_buffer import read_sketch

DT = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}
# ||y - ref|| / ||ref|| bounds: output rounding + p rounding (half types), fp32 arithmetic (float32)
REL = {"float16": 2e-3, "bfloat16": 1.6e-2, "float32": 2e-5}
T0 = time.time()
BUDGET_S = float(os.environ.get("BENCH_BUDGET_S", "230"))  # timing configs past this many seconds are skipped
ROUNDS = int(os.environ.get("BENCH_ROUNDS", "5"))  # interleaved rounds of sdpa and the default launch
LINES: list[str] = []
# frozen revisions timed beside the live kernel, off and on (python bench/ab_snapshot.py NAME makes them)
AB = {n: importlib.import_module(f"optwin_{n}.kernels.attention").attention
      for n in os.environ.get("BENCH_AB", "").split(",") if n}
LAUNCHES: dict[str, dict] = json.loads(os.environ.get("BENCH_LAUNCHES", "{}"))  # name: launch kwargs
SMOKE = "--smoke" in sys.argv
DEV = "cpu" if SMOKE else "cuda"


def say(line: str = "") -> None:
    print(line, flush=True)
    LINES.append(line)


def make(b: int, h: int, sq: int, sk: int, d: int, dtype: torch.dtype, seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator(device=DEV).manual_seed(seed)
    q = 2.0 * torch.randn(b, h, sq, d, device=DEV, generator=g)
    k = torch.randn(b, h, sk, d, device=DEV, generator=g)
    v = torch.randn(b, h, sk, d, device=DEV, generator=g)
    return {"q": q.to(dtype), "k": k.to(dtype), "v": v.to(dtype)}


def exact_rows(inp: dict[str, torch.Tensor], causal: bool) -> tuple[float, float]:
    """(peaked_frac, max_score) over EVERY query row in float64 (one head at a time), with
    optwin.ingest's definitions (max_score: largest finite unscaled q.k over rows without NaN/+inf)."""
    q, k = inp["q"], inp["k"]
    b, h, sq, d = q.shape
    sk = k.shape[2]
    peaked = eligible = 0.0
    top = -math.inf
    hide = torch.ones(sq, sk, dtype=torch.bool, device=q.device).triu(1) if causal else None
    for i in range(b):
        for j in range(h):
            s = q[i, j].double() @ k[i, j].double().T / math.sqrt(d)  # (sq, sk)
            if hide is not None:
                s = s.masked_fill(hide, -math.inf)
            fin = torch.isfinite(s)
            elig = (fin.any(-1) & (fin | (s == -math.inf)).all(-1)).sum().item()
            peaked += _peaked_frac(s).item() * max(elig, 1)
            eligible += elig
            ok_row = ~(torch.isnan(s) | (s == math.inf)).any(-1, keepdim=True)  # (sq, 1)
            top = max(top, torch.where(ok_row & fin, s, -math.inf).amax().item())
    return peaked / max(eligible, 1), (top if top > -math.inf else 0.0) * math.sqrt(max(d, 1))


def ref64(inp: dict[str, torch.Tensor], causal: bool) -> torch.Tensor:
    """float64 sdpa, one batch at a time (bounded memory)."""
    outs = [F.scaled_dot_product_attention(*(inp[n][i:i + 1].double() for n in "qkv"), is_causal=causal)
            for i in range(inp["q"].shape[0])]
    return torch.cat(outs)


def check(name: str, dtype: str, shape: tuple[int, ...], causal: bool, twin_check: bool = False) -> bool:
    if SMOKE:  # tiny versions of the same cases
        shape = (1, 2, min(shape[2], 70), min(shape[3], 50), shape[4])
    b, h, sq, sk, d = shape
    inp = make(b, h, sq, sk, d, DT[dtype], seed=sum(map(ord, repr((dtype, shape, causal)))))
    out = torch.full_like(inp["q"], float("nan"))
    y, buf = attention(inp["q"], inp["k"], inp["v"], causal, out=out)
    y0, _ = attention(inp["q"], inp["k"], inp["v"], causal, sketch=False)
    if DEV == "cuda":
        torch.cuda.synchronize()
    ref = ref64(inp, causal)
    unwritten = int(torch.isnan(out).sum())
    rel = float((y.double() - ref).norm() / ref.norm())
    mx = float((y.double() - ref).abs().max())
    same = torch.equal(y.view(torch.int16) if y.element_size() == 2 else y.view(torch.int32),
                       y0.view(torch.int16) if y0.element_size() == 2 else y0.view(torch.int32))
    got = read_sketch("attention", buf)
    want = ingest_sketch("attention", inp, {"causal": causal})
    sampled_max = want["max_score"]  # over ingest's rows: a lower bound when it samples them
    want["peaked_frac"], want["max_score"] = exact_rows(inp, causal)
    bound_ok = sampled_max <= want["max_score"] * (1 + 1e-12) + 1e-12
    worst = max((abs(got[n] - want[n]) / max(abs(want[n]), 1e-30), n) for n in want if n != "peaked_frac")
    pf_ok = abs(got["peaked_frac"] - want["peaked_frac"]) <= 2.0 / (b * h * sq)  # threshold straddlers
    twin_note = ""
    if twin_check:
        from optwin import twin
        from optwin.twin.numerics import ulps_between

        emu = twin.run("attention", "triton", dtype, {n: t.cpu() for n, t in inp.items()}, {"causal": causal}).emulated
        u = ulps_between(y.cpu().double(), emu, dtype)
        twin_note = f" | vs twin: max {float(u.max()):.0f} ulp, {float((u > 0).double().mean()):.3f} differ, " \
                    f"rel {float((y.cpu().double() - emu).norm() / emu.norm()):.2e}"
    ok = unwritten == 0 and rel < REL[dtype] and same and worst[0] < 1e-5 and pf_ok and bound_ok
    say(f"| {name} | {dtype} | {shape} | {int(causal)} | {rel:.2e} | {mx:.2e} | {unwritten} | {same} | "
        f"{worst[0]:.1e} ({worst[1]}) | {got['peaked_frac']:.4f} / {want['peaked_frac']:.4f} | "
        f"{'ok' if ok else 'FAIL'}{twin_note} |")
    return ok


def bench_ms(fn) -> float:
    if SMOKE:  # the interpreter: one timed call, the numbers mean nothing
        t = time.perf_counter()
        fn()
        return 1e3 * (time.perf_counter() - t)
    from triton.testing import do_bench

    return float(do_bench(fn, warmup=25, rep=100, return_mode="median"))


def timing(shape: tuple[int, int, int, int], quick_sweep: bool) -> None:
    b, h, s, d = shape
    inp = make(b, h, s, s, d, torch.bfloat16, seed=7)
    q, k, v = inp["q"], inp["k"], inp["v"]
    y = torch.empty_like(q)
    # the full sweep, or its leaders only (bench/results: the full table); the default (its causal one) first
    others = [(128, 64, 8, 3), (128, 64, 8, 4), (128, 64, 8, 2), (64, 64, 4, 3), (128, 128, 8, 3), (128, 128, 8, 2)]
    if quick_sweep:
        others = others[:1]
    elif "--sweep-lite" in sys.argv:
        others = [(128, 64, 8, 3), (128, 64, 8, 4), (128, 128, 8, 3)]
    say(f"\n## Timing [{b}, {h}, {s}, {d}] bf16 (median ms, TFLOP/s)\n")
    # sdpa and the default launch side by side: sdpa's time moved by 10 % between runs on one machine
    # (bench/results/attention_*_h200_s24*), so the ratio comes from the same rounds; sdpa's median there is
    # the sweep's reference too
    base = {}
    for causal in (False, True):
        fl = attention_flops(b, h, s, s, d, causal)
        fns = {"sdpa": lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal),
               "off": lambda: attention(q, k, v, causal, sketch=False, out=y),
               "on": lambda: attention(q, k, v, causal, sketch=True, out=y)}
        for name, kw in LAUNCHES.items():
            fns[name] = lambda kw=kw: attention(q, k, v, causal, out=y, **{"sketch": True, **kw})
        for name, fn_ab in AB.items():
            fns[f"{name} off"] = lambda fn_ab=fn_ab: fn_ab(q, k, v, causal, sketch=False, out=y)
            fns[f"{name} on"] = lambda fn_ab=fn_ab: fn_ab(q, k, v, causal, sketch=True, out=y)
        rounds = {n: [] for n in fns}
        for _ in range(1 if SMOKE else ROUNDS):
            for n, fn in fns.items():
                rounds[n].append(bench_ms(fn))
        med = {n: statistics.median(v) for n, v in rounds.items()}
        base[causal] = med["sdpa"]
        say(f"torch sdpa causal={int(causal)}: {med['sdpa']:.3f} ms, {fl / med['sdpa'] / 1e9:.1f} TFLOP/s")
        say(f"interleaved ({len(rounds['sdpa'])} rounds) causal={int(causal)}: sdpa {med['sdpa']:.3f} ms, ours "
            f"{med['off']:.3f} ms ({med['sdpa'] / med['off']:.2f}x sdpa's speed), with the sketch {med['on']:.3f} ms "
            f"({100 * (med['on'] / med['off'] - 1):+.1f}%)")
        for n in list(fns)[3:]:  # the frozen revisions' "on" against their "off", the rest against ours
            mine = n.endswith(" on") and n[:-3] + " off" in med
            ref = med[n[:-3] + " off"] if mine else med["off"]
            say(f"  {n}: {med[n]:.3f} ms ({100 * (med[n] / ref - 1):+.1f}% against {'its' if mine else 'our'} launch "
                f"without the sketch; {med['sdpa'] / med[n]:.2f}x sdpa's speed)")
    if "--quick-timing" in sys.argv:  # the interleaved rounds only
        return
    say("\n| causal | BLOCK_M | BLOCK_N | warps | stages | sketch | ms | TFLOP/s | vs sdpa (time ratio) | note |")
    say("|---|---|---|---|---|---|---|---|---|---|")
    for causal in (False, True):
        fl = attention_flops(b, h, s, s, d, causal)
        default = default_config(torch.bfloat16, d, causal)
        best = None
        for cfg in dict.fromkeys([default, *others]):
            if time.time() - T0 > BUDGET_S:
                say(f"| {int(causal)} | {cfg} | | | | | | | | skipped: time budget |")
                continue
            try:
                t = bench_ms(lambda: attention(q, k, v, causal, sketch=False, out=y, config=cfg))
            except Exception as e:  # noqa: BLE001 - a config that does not fit: report, go on
                say(f"| {int(causal)} | {cfg[0]} | {cfg[1]} | {cfg[2]} | {cfg[3]} | off | | | | {type(e).__name__}: {str(e)[:80]} |")
                continue
            note = "default (catalog numerics)" if cfg == default else ("BLOCK_N differs from the twin" if cfg[1] != default[1] else "")
            say(f"| {int(causal)} | {cfg[0]} | {cfg[1]} | {cfg[2]} | {cfg[3]} | off | {t:.3f} | {fl / t / 1e9:.1f} | "
                f"{t / base[causal]:.2f} | {note} |")
            if cfg[1] == default[1] and (best is None or t < best[1]):
                best = (cfg, t)
        for cfg in dict.fromkeys([default, best[0] if best else default]):
            t_off = bench_ms(lambda: attention(q, k, v, causal, sketch=False, out=y, config=cfg))
            t_on = bench_ms(lambda: attention(q, k, v, causal, sketch=True, out=y, config=cfg))
            say(f"| {int(causal)} | {cfg[0]} | {cfg[1]} | {cfg[2]} | {cfg[3]} | on | {t_on:.3f} | {fl / t_on / 1e9:.1f} | "
                f"{t_on / base[causal]:.2f} | sketch cost {100 * (t_on / t_off - 1):+.1f}% (off re-timed {t_off:.3f}) |")
        # where the sketch's cost sits (default config): entropy in the loop, key/value pass after it
        for parts, what in (((False, False), "q stats + record only"), ((True, False), "+ entropy"),
                            ((False, True), "+ k/v pass"), ((True, True), "full sketch")):
            t = bench_ms(lambda: attention(q, k, v, causal, sketch=True, out=y, _parts=parts))
            say(f"| {int(causal)} | {default[0]} | {default[1]} | {default[2]} | {default[3]} | {what} | {t:.3f} | "
                f"{fl / t / 1e9:.1f} | {t / base[causal]:.2f} | breakdown |")
        for sk in (False, True):
            attention(q, k, v, causal, sketch=sk, out=y)
            kern = LAST_COMPILED[0]
            say(f"registers/thread sketch={int(sk)} causal={int(causal)}: {getattr(kern, 'n_regs', '?')}, "
                f"spills {getattr(kern, 'n_spills', '?')}, shared {getattr(getattr(kern, 'metadata', None), 'shared', '?')}")
        # unfused alternative: the float64 ingest sketch of the same inputs
        t_ing = bench_ms(lambda: ingest_sketch("attention", inp, {"causal": causal}))
        say(f"| {int(causal)} | | | | | ingest (unfused, float64) | {t_ing:.3f} | | | separate sketch pass |")
        ya, _ = attention(q, k, v, causal, sketch=False)
        yb, _ = attention(q, k, v, causal, sketch=True)
        say(f"bit-identical y with/without sketch at this shape (causal={int(causal)}): "
            f"{torch.equal(ya.view(torch.int16), yb.view(torch.int16))}")


def main() -> int:
    quick = "--quick" in sys.argv
    name = torch.cuda.get_device_name() if DEV == "cuda" else "CPU (TRITON_INTERPRET smoke run)"
    say(f"# optwin attention/triton on {name} (torch {torch.__version__}, "
        f"triton {__import__('triton').__version__})\n")
    say("| case | dtype | (B, H, Sq, Sk, D) | causal | rel err vs f64 | max abs err | unwritten | y same w/o sketch | "
        "worst sketch rel diff | peaked_frac kernel / exact | result |")
    say("|---|---|---|---|---|---|---|---|---|---|---|")
    cases = [
        ("llm prefill", "bfloat16", (2, 8, 1000, 1000, 128), True, False),
        ("llm prefill", "bfloat16", (2, 8, 1000, 1000, 128), False, False),
        ("odd, sk > sq", "float16", (1, 16, 2047, 3001, 64), True, False),
        ("odd, sq > sk", "float16", (1, 4, 1531, 77, 64), True, False),
        ("d=16", "float16", (3, 5, 513, 513, 16), False, False),
        ("d=256", "bfloat16", (1, 4, 700, 700, 256), True, False),
        ("fp32 d=128", "float32", (1, 4, 600, 600, 128), True, False),
        ("fp32 d=256", "float32", (1, 2, 257, 300, 256), False, False),
        ("twin", "float16", (1, 2, 128, 200, 64), True, True),
        ("twin", "bfloat16", (1, 2, 128, 200, 64), False, True),
        ("twin", "float32", (1, 2, 128, 200, 64), True, True),
    ]
    ok = True
    for c in cases:
        try:
            ok &= check(*c)
        except Exception as e:  # noqa: BLE001 - report and go on
            ok = False
            say(f"| {c[0]} | {c[1]} | {c[2]} | {int(c[3])} | {type(e).__name__}: {str(e)[:150]} | | | | | | FAIL |")
    if not quick:
        timing((1, 2, 128, 64) if SMOKE else (4, 32, 4096, 128), quick_sweep=SMOKE)
    say(f"\ncorrectness: {'all ok' if ok else 'FAILURES'}; total {time.time() - T0:.0f} s")
    out = os.environ.get("OUT")
    if out:
        Path(out, "attention.md").write_text("\n".join(LINES) + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
