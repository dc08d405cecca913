"""bench/ncu_kernels.py: its launch list on the CPU (interpreter), and its three readers of Nsight
Compute logs on excerpts of the H200 run of stop 15 (tests/data/ncu: torch.compile's rmsnorm and
our softmax without and with the sketch; the source page holds the first 60 SASS lines of two kernels).

    python -m pytest -q tests/test_ncu_summaries.py
"""

from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path

from _kernel_checks import BENCH, bench_script

ART = Path(__file__).parent / "data" / "ncu"


def test_details_summary_has_one_row_per_launch_with_its_registers():
    md = bench_script("ncu_kernels").summary(str(ART / "details.csv"))
    rows = md.splitlines()[2:]
    assert [r.split("|")[1].strip() for r in rows] == ["0", "7", "8"]
    regs = {r.split("|")[1].strip(): r.split("|")[7].strip() for r in rows}
    assert regs == {"0": "29 register/thread", "7": "63 register/thread", "8": "64 register/thread"}
    assert "_softmax_kernel" in rows[2] and "triton_red_fused" in rows[0]
    assert rows[0].split("|")[3:5] == [" (512, 1, 1) ", " (4096, 1, 1) "]  # compile: 16 warps, a program per row


def test_stalls_lists_the_largest_reason_first_and_sums_them():
    md = bench_script("ncu_kernels").stalls(str(ART / "stalls.csv"))
    rows = md.splitlines()[2:]
    assert len(rows) == 3
    assert "long_scoreboard 22.66" in rows[0].split("total")[1].split(",")[0]  # compile's rmsnorm: memory latency
    with open(ART / "stalls.csv", newline="") as f:
        recs = list(csv.reader(f))
    head, first = recs[0], recs[2]
    want = sum(float(v.replace(",", "")) for k, v in zip(head, first)
               if k.startswith("smsp__average_warps_issue_stalled_") and v)
    assert f"total {want:.1f}:" in rows[0]


def test_sass_counts_executed_instructions_per_element_by_opcode():
    md = bench_script("ncu_kernels").sass(str(ART / "source.csv"), 4096 * 16384)
    rows = md.splitlines()[2:]
    assert len(rows) == 2 and all("_softmax_kernel" in r for r in rows)
    # the first kernel's count, summed here independently of the reader
    lines = [ln for ln in (ART / "source.csv").read_text().splitlines() if ln.startswith('"')]
    sections = [i for i, ln in enumerate(lines) if ln.startswith('"Kernel Name"')]
    recs = list(csv.reader(lines[sections[0] + 1:sections[1]]))
    col = recs[0].index("Instructions Executed")
    want = sum(float(r[col].replace(",", "") or 0) for r in recs[1:]) * 32 / (4096 * 16384)
    assert float(rows[0].split("|")[3]) == round(want, 1)
    assert "LDC" in rows[0]  # the kernel's first SASS line is a constant load


def test_launch_list_without_gpu_runs_every_kernel_once_more_per_config():
    env = dict(os.environ, TRITON_INTERPRET="1", BENCH_OPS="rmsnorm,softmax",
               BENCH_CONFIGS='{"rmsnorm": [{"num_warps": 2}]}')
    out = subprocess.run([sys.executable, str(BENCH / "ncu_kernels.py"), "--smoke"], capture_output=True, text=True,
                         env=env, check=True, timeout=300)
    launches = [ln.split(": ", 1)[1] for ln in out.stdout.splitlines() if ln.startswith("launch ")]
    assert launches == ["rmsnorm ours", "rmsnorm ours +sketch", "rmsnorm ours {'num_warps': 2}",
                        "rmsnorm ours {'num_warps': 2} +sketch", "softmax ours", "softmax ours +sketch"]
    # BENCH_DTYPES: the same launches per dtype, each label naming its dtype
    env.update(BENCH_OPS="rmsnorm", BENCH_DTYPES="bfloat16,float16", BENCH_CONFIGS="{}")
    out = subprocess.run([sys.executable, str(BENCH / "ncu_kernels.py"), "--smoke"], capture_output=True, text=True,
                         env=env, check=True, timeout=300)
    launches = [ln.split(": ", 1)[1] for ln in out.stdout.splitlines() if ln.startswith("launch ")]
    assert launches == ["rmsnorm torch.bfloat16 ours", "rmsnorm torch.bfloat16 ours +sketch",
                        "rmsnorm torch.float16 ours", "rmsnorm torch.float16 ours +sketch"]


def test_attention_where_groups_instructions_by_how_often_they_ran():
    md = bench_script("ncu_attention").where(str(ART / "source.csv"), top=5)
    parts = md.split("## ")[1:]
    assert len(parts) == 2 and all("_softmax_kernel" in p for p in parts)
    for part in parts:
        groups = [ln for ln in part.splitlines() if ln.startswith("| ") and ln.endswith("% |") and "0x" not in ln]
        shares = [float(ln.split("|")[5].strip().rstrip("%")) for ln in groups]
        assert shares == sorted(shares, reverse=True) and 99.0 <= sum(shares) <= 100.1  # every group, largest first
        top = [ln for ln in part.splitlines() if "| 0x" in ln]
        assert len(top) == 5 and [ln.split("|")[1] for ln in top] == sorted(ln.split("|")[1] for ln in top)
