r"""Our flash attention launched once without and once with the sketch inside a profiler range, for Nsight
Compute's per-instruction counters: where in the kernel the warps stall (the key loop, y's store, the
sketch's tail), which the timing variants of bench/gpu_attention.py can only guess at.

    ncu --clock-control none --profile-from-start off --section SourceCounters --section WarpStateStats \
        --page source --print-source sass --csv --log-file $OUT/ncu_attn.csv python bench/ncu_attention.py
    BENCH_CAUSAL=1 ncu ...                                   # the causal launches ([4, 32, 4096, 128] bf16)
    python bench/ncu_attention.py --where ncu_attn.csv      # anywhere: stall samples by region and opcode
    TRITON_INTERPRET=1 python bench/ncu_attention.py --smoke   # CPU dry run of the launches

Instructions are grouped by how often they ran: the key loop's body once per key block and warp, a
program's tail once per program and warp ([4, 32, 4096, 128]: 4096 programs x 8 warps = 32768).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root, for `optwin`
sys.path.insert(1, str(Path(__file__).resolve().parent))  # bench/

from ncu_kernels import _num, source_sections  # noqa: E402


def where(path: str, top: int = 20) -> str:
    """Per launch: stall samples and executed warp instructions by how often an instruction ran (its
    execution count to 2 digits: the key loop's body runs once per key block and warp, a program's tail
    once per program and warp, the sampled entropy once per sampled block), and the `top` instructions
    by stall samples, in address order."""
    out = []
    for i, (name, rows) in enumerate(source_sections(path)):
        samples = [_num(r["Warp Stall Sampling (All Samples)"]) for r in rows]
        executed = [_num(r["Instructions Executed"]) for r in rows]
        total = sum(samples) or 1.0
        groups: dict[float, list[int]] = {}
        for k, e in enumerate(executed):
            groups.setdefault(float(f"{e:.2g}"), []).append(k)
        out.append(f"## {i}: {name[:90]}\n")
        out.append(f"stall samples {total:.0f}, warp instructions executed {sum(executed):.4g}\n")
        out.append("| runs per instruction | SASS | warp instructions | stall samples | share |\n|---:|---:|---:|---:|---:|")
        for e, idx in sorted(groups.items(), key=lambda kv: -sum(samples[k] for k in kv[1]))[:8]:
            s = sum(samples[k] for k in idx)
            out.append(f"| {e:.3g} | {len(idx)} | {sum(executed[k] for k in idx):.3g} | {s:.0f} | {100 * s / total:.1f}% |")
        out.append("\n| address | opcode | stall share | executed |\n|---|---|---:|---:|")
        for k in sorted(sorted(range(len(rows)), key=lambda k: -samples[k])[:top]):
            out.append(f"| {rows[k]['Address']} | {rows[k]['Source'][:60]} | {100 * samples[k] / total:.2f}% | "
                       f"{executed[k]:.3g} |")
        out.append("")
    return "\n".join(out)


def main() -> None:
    import torch

    from optwin.kernels.attention import attention

    smoke = "--smoke" in sys.argv
    dev = "cpu" if smoke else "cuda"
    b, h, s, d = (1, 2, 130, 64) if smoke else (4, 32, 4096, 128)
    causal = os.environ.get("BENCH_CAUSAL") == "1"
    g = torch.Generator(device=dev).manual_seed(7)
    q, k, v = (torch.randn(b, h, s, d, device=dev, generator=g).to(torch.bfloat16) for _ in range(3))
    y = torch.empty_like(q)
    launches = [("off", lambda: attention(q, k, v, causal, sketch=False, out=y)),
                ("on", lambda: attention(q, k, v, causal, sketch=True, out=y))]
    for _, fn in launches:  # compile and warm up outside the range
        fn()
        fn()
    if dev == "cuda":
        torch.cuda.synchronize()
        torch.cuda.cudart().cudaProfilerStart()
    for label, fn in launches:
        print(f"launch: attention {label}, causal={int(causal)}, [{b}, {h}, {s}, {d}] bf16", flush=True)
        fn()
    if dev == "cuda":
        torch.cuda.synchronize()
        torch.cuda.cudart().cudaProfilerStop()


if __name__ == "__main__":
    if "--where" in sys.argv:
        print(where(sys.argv[sys.argv.index("--where") + 1]))
    else:
        main()
