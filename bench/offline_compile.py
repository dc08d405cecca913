"""Compile our Triton kernels for the H200 (sm_90a) on a machine without a GPU, and report what the
compiler made of them: registers, spills, barriers, SASS instructions.

    python bench/offline_compile.py rmsnorm layernorm                  # bf16 4096x16384, shipped launch
    python bench/offline_compile.py layernorm --cfg '{"num_warps": 8, "maxnreg": 128}' --dtype float16
    python bench/offline_compile.py attention --shape 4x32x4096x128 --cfg '{"causal": true}'  # B x H x S x D;
        # cfg: causal, config ([BLOCK_M, BLOCK_N, num_warps, num_stages]), parts ([entropy, key/value stats])

Each op's real launcher runs on CPU tensors of the shape (bench/gpu_kernels.py's `_sweep_launcher`)
with the kernel call intercepted, so the compiled kernel gets the launcher's own arguments, constexprs
and options. Arguments are specialized as Triton specializes them at launch: 16-byte aligned pointers
and integers divisible by 16 get the divisibility attribute, an integer equal to 1 becomes a
constant. Without the alignment the loads compile to one element per instruction, with registers and
spills that say nothing of the real kernel (stop 12's offline numbers were wrong that way).
The table also gives the largest loop's SASS instructions and the spill instructions inside loops
(loop_report: where stop 28 looked for a register cap's spills).

Registers and spills come from this machine's triton and the ptxas bundled with it (ptxas-blackwell
where present: it knows sm_90a), which need not be the device's: triton 3.9 here read rmsnorm's
sketch kernel at 173 registers, where the H200's triton 3.6 fit it in 128 (2 programs per SM, its
recorded occupancy). The device's occupancy table (note_occupancy, at the end of every GPU bench
report) is the fact; this is a look at register pressure before spending device time, and it says
nothing of time (bench/norm_chunks.py).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

os.environ.pop("TRITON_INTERPRET", None)  # compile for the GPU, not the interpreter

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root, for `optwin`
sys.path.insert(1, str(Path(__file__).resolve().parent))  # bench/

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from triton.runtime.jit import JITFunction

TYPES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32", torch.float64: "fp64",
         torch.int64: "i64", torch.int32: "i32"}
OPTIONS = ("num_warps", "num_stages", "enable_fp_fusion", "maxnreg")


class _Captured(Exception):
    """Raised by the intercepted kernel call: carries the kernel and its arguments."""

    def __init__(self, fn: JITFunction, args: tuple[Any, ...], kwargs: dict[str, Any]):
        super().__init__(fn.__name__)
        self.fn, self.args, self.kwargs = fn, args, kwargs


def _intercepted(launch: Any) -> _Captured:
    """The kernel call that `launch()` makes (the call is not run)."""

    def intercept(self: JITFunction, *args: Any, grid: Any, warmup: bool, **kwargs: Any) -> None:
        raise _Captured(self, args, kwargs)

    saved = JITFunction.run
    JITFunction.run = intercept  # type: ignore[method-assign]
    try:
        launch()
    except _Captured as call:
        return call
    finally:
        JITFunction.run = saved  # type: ignore[method-assign]
    raise RuntimeError("the launcher made no kernel call")


def capture_attention(shape: tuple[int, ...], dtype: torch.dtype, cfg: dict[str, Any], sketch: bool) -> _Captured:
    """The attention launcher's kernel call for CPU q = k = v of `shape` (B, H, S, D)."""
    from optwin.kernels import attention as mod

    q = torch.zeros(shape, dtype=dtype)
    saved = mod.check_device
    mod.check_device = lambda *t: None  # CPU tensors: the launcher only reads their shapes and strides
    try:
        return _intercepted(lambda: mod.attention(
            q, q, q, bool(cfg.get("causal")), sketch=sketch, config=tuple(cfg["config"]) if "config" in cfg else None,
            _parts=tuple(cfg.get("parts", (True, True)))))
    finally:
        mod.check_device = saved


