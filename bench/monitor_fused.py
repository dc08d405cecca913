"""The in-process monitor on a Llama patched with our kernels, which hand it their fused sketch (issue #6),
against the same monitor sketching the inputs with torch ops on the model as it is.

    python bench/monitor_fused.py --db fp.duckdb            # CUDA; prints and writes $OUT/monitor_fused.md
    python bench/monitor_fused.py --db fp.duckdb --batch 2 --seq 1024 --report small.md   # a host-bound size
    TRITON_INTERPRET=1 python bench/monitor_fused.py --db fp.duckdb --smoke   # CPU dry run, tiny model

A random-weight Llama built from a config (transformers; eager attention, so the softmax is one of ours
once patched), bf16, one forward of batch x seq tokens. Timed side by side in interleaved rounds (CUDA
events around FORWARDS forwards; the median over rounds):
  as is | as is + monitor | patched | patched + monitor
(and the patched model through Triton's own launch call: optwin.kernels.fast_launch off),
with the monitor (policy "warn", a real fingerprint database) watching rmsnorm and rope, the ops both
forms have (the unpatched softmax runs inside HF's eager attention, recorded as attention), checking
every call (sampling "always"), then with the default sampling after its warm-up. The monitor's cost
is the column against the same model without it. Then one forward's fused sketches against
optwin.ingest's sketch of the same inputs (rmsnorm and softmax inputs kept by hooks), largest relative
difference per op.
"""

from __future__ import annotations

import argparse
import gc
import math
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root, for `optwin`
sys.path.insert(1, str(Path(__file__).resolve().parent))  # bench/, for _bench_common

import torch
from _bench_common import worst_diff, write_report

import optwin.kernels
import optwin.monitor as om
from optwin.ingest import sketch
from optwin.kernels import fast_launch

OPS = ("rmsnorm", "rope")  # watched in every monitored config
PROFILERS: list = []  # --profile: enabled around the timed forwards only (not the setup, warm-up or collection)
SAMPLING_WARMUP = 120  # forwards before the default-sampling timing: past its 100-call warm-up


def build_llama(smoke: bool, device: str, dtype: torch.dtype) -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    if smoke:
        cfg = LlamaConfig(vocab_size=97, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=64,
                          attn_implementation="eager")
    else:
        cfg = LlamaConfig(vocab_size=32000, hidden_size=2048, intermediate_size=5632, num_hidden_layers=4,
                          num_attention_heads=16, num_key_value_heads=16, max_position_embeddings=4096,
                          attn_implementation="eager")
    torch.manual_seed(0)
    return LlamaForCausalLM(cfg).to(device=device, dtype=dtype).eval()


def _timer(device: str) -> Callable[[Callable[[], Any], int], float]:
    """ms per call of fn over n calls: CUDA events on the GPU, perf_counter on the CPU; the garbage
    collector off while timed, as timeit has it (a host-bound forward read 4.4 to 8.3 ms across five
    rounds with it on: bench/results/monitor_fused_h200_s27_small_gc.md)."""
    def timed(fn: Callable[[], Any], n: int) -> float:
        gc.collect()
        gc.disable()
        for prof in PROFILERS:
            prof.enable()
        try:
            return _span(fn, n)
        finally:
            for prof in PROFILERS:
                prof.disable()
            gc.enable()

    def _span(fn: Callable[[], Any], n: int) -> float:
        if device != "cuda":
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            return (time.perf_counter() - t0) * 1e3 / n
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(n):
            fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / n
    return timed


