"""GPU check of optwin.kernels.rope at model-like head counts (32 and 8 heads of 128, 128 heads, ragged
position counts), against a float64 rotation of the same float32 angles: y within one output ulp of |x1 c| + |x2 s|
(four for float32: libdevice's cos/sin), the same
bits with and without the sketch, nothing left unwritten in a NaN-poisoned output, the sketch against
optwin.ingest's.

    python bench/rope_check.py      # on a CUDA machine; writes $OUT/rope_check.md when OUT is set

Needs torch and triton (and this repo). Exits 1 if a check fails.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root, for `optwin`

import torch

from optwin.ingest.sketch import sketch as ingest_sketch
from optwin.kernels.production import rope_inv_freq
from optwin.kernels.rope import _inv_freq, _rope_launch, rope
from optwin.kernels.sketch_buffer import read_sketch

# (seq, heads, d): Llama-8B q and k at 16k tokens, 128 heads, a ragged count of positions, a NaN row
SHAPES = ((16384, 32, 128), (65536, 8, 128), (4096, 128, 128), (777, 32, 128), (1001, 16, 64))
DTYPES = (torch.bfloat16, torch.float16, torch.float32)
BASE = 10000.0


def reference(x: torch.Tensor, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(float64 rotation by the kernel's float32 angles (float32 p * inv, cos/sin in float64), its scale
    |x1 c| + |x2 s|: the error bound's unit, since the two products can cancel)."""
    ang = (pos.to(torch.float32)[:, None] * rope_inv_freq(x.shape[-1], BASE, x.device)[None, :]).double()
    c, s = ang.cos()[:, None, :], ang.sin()[:, None, :]
    h = x.double()
    x1, x2 = h[..., : h.shape[-1] // 2], h[..., h.shape[-1] // 2:]
    y = torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], -1)
    scale = torch.cat([(x1 * c).abs() + (x2 * s).abs(), (x2 * c).abs() + (x1 * s).abs()], -1)
    return y, scale


def check(shape: tuple[int, int, int], dtype: torch.dtype, g: torch.Generator, device: str = "cuda",
          nan_at: tuple[int, int, int] | None = None) -> tuple[bool, str]:
    """(all checks passed, the report's row) for random x of `shape` (and a NaN at nan_at)."""
    seq, heads, d = shape
    x = torch.randn(shape, generator=g).to(dtype).to(device)
    if nan_at is not None:
        x[nan_at] = float("nan")
    pos = torch.randint(0, 32768, (seq,), generator=g).to(device)
    y, buf = rope(x, pos, BASE)
    y0, _ = rope(x, pos, BASE, sketch=False)
    poisoned = torch.full_like(x, float("nan"))
    _rope_launch(x.unsqueeze(0), poisoned.unsqueeze(0), None, positions=pos.unsqueeze(0),
                 inv=_inv_freq(d, BASE, x.device), base=BASE)
    ref, scale = reference(x, pos)
    finite = ref.isfinite()
    unwritten = int((poisoned.isnan() & finite).sum())
    ulp = torch.finfo(dtype).eps * scale.clamp(min=torch.finfo(dtype).tiny)
    err = float(((y.double() - ref).abs() / ulp)[finite].max())
    same = torch.equal(y.view(torch.int16 if x.element_size() == 2 else torch.int32),
                       y0.view(torch.int16 if x.element_size() == 2 else torch.int32))
    got = read_sketch("rope", buf, x.shape, {"base": BASE})
    want = ingest_sketch("rope", {"x": x, "positions": pos}, {"base": BASE})
    rel = max(abs(got[k] - want[k]) / max(abs(want[k]), 1e-30) for k in want if want[k] == want[k])
    ok = unwritten == 0 and err <= (4.0 if dtype == torch.float32 else 1.0) and same and rel < 1e-5
    return ok, (f"| {seq}x{heads}x{d} | {str(dtype).removeprefix('torch.')} | {unwritten} | {err:.2f} | "
                f"{'yes' if same else 'NO'} | {rel:.1e} | {'ok' if ok else 'FAIL'} |")


def main() -> None:
    if not torch.cuda.is_available():
        print("bench/rope_check.py needs a CUDA GPU (tests/test_kernels_bench.py runs its checks on the CPU)")
        return
    g = torch.Generator().manual_seed(31)
    lines = [f"# rope at model-like head counts on {torch.cuda.get_device_name()}", "",
             "| shape | dtype | unwritten | max error vs float64 (ulps of |x1 c| + |x2 s|) | y same w/o sketch | "
             "sketch rel. diff vs ingest | |", "|---|---|---:|---:|---|---:|---|"]
    all_ok = True
    for shape in SHAPES:
        for dtype in DTYPES:
            ok, line = check(shape, dtype, g, nan_at=(500, 3, 7) if shape[0] == 777 else None)
            all_ok &= ok
            lines.append(line)
            print(line, flush=True)
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "rope_check.md").write_text("\n".join(lines) + "\n")
    sys.exit(0 if all_ok else 1)


if __name__ == "__main__":
    main()
