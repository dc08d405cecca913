"""bench/gpu_kernels.py end to end on CPU under TRITON_INTERPRET=1 with tiny shapes (no compile),
and bench/bench_kernels.py's no-GPU message.

    python -m pytest -q tests/test_kernels_bench.py
"""

from __future__ import annotations

import os
import subprocess
import sys

os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported

from _kernel_checks import BENCH, bench_script  # after TRITON_INTERPRET


def _load_bench():
    return bench_script("gpu_kernels")


def test_bench_checks_and_times_every_kernel_on_cpu():
    gk = _load_bench()
    md = gk.run("cpu", check_shapes=[(3, 781), (2, 256), (3, 4096)], time_shape=(4, 256), dtypes=("bfloat16",),
                check_dtypes=("float16", "float32"), compile_ok=False)
    rows = [line for line in md.splitlines() if line.startswith("| ") and not line.startswith("| op") and not line.startswith("| dtype")]
    checks = [r for r in rows if r.count("|") == 12]
    assert len(checks) == 4 * 3 * 2, md
    for r in checks:
        cells = [c.strip() for c in r.strip("|").split("|")]
        assert cells[3] == "0" and cells[4] == "ok" and cells[6] == "0", r  # all written, within tolerance
        assert float(cells[7].split()[0]) < 1e-4, r  # sketch agrees with optwin.ingest
        assert cells[8] == "yes" and float(cells[9]) < 1e-6, r  # y unchanged by the sketch; workspace reset
        # the deferred launch (softmax, layernorm) writes the same y and features as the finisher in the launch
        # (shapes of the persistent launch do not defer: its atomics' order, as a 2nd launch); layernorm's rows of
        # 4096 take the Welford launch, which defers: bit for bit
        if cells[0] == "layernorm" and cells[2] == "3x4096":
            assert cells[10] == "yes", r
        elif cells[0] in ("softmax", "layernorm"):
            assert cells[10].startswith(("yes", "not deferred: ")), r
        else:
            assert cells[10] == "n/a", r
    timing = [r for r in rows if r.count("|") == 19]
    assert {r.split("|")[1].strip() for r in timing} == {"rmsnorm", "softmax", "layernorm", "rope"}
    assert all(r.split("|")[14:17] == [" n/a ", " n/a ", " n/a "] for r in timing)  # graph replay: CUDA only
    for r in timing:  # the deferred launches timed beside the plain and in-launch ones; the others have none
        cells = [c.strip() for c in r.strip("|").split("|")]
        if cells[0] in ("softmax", "layernorm"):
            assert cells[17].endswith("%") and [float(v) > 0 for v in cells[16].split(" / ")] == [True] * 3, r
        else:
            assert cells[16:18] == ["-", "-"], r
    assert "raised" not in md, md


def test_check_finds_an_unwritten_element():
    gk = _load_bench()
    real = gk.OPS["softmax"].launch

    def lazy(inp, params, y, buf):  # a kernel that skips the last row
        real(inp, params, y, buf)
        y[-1] = float("nan")

    gk.OPS["softmax"].launch = lazy
    c = gk.check("softmax", (3, 40), "float32", "cpu")
    assert c["unwritten"] == 40 and c["vs_float64"].startswith("40/120 elements differ")


def test_bench_entry_without_gpu_says_so():
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    out = subprocess.run([sys.executable, str(BENCH / "bench_kernels.py")], capture_output=True, text=True,
                         env=env, check=True)
    assert "needs a CUDA GPU" in out.stdout


def test_sweep_times_every_config_and_keeps_y_identical():
    gk = _load_bench()
    rows = gk.sweep((4, 256), "cpu", __import__("time").monotonic(), 600.0, 1.0)
    body = rows[2:]
    assert len(body) == sum(len(c) for c in gk.SWEEP.values()), rows
    for r in body:
        cells = [c.strip() for c in r.strip("|").split("|")]
        assert cells[6] == "yes" and float(cells[2]) > 0, r  # timed, and the sketch leaves y unchanged


def test_kernel_timings_are_interleaved_rounds_and_their_medians(monkeypatch):
    import dataclasses
    import itertools

    gk = _load_bench()
    launched = []
    real = gk.OPS["rmsnorm"].launch

    def recording(inp, params, y, buf):
        launched.append(buf is not None)
        real(inp, params, y, buf)

    monkeypatch.setitem(gk.OPS, "rmsnorm", dataclasses.replace(gk.OPS["rmsnorm"], launch=recording))
    # rounds: (plain, sketched) = (5, 1), (9, 2), (6, 30): medians 6 and 2; every later timing 1 ms
    ms = itertools.chain([5.0, 1.0, 9.0, 2.0, 6.0, 30.0], itertools.repeat(1.0))
    monkeypatch.setattr(gk, "_timer", lambda device, mode="median": lambda fn: (fn(), next(ms))[1])
    monkeypatch.setattr(gk, "KERNEL_ROUNDS", 3)
    r = gk.time_op("rmsnorm", (4, 256), "bfloat16", "cpu", 1.0, compile_ok=False)
    assert launched[:6] == [False, True] * 3  # without, with, without, ...: a slow spell hits both
    assert r["kernel_ms"] == 6.0 and r["kernel_sketch_ms"] == 2.0
    assert abs(r["sketch_overhead"] - (2.0 / 6.0 - 1)) < 1e-12


