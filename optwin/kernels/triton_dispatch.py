"""Catalog variant "triton" -> our kernels (sketch off). Imports triton through the kernel modules.

    TRITON_INTERPRET=1 python -c "import torch; from optwin.kernels import run_variant; \
print(run_variant('softmax', 'triton', 'float32', {'x': torch.randn(2, 5)}))"
"""

from __future__ import annotations

from typing import Any

import torch

from optwin.errors import CatalogError


def run_triton(op: str, inputs: dict[str, torch.Tensor], params: dict[str, Any], constants: dict[str, float]) -> torch.Tensor:
    """Run op's Triton kernel without the sketch; inputs already validated by run_variant."""
    if op == "rmsnorm":
        from optwin.kernels.rmsnorm import rmsnorm

        return rmsnorm(inputs["x"], inputs["weight"], constants["eps"], sketch=False)[0]
    if op == "softmax":
        from optwin.kernels.softmax import softmax

        return softmax(inputs["x"], sketch=False)[0]
    if op == "layernorm":
        from optwin.kernels.layernorm import layernorm

        return layernorm(inputs["x"], inputs["weight"], inputs["bias"], constants["eps"], sketch=False)[0]
    if op == "rope":
        from optwin.kernels.rope import rope

        return rope(inputs["x"], inputs["positions"], float(params["base"]), sketch=False)[0]
    if op == "attention":
        from optwin.kernels.attention import attention

        return attention(inputs["q"], inputs["k"], inputs["v"], bool(params["causal"]), sketch=False)[0]
    raise CatalogError(f"{op}/triton: no Triton kernel")