def _configs(model: torch.nn.Module, db: str, ids: torch.Tensor,
             forwards: int) -> dict[str, Callable[[], tuple[float, int, int, int]]]:
    """Each config as a function that times `forwards` forwards, setting up and tearing down its patch
    and monitor outside the timed span: (ms per forward, and while timed: catalog calls the monitor
    saw, calls it checked, warnings)."""
    timed = _timer(ids.device.type)

    def fwd() -> None:
        model(ids)

    def run(patched: bool, sampling: str | None, ops: tuple[str, ...] = OPS, warmup: int = 1,
            direct: bool = True) -> Callable[[], tuple[float, int, int, int]]:
        def go() -> tuple[float, int, int, int]:
            with fast_launch.direct(direct and fast_launch._state["direct"]):
                return timed_config()

        def timed_config() -> tuple[float, int, int, int]:
            handle = optwin.kernels.patch(model) if patched else None
            mon = om.monitor(model, db=db, sampling=sampling, ops=ops) if sampling else None
            try:
                if mon is not None:
                    mon.start()
                for _ in range(warmup):
                    fwd()
                if mon is not None:
                    mon.flush()
                before = (mon.stats.calls, mon.stats.checked, mon.stats.warnings) if mon is not None else (0, 0, 0)
                ms = timed(fwd, forwards)
                if mon is None:
                    return ms, 0, 0, 0
                mon.flush()
                return ms, mon.stats.calls - before[0], mon.stats.checked - before[1], mon.stats.warnings - before[2]
            finally:
                if mon is not None:
                    mon.stop()
                if handle is not None:
                    handle.undo()
        return go

    return {
        "as is": run(False, None),
        "as is + monitor (torch sketches)": run(False, "always"),
        "patched": run(True, None),
        "patched + monitor (fused sketches)": run(True, "always"),
        "patched, Triton's launch call": run(True, None, direct=False),
        "patched + monitor (fused), Triton's launch call": run(True, "always", direct=False),
        "patched + monitor, softmax too": run(True, "always", (*OPS, "softmax")),
        "as is + monitor, default sampling": run(False, "default", warmup=SAMPLING_WARMUP),
        "patched + monitor, default sampling": run(True, "default", warmup=SAMPLING_WARMUP),
    }


def timings(model: torch.nn.Module, db: str, ids: torch.Tensor, rounds: int, forwards: int) -> list[str]:
    cfgs = _configs(model, db, ids, forwards)
    got: dict[str, list[float]] = {k: [] for k in cfgs}
    seen: dict[str, list[int]] = {k: [0, 0, 0] for k in cfgs}  # over every timed span: calls, checked, warnings
    with torch.no_grad():
        for _ in range(rounds):
            for name, go in cfgs.items():
                ms, *counts = go()
                got[name].append(ms)
                seen[name] = [a + b for a, b in zip(seen[name], counts)]
    base = {"as is": statistics.median(got["as is"]), "patched": statistics.median(got["patched"])}
    out = ["| config | ms per forward (median) | min | max | vs the same model without the monitor "
           "| calls checked / seen while timed | warnings while timed |",
           "|---|---:|---:|---:|---:|---:|---:|"]
    for name, v in got.items():
        med = statistics.median(v)
        ref = base["patched" if name.startswith("patched") else "as is"]
        calls, checked, warns = seen[name]
        cw = f"{checked} / {calls} | {warns}" if calls else " | "
        out.append(f"| {name} | {med:.3f} | {min(v):.3f} | {max(v):.3f} | {100 * (med / ref - 1):+.1f}% | {cw} |")
    return out


def check_fused(model: torch.nn.Module, db: str, ids: torch.Tensor) -> list[str]:
    """One monitored forward of the patched model: each fused sketch against optwin.ingest's on the
    same inputs (kept by hooks: the norms' inputs, and the softmax's through the patched call)."""
    from optwin.kernels import patching

    norm_in: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    soft_in: list[torch.Tensor] = []
    hooks = []
    for path, m in model.named_modules():
        if type(m).__name__.endswith("RMSNorm"):
            hooks.append(m.register_forward_pre_hook(
                lambda m, a, path=path: norm_in.__setitem__(path, (a[0].detach().clone(), m.weight.detach()))))
    real = patching.softmax

    def keep(x: torch.Tensor, **kw: Any) -> Any:
        soft_in.append(x.detach().clone())
        return real(x, **kw)

    patching.softmax = keep
    try:
        with torch.no_grad(), optwin.kernels.patch(model) as handle, \
                om.monitor(model, db=db, sampling="always", ops=(*OPS, "softmax")) as mon:
            model(ids)
    finally:
        patching.softmax = real
        for h in hooks:
            h.remove()
    dt = str(next(model.parameters()).dtype).removeprefix("torch.")
    rows = ["| op | stream | fused vs ingest (largest relative difference) |", "|---|---|---|"]
    for path, (x, w) in norm_in.items():
        got = mon.last_sketches[(f"{path}:rmsnorm", "rmsnorm", "triton", dt)]
        rows.append(f"| rmsnorm | {path} | {worst_diff(got, sketch('rmsnorm', {'x': x, 'weight': w.to(x.dtype)}))} |")
    soft_streams = [k for k in mon.last_sketches if k[1] == "softmax"]  # first assessed first: call order
    for key, x in zip(soft_streams, soft_in, strict=True):
        rows.append(f"| softmax | {key[0]} | {worst_diff(mon.last_sketches[key], sketch('softmax', {'x': x}))} |")
    seq = ids.shape[1]
    for key, got in sorted(mon.last_sketches.items()):
        if key[1] == "rope":
            ok = got["max_pos"] == seq - 1 and got["seq"] == ids.numel() and math.isfinite(got["rms"])
            rows.append(f"| rope | {key[0]} | max_pos {got['max_pos']:.0f}, seq {got['seq']:.0f}: {'ok' if ok else 'WRONG'} |")
    rows.append(f"\nfused launches: {dict(handle.sketched)} of {dict(handle.calls)}; monitor checked {mon.stats.checked}, "
                f"skipped {mon.stats.skipped}")
    return rows


