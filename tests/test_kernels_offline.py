"""bench/offline_compile.py: our kernels compiled for sm_90a without a GPU, specialized as a launch is
(16-byte vector loads), with the launch's register cap. Runs the script in a subprocess: the test
session imports the kernels under TRITON_INTERPRET=1, the script must not.

    python -m pytest -q tests/test_kernels_offline.py
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "bench" / "offline_compile.py"


def _compile(*args: str) -> list[dict]:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, str(SCRIPT), *args, "--json"], capture_output=True, text=True, env=env, check=False,
                         timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    return [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]


def test_layernorm_compiles_with_its_register_cap_and_vector_loads():
    # 12000: a row held in registers (no Welford chunk divides it; 16384 goes to the Welford kernel)
    capped, = _compile("layernorm", "--shape", "4096x12000", "--sketch", "yes")
    uncapped, = _compile("layernorm", "--shape", "4096x12000", "--sketch", "yes", "--cfg", '{"maxnreg": 0}')
    assert capped["kernel"] == "_layernorm_kernel" and capped["num_warps"] == 8
    assert capped["maxnreg"] == 128 and capped["registers"] <= 128  # _common.REG_CAP at the tuned warps
    assert "maxnreg" not in uncapped and uncapped["registers"] > 128
    assert capped["vector_loads"] and uncapped["vector_loads"]  # aligned pointers: 16-byte loads
    assert capped["bar_sync_ptx"] > 0 and capped["sass_instructions"] > 100


def test_layernorm_welford_kernel_holds_no_row_in_registers():
    """The Welford launch keeps a piece, not the row: few registers a thread (several programs per SM),
    no spills, 16-byte loads, with and without the sketch."""
    plain, sketched = _compile("layernorm", "--shape", "4096x16384")
    assert plain["kernel"] == sketched["kernel"] == "_layernorm_welford_kernel" and plain["num_warps"] == 16
    assert plain["registers"] <= 40 and sketched["registers"] <= 48, (plain, sketched)
    assert plain["vector_loads"] and sketched["vector_loads"]
    assert sketched["sass_instructions"] > plain["sass_instructions"]
    # the piece loops are unrolled (the row length compiled in): the sketched kernel's loop is the finisher's
    assert plain["largest_loop_sass"] == 0 < sketched["largest_loop_sass"]
    assert sketched["spills_in_loops"] == 0


def test_every_norm_kernel_compiles_with_and_without_the_sketch():
    rows = _compile("rmsnorm", "softmax", "--shape", "64x1024")
    assert [(r["op"], r["sketch"]) for r in rows] == [("rmsnorm", False), ("rmsnorm", True),
                                                      ("softmax", False), ("softmax", True)]
    for r in rows:
        assert r["registers"] > 0 and r["vector_loads"], r
        assert r["largest_loop_sass"] > 0 and r["spills_in_loops"] == 0, r  # persistent: a row loop, no spills in it
    # the sketch adds work: more instructions than the same kernel without it, in the row loop too
    assert rows[1]["sass_instructions"] > rows[0]["sass_instructions"]
    assert rows[3]["largest_loop_sass"] > rows[2]["largest_loop_sass"]


def test_attention_sketch_fits_its_registers_without_spills():
    """The flash kernel holds one program per SM (128-160 KB of shared memory) and its sketched launch sits at
    the 255-register limit: at the production launches (128 x 64 blocks, 8 warps; causal at 4 stages) it
    must fit, with no spills at 3 stages and at most a few words at 4 (this machine's triton 3.9: 32 bytes;
    the H200's triton 3.6 compiled the 3-stage kernel to 254 registers without spills)."""
    for causal, stages, spill_limit in ((False, 3, 0), (True, 4, 64)):
        rows = _compile("attention", "--shape", "1x2x256x128", "--cfg", json.dumps({"causal": causal}))
        assert [r["sketch"] for r in rows] == [False, True]
        plain, sketched = rows
        assert plain["kernel"] == sketched["kernel"] == "_attention_kernel" and plain["num_warps"] == 8
        assert plain["num_stages"] == sketched["num_stages"] == stages
        assert plain["spill_stores"] == 0 and sketched["spill_stores"] <= spill_limit, (plain, sketched)
        for r in rows:
            assert r["registers"] <= 255 and r["vector_loads"], r
            assert r["shared"] <= 227 * 1024, r  # sm_90's opt-in shared memory a program
        assert sketched["sass_instructions"] > plain["sass_instructions"]


def test_rows_a_multiple_of_8_but_not_16_keep_vector_loads():
    """A row of 9000 16-bit elements is as 16-byte aligned as one of 9008 (100008 as 100000, the chunked
    kernels), but Triton specializes an integer only when 16 divides it. The launchers pass _common.column_multiple (8 here) and the kernels
    declare it (_common.aligned): vector loads, and the registers, spills and row-loop size of the
    9008-wide compile, where without it the plain softmax took 128 registers (63) and the sketched one
    spilled 816 bytes (stop 29, triton 3.6)."""
    # (rows, a length 16 does not divide, one it does): rows held in registers, then the chunked kernels
    for op, odd_shape, even_shape in [(op, f"{r}x{n}", f"{r}x{m}") for op in ("softmax", "rmsnorm", "layernorm")
                                      for r, n, m in ((1823, 9000, 9008), (64, 100008, 100000))]:
        odd = _compile(op, "--shape", odd_shape)
        even = _compile(op, "--shape", even_shape)
        assert [r["sketch"] for r in odd] == [False, True]
        for a, b in zip(odd, even):
            # (rmsnorm's 2-stage launch loads through async copies: no ld.global vectors at either width)
            assert a["kernel"] == b["kernel"] and a["vector_loads"] == b["vector_loads"], (a, b)
            assert a["vector_loads"] or a["op"] == "rmsnorm", a
            assert a["registers"] <= b["registers"] + 8 and a["spill_stores"] <= b["spill_stores"] + 16, (a, b)
            assert a["largest_loop_sass"] <= b["largest_loop_sass"] + 16, (a, b)


def test_softmax_rows_no_power_of_two_divides_read_whole_vectors():
    """An odd row length (softmax_window.windowed): the kernel reads and writes the row's whole 16-byte vectors and
    only its two edge vectors element by element, where before every element had its own load (stop 32,
    triton 3.6: the sketched kernel took 255 registers and spilled at 4096x8191). Registers, spills and the
    row loop stay near those of the even width beside it (16383 as 16384: the same BLOCK and warps); the row loop
    is the persistent launch's (rows=False: the launch a program per row has none, softmax.ROWS_BLOCKS), whose
    whole kernel is compared instead."""
    odd = _compile("softmax", "--shape", "4096x16383", "--cfg", '{"rows": false}')
    even = _compile("softmax", "--shape", "4096x16384", "--cfg", '{"rows": false}')
    for a, b in zip(odd, even):
        assert a["vector_loads"] and a["num_warps"] == b["num_warps"], (a, b)
        assert a["spill_stores"] == 0 and a["registers"] <= max(b["registers"], 128), (a, b)
        assert a["largest_loop_sass"] <= b["largest_loop_sass"] * 1.25, (a, b)
    (odd_rows,), (even_rows,) = (_compile("softmax", "--shape", s, "--sketch", "yes") for s in ("4096x16383", "4096x16384"))
    assert odd_rows["spill_stores"] == 0 and odd_rows["registers"] <= 128 and odd_rows["vector_loads"], odd_rows
    assert odd_rows["sass_instructions"] <= even_rows["sass_instructions"] * 1.25, (odd_rows, even_rows)


def test_softmax_sketch_keeps_its_programs_per_sm_at_4096_and_8192():
    """The sketched softmax at BLOCK 4096 (2 warps) and 8192 (4 warps) is capped at 128 registers (softmax.MAXNREG):
    uncapped it took 137 after stop 33, one program per SM fewer, and 16384x4096 bf16 ran 102 µs against 82."""
    for shape in ("16384x4096", "8192x8192"):
        k, = _compile("softmax", "--shape", shape, "--sketch", "yes")
        assert k["maxnreg"] == 128 and k["registers"] <= 128, k
        assert k["spills_in_loops"] == 0 and k["vector_loads"], k


def test_softmax_at_65536_keeps_its_registers_without_the_sketch():
    """BLOCK 65536 runs 16 warps, one program per SM (softmax.PLAIN_MAXNREG caps the launch without the sketch at 128):
    uncapped, ptxas gave float16 512x50256 32 registers and 2372 bytes of spills."""
    k, = _compile("softmax", "--shape", "512x50256", "--dtype", "float16", "--sketch", "no")
    assert k["num_warps"] == 16 and k["maxnreg"] == 128 and k["registers"] > 64, k
