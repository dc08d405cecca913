"""What torch.autocast makes of each catalog op on this device, against optwin.ingest.autocast_dtype's table
(capture and the monitor file a call under the dtype it names): the dtype each op's output comes out in under
autocast(float16) and autocast(bfloat16), for float32, float16 and bfloat16 inputs. The CUDA-only float32 list
(layer_norm, softmax without dtype=) can only be checked here.

    python bench/gpu_autocast_dtypes.py           # CUDA; prints and writes $OUT/autocast_dtypes.md
    python bench/gpu_autocast_dtypes.py --device cpu
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without install
sys.path.insert(1, str(Path(__file__).resolve().parent))  # bench/, for _bench_common

from _bench_common import dtype_name, write_report  # noqa: E402
from optwin.ingest.autocast_dtype import call_dtype  # noqa: E402

# catalog op -> the torch call a production variant makes, on (2, 8, 16, 64)-shaped x
CALLS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "matmul": lambda x: torch.matmul(x, x.transpose(-1, -2)),
    "matmul (F.linear)": lambda x: F.linear(x, x[0, 0]),
    "attention": lambda x: F.scaled_dot_product_attention(x, x, x, is_causal=True),
    "softmax": lambda x: F.softmax(x, dim=-1),
    "layernorm": lambda x: F.layer_norm(x, (x.shape[-1],)),
    "rmsnorm": lambda x: F.rms_norm(x, (x.shape[-1],)),
    "rope": lambda x: x * x.cos() + x.flip(-1) * x.sin(),
}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args(argv)
    name = torch.cuda.get_device_name() if args.device == "cuda" else args.device
    lines = [f"# autocast on {name} (torch {torch.__version__}): output dtype / the table's, per input dtype", "",
             "| autocast | op | float32 | float16 | bfloat16 |", "|---|---|---|---|---|"]
    wrong = 0
    for low in (torch.float16, torch.bfloat16):
        for label, call in CALLS.items():
            cells = []
            for dt in (torch.float32, torch.float16, torch.bfloat16):
                x = torch.randn(2, 8, 16, 64, device=args.device, dtype=dt)
                with torch.no_grad(), torch.autocast(args.device, dtype=low):
                    got = call(x).dtype
                    want = call_dtype(label.split(" ")[0], x)
                wrong += got != want
                cells.append(dtype_name(got) if got == want else f"**{dtype_name(got)} / table {dtype_name(want)}**")
            lines.append(f"| {dtype_name(low)} | {label} | " + " | ".join(cells) + " |")
    lines += ["", f"**{wrong} disagreements**"]
    write_report("\n".join(lines) + "\n", "autocast_dtypes.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