def profile(model: torch.nn.Module, db: str, ids: torch.Tensor, config: str, forwards: int) -> list[str]:
    """Host time of one config's timed forwards under cProfile (functions by own time; its setup and
    warm-up run unprofiled): where a monitored forward spends the host's time."""
    import cProfile
    import io
    import pstats

    go = _configs(model, db, ids, forwards)[config]
    with torch.no_grad():
        go()  # compile, warm up
        prof = cProfile.Profile()
        PROFILERS.append(prof)
        try:
            ms = go()[0]
        finally:
            PROFILERS.remove(prof)
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(25)
    pstats.Stats(prof, stream=buf).sort_stats("cumulative").print_stats("optwin|capture|monitor", 30)
    return [f"## cProfile of `{config}` ({forwards} forwards, {ms:.2f} ms each)", "", "```", buf.getvalue(), "```"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--db", required=True, help="a fingerprint database (optwin build --quick makes one)")
    ap.add_argument("--smoke", action="store_true", help="tiny model on the CPU (TRITON_INTERPRET=1)")
    ap.add_argument("--rounds", type=int, default=int(os.environ.get("BENCH_ROUNDS", "5")))
    ap.add_argument("--forwards", type=int, default=20)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--report", default="monitor_fused.md", help="file name of the report under $OUT")
    ap.add_argument("--profile", metavar="CONFIG", help="instead: cProfile the host side of one config")
    ap.add_argument("--no-cache", action="store_true",
                    help="forward without the KV cache: transformers' cache set-up copies host tensors to the "
                         "device in every layer (torch.tensor), a wait for the GPU each time")
    args = ap.parse_args()
    t0 = time.monotonic()
    device = "cpu" if args.smoke else "cuda"
    dtype = torch.float32 if args.smoke else torch.bfloat16
    batch, seq = (1, 9) if args.smoke else (args.batch, args.seq)
    model = build_llama(args.smoke, device, dtype)
    model.config.use_cache = not args.no_cache
    ids = torch.randint(0, model.config.vocab_size, (batch, seq), generator=torch.Generator().manual_seed(1)).to(device)
    rounds, forwards = (1, 2) if args.smoke else (args.rounds, args.forwards)
    name = torch.cuda.get_device_name() if device == "cuda" else "CPU (interpreter)"
    lines = [f"# The monitor on a patched Llama (fused sketches) vs the model as is (torch sketches); {name}",
             "",
             f"Llama from a config: hidden {model.config.hidden_size}, {model.config.num_hidden_layers} layers, "
             f"{model.config.num_attention_heads} heads, eager attention, {str(dtype).removeprefix('torch.')}, "
             f"batch {batch} x seq {seq}; {rounds} interleaved rounds of {forwards} forwards; watched: "
             f"{', '.join(OPS)} (softmax where named); KV cache {'off' if args.no_cache else 'on'}", ""]
    if args.profile:
        write_report("\n".join(lines + profile(model, args.db, ids, args.profile, forwards)) + "\n", args.report)
        return
    lines += timings(model, args.db, ids, rounds, forwards)
    lines += ["", "Fused sketches of one forward against optwin.ingest on the same inputs:", ""]
    lines += check_fused(model, args.db, ids)
    lines.append(f"\ntorch {torch.__version__}; wall {time.monotonic() - t0:.0f} s")
    write_report("\n".join(lines) + "\n", args.report)


if __name__ == "__main__":
    main()
