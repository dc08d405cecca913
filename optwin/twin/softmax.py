"""softmax twin: torch (GPU softmax, fp32 inside), naive (exp without max, every step in dtype), triton.

    python -c "import torch; from optwin import twin; x = torch.full((2, 8), 11.2).half(); \
print(twin.run('softmax', 'naive', 'float16', {'x': x}).faults)"

Input `x (..., n)` is a float64 view of a dtype tensor (it may hold -inf masks) and may carry a
leading replay dim. Each `num.round` / `num.sum` below is one rounding point of the GPU code.
Fully masked rows (all -inf) have no finite reference (float64 softmax gives NaN there too): the
`torch` and `triton` variants compute -inf - (-inf) = NaN, `naive` computes 0 / 0 = NaN, as torch does.
"""

from __future__ import annotations

import torch

from optwin.twin.numerics import LOG2E_F32, TRITON_CHUNK, TRITON_WHOLE_ROW_MAX, Numerics

F32 = "float32"
FLT_MIN = 2.0**-126  # smallest normal float32


def reference(inputs: dict[str, torch.Tensor], params: dict) -> torch.Tensor:
    """float64 softmax over the last dim (NaN rows where every position is masked)."""
    return torch.softmax(inputs["x"], dim=-1)


def reference_probabilities(inputs: dict[str, torch.Tensor], params: dict) -> torch.Tensor:
    """The probability matrix low_entropy judges: the reference itself."""
    return reference(inputs, params)


def torch_softmax(num: Numerics, x: torch.Tensor, dtype: str) -> torch.Tensor:
    """torch.softmax(x, -1) on the GPU for x in dtype: fp32 internally, rounded to dtype once.

    x.float() is exact; max is exact; the block reduction of the row sum is `num.sum(order="blocked")`.
    Reused by the attention `math` twin.
    """
    m = num.max(x, keepdim=True)  # (..., 1) exact; -inf for a fully masked row
    e = num.round(torch.exp(num.round(x - m, F32)), F32)  # (..., n) fp32; NaN where m = -inf
    s = num.sum(e, acc=F32, order="blocked", keepdim=True)  # (..., 1) fp32 block reduction
    y = num.round(e / s, F32)  # (..., n) fp32 epilogue
    return y if dtype == F32 else num.round(y, dtype)


def naive_softmax(num: Numerics, x: torch.Tensor, dtype: str) -> torch.Tensor:
    """exp(x) / sum(exp(x)) with every intermediate a dtype tensor (no max subtraction)."""
    e = num.round(torch.exp(x), dtype)  # (..., n) dtype: overflows above ln(max of dtype)
    # torch's CUDA reduce of the dtype tensor e (Reduce.cuh: 16-byte vector loads of its elements), fp32 acc -> dtype
    s = num.round(num.sum(e, acc=F32, order="cuda", keepdim=True, outputs=num.rows(e), itemsize=getattr(torch, dtype).itemsize), dtype)
    return num.round(e / s, dtype)  # (..., n) dtype


def _exp_ftz(num: Numerics, d: torch.Tensor) -> torch.Tensor:
    """The kernels' exp(d): ex2.approx.ftz(fp32(d * fp32(log2 e))) (optwin.kernels._common.exp_ftz),
    modelled as exp2 of the rounded product rounded to fp32 (the stochastic/mca modes give ex2's last
    bits their spread), 0 below 2^-126."""
    e = num.round(torch.exp2(num.round(d * LOG2E_F32, F32)), F32)
    return torch.where(e < FLT_MIN, 0.0, e)


def _piece_sums(num: Numerics, x: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    """s of optwin.kernels.softmax_long for rows past TRITON_WHOLE_ROW_MAX: each TRITON_CHUNK-wide
    piece k sums exp(h - m_k) over itself with m_k its own max (a tree; s_k = 0 for a piece of only
    -inf), then s = fp32(sum_k s_k * exp(m_k - m)), the products and their sum in float64 (one
    rounding). The max passes over NaN as tl.max does; a NaN or +inf makes its piece's sum NaN, and s
    with it."""
    n = x.shape[-1]
    pieces = -(-n // TRITON_CHUNK)
    xp = torch.nn.functional.pad(x, (0, pieces * TRITON_CHUNK - n), value=-float("inf"))
    xp = xp.reshape(*x.shape[:-1], pieces, TRITON_CHUNK)  # (..., pieces, columns)
    mk = num.max(xp, keepdim=True)  # (..., pieces, 1)
    base = torch.where(mk == -float("inf"), 0.0, mk)
    sk = num.sum(_exp_ftz(num, num.round(xp - base, F32)), acc=F32, order="pairwise")  # (..., pieces)
    mk = mk.squeeze(-1)
    w = torch.where(mk == -float("inf"), 0.0, sk * _exp_ftz(num, num.round(mk - m, F32)))  # exact in float64
    return num.round(w.sum(-1, keepdim=True), F32)


def triton_softmax(num: Numerics, x: torch.Tensor, dtype: str) -> torch.Tensor:
    """Our Triton kernel: fp32 row in registers, exp as _exp_ftz, tl.sum as a tree, one cast to
    dtype at the store. Rows past TRITON_WHOLE_ROW_MAX (optwin.kernels.softmax_long): s from the
    sums of TRITON_CHUNK-wide pieces (_piece_sums), the same e and y."""
    m = num.max(x, keepdim=True)  # (..., 1) tl.max, exact
    e = _exp_ftz(num, num.round(x - m, F32))  # (..., n) fp32
    if x.shape[-1] > TRITON_WHOLE_ROW_MAX:
        s = _piece_sums(num, x, m)
    else:
        s = num.sum(e, acc=F32, order="pairwise", keepdim=True)  # (..., 1) tl.sum: a tree
    y = num.round(e / s, F32)  # (..., n) fp32
    return y if dtype == F32 else num.round(y, dtype)


_VARIANTS = {"torch": torch_softmax, "naive": naive_softmax, "triton": triton_softmax}


def twin(num: Numerics, variant: str, dtype: str, inputs: dict[str, torch.Tensor], params: dict) -> torch.Tensor:
    try:
        fn = _VARIANTS[variant]
    except KeyError:
        raise ValueError(f"softmax: no twin for variant {variant!r}") from None
    return fn(num, inputs["x"], dtype)