def test_softmax_long_check_runs_every_mask_and_dtype_on_cpu():
    """bench/softmax_long_check.py's smoke run: rows past 65536 through the official check, each ok."""
    env = dict(os.environ, TRITON_INTERPRET="1", OUT="")
    out = subprocess.run([sys.executable, str(BENCH / "softmax_long_check.py"), "--smoke"], capture_output=True,
                         text=True, env=env, check=True).stdout
    rows = [line for line in out.splitlines() if line.startswith("| softmax")]
    assert len(rows) == 3 * 3, out  # plain, -inf-masked and HF-masked scores; 3 dtypes
    for r in rows:
        cells = [c.strip() for c in r.strip("|").split("|")]
        assert cells[2] == "2x70001" and cells[3] == "0" and cells[4] == "ok" and cells[6] == "0", r
        assert float(cells[7].split()[0]) < 1e-6 and cells[8] == "yes", r  # sketch as ingest's; y as without it



def test_finisher_timeline_runs_the_row_launch_with_its_stamps_on_cpu():
    """bench/finisher_timeline.py's smoke run: the launch without the sketch and the sketched row launch (softmax's
    forced: 64x512 rows are persistent by default; layernorm's Welford launch) run with PROBE 131072's stamps and
    get a table row each (the interpreter's stamps read 0, so no finisher columns)."""
    env = dict(os.environ, TRITON_INTERPRET="1", OUT="", BENCH_CONFIGS='[{"rows": true}]')
    out = subprocess.run([sys.executable, str(BENCH / "finisher_timeline.py"), "--smoke"], capture_output=True,
                         text=True, env=env, check=True).stdout
    rows = [line for line in out.splitlines() if line.startswith(("| plain", "| sketch"))]
    assert [r.split("|")[2].strip() for r in rows] == ["-", "rows=True"], out
    env.update(BENCH_OP="layernorm", BENCH_SHAPE="8x4096", BENCH_CONFIGS="[{}]")  # the Welford launch: 4 pieces of 1024
    out = subprocess.run([sys.executable, str(BENCH / "finisher_timeline.py"), "--smoke"], capture_output=True,
                         text=True, env=env, check=True).stdout
    assert "# layernorm row launch timeline" in out
    assert [line.split("|")[2].strip() for line in out.splitlines() if line.startswith(("| plain", "| sketch"))] == \
        ["-", "default"], out


def test_deferred_finish_checks_agree_on_cpu():
    """bench/deferred_finish.py's smoke run: its checks (deferred features bit for bit the in-launch finisher's,
    on plain, HF-masked and NaN / inf rows and over calls read after their pages settled; pages at rest) all
    read ok; it times nothing there."""
    env = dict(os.environ, TRITON_INTERPRET="1", OUT="")
    out = subprocess.run([sys.executable, str(BENCH / "deferred_finish.py"), "--smoke"], capture_output=True,
                         text=True, env=env)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    rows = [line for line in out.stdout.splitlines() if line.startswith("| ") and "---" not in line][1:]
    assert len(rows) == 5 and all(r.rstrip(" |").endswith("ok") for r in rows), out.stdout


def test_ln_deferred_checks_agree_on_cpu():
    """bench/ln_deferred.py's smoke run: the deferred layernorm launch, shipped and with a register cap, bit for
    bit the in-launch finisher's; every page at rest after; it times nothing there."""
    env = dict(os.environ, TRITON_INTERPRET="1", OUT="", BENCH_CONFIGS='[{"maxnreg": 32}]')
    out = subprocess.run([sys.executable, str(BENCH / "ln_deferred.py"), "--smoke"], capture_output=True, text=True,
                         env=env)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    checks = [line.rstrip(" |").rsplit("| ", 1)[1] for line in out.stdout.splitlines() if line.startswith("| 8x4096 | deferred")]
    assert checks == ["ok", "ok"], out.stdout
    assert "off rest after settle_all: none" in out.stdout


def test_attention_probe_variants_match_float64_on_cpu():
    """bench/attention_probe.py's smoke run: every probe variant (pointer and TMA-descriptor loads, the
    warp-specialized loop, FMA scaling, software pipelining) against float64, ragged and causal."""
    env = dict(os.environ, TRITON_INTERPRET="1", OUT="")
    out = subprocess.run([sys.executable, str(BENCH / "attention_probe.py"), "--smoke"], capture_output=True,
                         text=True, env=env)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    rows = [line for line in out.stdout.splitlines() if "desc=" in line]
    assert len(rows) >= 2 * 10 and all("BAD" not in r for r in rows), out.stdout


