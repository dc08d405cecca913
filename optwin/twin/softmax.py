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

from optwin.twin.numerics import TRITON_WHOLE_ROW_MAX, Numerics, triton_row_lanes

F32 = "float32"
FLT_MIN = 2.0**-126  # smallest normal float32
LOG2E_F32 = 1.44269502162933349609375  # log2(e) rounded to float32: the kernel's factor before ex2


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
    s = num.round(num.sum(e, acc=F32, order="blocked", keepdim=True), dtype)  # (..., 1) fp32 acc -> dtype
    return num.round(e / s, dtype)  # (..., n) dtype


def triton_softmax(num: Numerics, x: torch.Tensor, dtype: str) -> torch.Tensor:
    """Our Triton kernel: fp32 row in registers, exp(d) as ex2.approx.ftz(fp32(d * fp32(log2 e)))
    (modelled as exp2 of the rounded product, rounded to fp32; the stochastic/mca modes give ex2's
    last bits their spread) and flushed to 0 below 2^-126,
    tl.sum as a tree, one cast to dtype at the store. Rows past TRITON_WHOLE_ROW_MAX
    (optwin.kernels.softmax_long): s per lane over TRITON_CHUNK-wide pieces, then a tree."""
    m = num.max(x, keepdim=True)  # (..., 1) tl.max, exact
    t = num.round(num.round(x - m, F32) * LOG2E_F32, F32)  # (..., n) fp32 base-2 argument
    e = num.round(torch.exp2(t), F32)  # (..., n) fp32
    e = torch.where(e < FLT_MIN, 0.0, e)  # ex2.approx.ftz: no subnormal results
    n = x.shape[-1]
    if n > TRITON_WHOLE_ROW_MAX:  # lane sums over the pieces, then a tree
        s = num.sum(e, acc=F32, order="blocked", lanes=triton_row_lanes(n), keepdim=True)
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