def capture(op: str, shape: tuple[int, ...], dtype: torch.dtype, cfg: dict[str, Any], sketch: bool) -> _Captured:
    """The kernel call op's launcher makes for CPU inputs of `shape` (the call is not run)."""
    if op == "attention":
        return capture_attention(shape, dtype, cfg, sketch)
    from gpu_kernels import OPS, _sweep_launcher

    from optwin.kernels.sketch_buffer import new_buffer

    inp, params = OPS[op].make(shape, dtype, "cpu", torch.Generator().manual_seed(0))
    x2 = {k: (v.reshape(-1, v.shape[-1]) if k == "x" and op != "rope" else v) for k, v in inp.items()}
    y = torch.empty_like(x2["x"])
    launch = _sweep_launcher(op, x2, params, y, cfg)
    # CPU tensors get no L2 prefetch (_common.prefetch_bytes); a `prefetch` override compiles it as on sm_90
    from optwin.kernels import _common

    saved_pf = _common.prefetch_bytes
    if cfg.get("prefetch"):
        _common.prefetch_bytes = lambda x: _common.bulk_row_bytes(  # the rule, without the GPU test
            x.data_ptr(), x.stride(0) * x.element_size(), x.shape[1] * x.element_size())
    try:
        return _intercepted(lambda: launch(new_buffer(op, "cpu") if sketch else None))
    finally:
        _common.prefetch_bytes = saved_pf


def compile_call(call: _Captured) -> Any:
    """triton.compile of the captured call for sm_90a, specialized as a launch would be."""
    fn, names = call.fn, call.fn.arg_names
    values = dict(zip(names, call.args))
    values.update({k: v for k, v in call.kwargs.items() if k in names})
    options = {k: v for k, v in call.kwargs.items() if k in OPTIONS}
    sig: dict[str, str] = {}
    constexprs: dict[tuple[int, ...], Any] = {}
    attrs: dict[tuple[int, ...], list[list[Any]]] = {}
    for i, name in enumerate(names):
        v = values.get(name, fn.params[i].default)
        if fn.params[i].is_constexpr or isinstance(v, (bool, str)) or v is None:
            sig[name], constexprs[(i,)] = "constexpr", v
        elif isinstance(v, torch.Tensor):
            sig[name] = "*" + TYPES[v.dtype]
            if v.data_ptr() % 16 == 0:
                attrs[(i,)] = [["tt.divisibility", 16]]
        elif isinstance(v, int):
            if v == 1:
                sig[name], constexprs[(i,)] = "constexpr", 1
                continue
            sig[name] = "i64" if abs(v) >= 2**31 else "i32"
            if v % 16 == 0:
                attrs[(i,)] = [["tt.divisibility", 16]]
        else:
            sig[name] = "fp32"
    src = ASTSource(fn=fn, signature=sig, constexprs=constexprs, attrs=attrs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options)


def sass_instructions(sass: str) -> list[tuple[int, str]]:
    """(address, text) of each instruction of a cuobjdump SASS listing, in order."""
    return [(int(m.group(1), 16), m.group(2)) for m in
            (re.match(r"\s*/\*([0-9a-f]{4,})\*/\s+(.*?);", line) for line in sass.splitlines()) if m]


def sass_loops(ins: list[tuple[int, str]]) -> list[tuple[int, int]]:
    """(first, last) indices into `ins` (sass_instructions) of each loop: a branch back to an earlier
    address; largest first."""
    at = {a: i for i, (a, _) in enumerate(ins)}
    loops = []
    for i, (a, text) in enumerate(ins):
        m = re.search(r"BRA (?:`\(.*?\) )?0x([0-9a-f]+)", text)
        if m and int(m.group(1), 16) < a and int(m.group(1), 16) in at:
            loops.append((at[int(m.group(1), 16)], i))
    return sorted(loops, key=lambda lo_hi: lo_hi[0] - lo_hi[1])


def loop_report(ins: list[tuple[int, str]]) -> dict[str, Any]:
    """The largest loop's size in SASS instructions (a persistent kernel's row loop; cold branches inside
    it count too; a loop the compiler unrolled is none: the Welford kernel's piece loops, its row length
    compiled in, leave the finisher's poll loop) and the spill instructions (STL/LDL) inside any loop:
    spills after the loops (a finisher's tail, a cold path) cost once, spills inside them every pass."""
    loops = sass_loops(ins)
    inside = {i for lo, hi in loops for i in range(lo, hi + 1)}
    return {"largest_loop_sass": loops[0][1] - loops[0][0] + 1 if loops else 0,
            "spills_in_loops": sum(1 for i in inside if re.search(r"\b(STL|LDL)\b", ins[i][1]))}