def test_gpu_attention_smoke_run_checks_and_times_side_by_side():
    """bench/gpu_attention.py --smoke (CPU, interpreter): every correctness case ok, and sdpa timed in the
    same interleaved rounds as the kernel without and with the sketch."""
    env = dict(os.environ, TRITON_INTERPRET="1", OUT="")
    out = subprocess.run([sys.executable, str(BENCH / "gpu_attention.py"), "--smoke"], capture_output=True, text=True,
                         env=env)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "correctness: all ok" in out.stdout
    assert sum(line.startswith("interleaved (") for line in out.stdout.splitlines()) == 2, out.stdout



def test_gpu_attention_times_extra_launches_in_the_same_rounds():
    """BENCH_LAUNCHES adds launches (any keyword arguments of attention) to the interleaved rounds; each is
    reported against our launch without the sketch; --quick-timing stops after the rounds."""
    env = dict(os.environ, TRITON_INTERPRET="1", OUT="",
               BENCH_LAUNCHES='{"stride2": {"_entropy_stride": 2}, "plain s2": {"sketch": false, "config": [128, 64, 8, 2]}}')
    out = subprocess.run([sys.executable, str(BENCH / "gpu_attention.py"), "--smoke", "--quick-timing"],
                         capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    lines = out.stdout.splitlines()
    assert sum(ln.startswith("  stride2: ") for ln in lines) == 2 and sum(ln.startswith("  plain s2: ") for ln in lines) == 2
    assert all("against our launch without the sketch" in ln for ln in lines if ln.startswith("  stride2: "))
    assert not any(ln.startswith("| 0 | 128 |") for ln in lines)  # no sweep table after the rounds


def test_rope_check_passes_the_kernel_and_catches_a_wrong_rotation():
    """bench/rope_check.py's checks on the CPU (interpreter, small shapes, a NaN): the kernel passes; a
    kernel whose y is off by two output ulps fails."""
    import torch

    rc = bench_script("rope_check")
    g = torch.Generator().manual_seed(0)
    for dtype in (torch.bfloat16, torch.float32):
        ok, line = rc.check((9, 3, 16), dtype, g, device="cpu", nan_at=(4, 1, 2))
        assert ok, line
    real = rc.rope

    def off(x, pos, base, sketch=True):  # two ulps of the largest |y| too much everywhere
        y, buf = real(x, pos, base, sketch)
        return y + 2 * torch.finfo(x.dtype).eps * y.abs().max(), buf

    rc.rope = off
    ok, line = rc.check((9, 3, 16), torch.bfloat16, g, device="cpu")
    assert not ok and line.endswith("FAIL |"), line


def test_rope_check_without_gpu_says_so():
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    out = subprocess.run([sys.executable, str(BENCH / "rope_check.py")], capture_output=True, text=True,
                         env=env, check=True)
    assert "needs a CUDA GPU" in out.stdout


def test_leftover_state_counts_what_launches_left_set_and_resets_it():
    """sketch_buffer's check that bench/norm_chunks.py runs between its entries: a record word off the
    sentinel and a workspace slot off its identity are counted (a probe that skips the finisher's reads
    leaves them so, and every later finisher would take the stale words), and the reset puts both back."""
    import torch

    from optwin.kernels.sketch_buffer import (
        SENTINEL,
        leftover_state,
        reset_state,
        row_records,
        workspace,
    )

    words, _ = row_records("rmsnorm", torch.device("cpu"), 8)
    f, i = workspace("softmax", torch.device("cpu"))
    reset_state()
    left, n_words, slots, n_slots = leftover_state()
    assert (left, slots) == (0, 0) and n_words >= 8 and n_slots >= f.numel() + i.numel()
    words[3] = 123
    f[1] = 5.0
    i[2] = 7
    assert leftover_state()[::2] == (1, 2)
    reset_state()
    assert leftover_state()[::2] == (0, 0) and int(words[3]) == SENTINEL


def test_gpu_patch_check_smoke_run_passes_every_model():
    """bench/gpu_patch_check.py --smoke (CPU, interpreter): every model and dtype ok (outputs, kernel calls per op,
    undo, gradients through the model's own code), and the report says so."""
    out = subprocess.run([sys.executable, str(BENCH / "gpu_patch_check.py"), "--smoke"], capture_output=True, text=True,
                         timeout=600, env={**os.environ, "TRITON_INTERPRET": "1", "OUT": ""})
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    rows = [line for line in out.stdout.splitlines() if line.startswith("| ") and "| dtype |" not in line]
    assert len(rows) >= 6 and all("FAIL" not in r for r in rows), out.stdout[-2000:]
    assert "Gemma2" in out.stdout and "all ok" in out.stdout
