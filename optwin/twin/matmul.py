"""matmul twin: torch (cuBLAS: exact products, fp32 accumulation over k-chunks, output in dtype).

    python -c "import torch; from optwin import twin; a = torch.full((2, 4), 128.).half(); \
b = torch.full((4, 2), 128.).half(); print(twin.run('matmul', 'torch', 'float16', {'a': a, 'b': b}).faults)"

Inputs `a (m, k)`, `b (k, n)` are float64 views of dtype tensors and may carry a leading replay
dim (broadcast by `num.matmul`).
"""

from __future__ import annotations

import torch

from optwin.twin.numerics import Numerics

F32 = "float32"


def reference(inputs: dict[str, torch.Tensor], params: dict) -> torch.Tensor:
    """a @ b in float64."""
    return inputs["a"] @ inputs["b"]  # (m, n)


def twin(num: Numerics, variant: str, dtype: str, inputs: dict[str, torch.Tensor], params: dict) -> torch.Tensor:
    if variant != "torch":
        raise ValueError(f"matmul: no twin for variant {variant!r}")
    # A tensor-core MMA sums a k-tile of exact products, tiles accumulate in fp32, one store in dtype.
    return num.matmul(inputs["a"], inputs["b"], out=dtype, acc=F32)  # (..., m, n)