def ptxas_report(ptx: str, sass_file: Path | None = None) -> dict[str, Any]:
    """Registers, spill bytes and barriers of the PTX assembled for sm_90a by triton's bundled ptxas
    (the SASS listing also written to sass_file when given)."""
    bindir = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
    ptxas = bindir / "ptxas-blackwell" if (bindir / "ptxas-blackwell").exists() else bindir / "ptxas"
    with tempfile.TemporaryDirectory() as d:
        (Path(d) / "k.ptx").write_text(ptx)
        out = subprocess.run([str(ptxas), "-arch=sm_90a", "-v", "k.ptx", "-o", "k.cubin"], cwd=d,
                             capture_output=True, text=True, check=True).stderr
        regs = re.search(r"Used (\d+) registers", out)
        spills = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", out)
        sass = subprocess.run([str(bindir / "cuobjdump"), "-sass", "k.cubin"], cwd=d, capture_output=True, check=False,
                              text=True).stdout
    if sass_file is not None:
        sass_file.write_text(sass)
    ins = sass_instructions(sass)
    return {
        "registers": int(regs.group(1)) if regs else None,
        "spill_stores": int(spills.group(1)) if spills else None,
        "spill_loads": int(spills.group(2)) if spills else None,
        "bar_sync_ptx": ptx.count("bar.sync"),
        "sass_instructions": len(ins),
        **loop_report(ins),
    }


def report(op: str, shape: tuple[int, ...], dtype: torch.dtype, cfg: dict[str, Any], sketch: bool,
           sass_dir: Path | None = None) -> dict[str, Any]:
    """One row: the kernel, its launch and what ptxas made of it (vector_loads: the PTX has 16-byte
    global loads, i.e. the alignment specialization took)."""
    call = capture(op, shape, dtype, cfg, sketch)
    compiled = compile_call(call)
    ptx = compiled.asm["ptx"]
    launch = {k: v for k, v in call.kwargs.items() if k in OPTIONS or k == "STAGES"}
    sass_file = None
    if sass_dir is not None:
        sass_dir.mkdir(parents=True, exist_ok=True)
        sass_file = sass_dir / f"{op}_{'sketch' if sketch else 'plain'}.sass"
    return {"op": op, "kernel": call.fn.__name__, "sketch": sketch, **launch, **ptxas_report(ptx, sass_file),
            "shared": int(compiled.metadata.shared),
            "vector_loads": bool(re.search(r"ld\.global[.\w:]*\.v4\.b32", ptx))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("ops", nargs="+", choices=["rmsnorm", "layernorm", "softmax", "rope", "attention"])
    ap.add_argument("--shape", default="4096x16384", help="rows x n (rope: seq x heads x d; attention: B x H x S x D)")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    ap.add_argument("--cfg", default="{}", help="launch overrides as JSON, e.g. '{\"num_warps\": 8}'")
    ap.add_argument("--sketch", default="both", choices=["both", "yes", "no"], help="which launches to compile")
    ap.add_argument("--json", action="store_true", help="one JSON object per kernel instead of the table")
    ap.add_argument("--sass", type=Path, help="also write each kernel's SASS listing into this folder")
    args = ap.parse_args()
    shape = tuple(int(v) for v in args.shape.split("x"))
    cfg = json.loads(args.cfg)
    sketches = {"both": (False, True), "yes": (True,), "no": (False,)}[args.sketch]
    if args.json:
        for op in args.ops:
            for sketch in sketches:
                print(json.dumps(report(op, shape, getattr(torch, args.dtype), cfg, sketch, args.sass)))
        return
    print(f"triton {triton.__version__}, sm_90a, {args.dtype} {args.shape}, cfg {cfg or 'the shipped launch'}\n")
    print("| op | kernel | sketch | num_warps | stages | maxnreg | registers | spill bytes (st/ld) | shared bytes | "
          "bar.sync (PTX) | SASS | largest loop | spills in loops |")
    print("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for op in args.ops:
        for sketch in sketches:
            r = report(op, shape, getattr(torch, args.dtype), cfg, sketch, args.sass)
            print(f"| {op} | {r['kernel']} | {'yes' if sketch else 'no'} | {r.get('num_warps', '-')} | "
                  f"{r.get('STAGES', '-')} | {r.get('maxnreg') or '-'} | {r['registers']} | "
                  f"{r['spill_stores']}/{r['spill_loads']} | {r['shared']} | {r['bar_sync_ptx']} | {r['sass_instructions']} | "
                  f"{r['largest_loop_sass']} | {r['spills_in_loops']} |")


if __name__ == "__main__":
    main()
