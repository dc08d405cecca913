"""Spy on a HF model's attention calls: each call's q, k, v (and mask), and the model's own attention output for
it. Shared by the padded-batch capture tests (tests/test_capture_s49_padding.py for Llama,
tests/test_capture_s49_encoder_padding.py for BERT/MiniLM). Not a test module; the tests import it as
`_attention_spy`.

    from _attention_spy import AttentionSpy

    with AttentionSpy(model, impl, modeling_llama, [layer.self_attn.o_proj for layer in model.model.layers]) as seen:
        model(ids)
    seen.qkv, seen.out  # (and seen.masks with keep_masks=True), in call order
"""

from __future__ import annotations

from types import ModuleType

import torch
import torch.nn.functional as F


class AttentionSpy:
    """Every attention call's q, k, v (the attention function's own arguments, eager's or sdpa's), its mask (with
    `keep_masks`) and the model's own attention output for it, in call order. The output is the input of the
    layer's output projection (`out_projs`, one per layer: Llama's self_attn.o_proj, BERT's
    attention.output.dense), (b, s, h*d) -> (b, h, s, d). `modeling` is the HF modeling module whose
    eager_attention_forward the model's eager attention calls."""

    def __init__(
        self,
        model: torch.nn.Module,
        impl: str,
        modeling: ModuleType,
        out_projs: list[torch.nn.Module],
        keep_masks: bool = False,
    ) -> None:
        self.model, self.impl, self.modeling, self.out_projs, self.keep_masks = model, impl, modeling, out_projs, keep_masks
        self.qkv: list[tuple[torch.Tensor, ...]] = []
        self.masks: list[torch.Tensor | None] = []
        self.out: list[torch.Tensor] = []

    def _seen(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None) -> None:
        self.qkv.append((q, k, v))
        if self.keep_masks:
            self.masks.append(mask)

    def __enter__(self) -> AttentionSpy:
        heads = self.model.config.num_attention_heads

        def keep(m, args) -> None:  # noqa: ANN001
            b, s, hd = args[0].shape
            self.out.append(args[0].reshape(b, s, heads, hd // heads).transpose(1, 2).clone())

        self.hooks = [p.register_forward_pre_hook(keep) for p in self.out_projs]
        if self.impl == "sdpa":
            self.orig = F.scaled_dot_product_attention

            def spy(q, k, v, attn_mask=None, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
                self._seen(q, k, v, attn_mask)
                return self.orig(q, k, v, attn_mask, *args, **kwargs)

            F.scaled_dot_product_attention = spy
        else:  # installed before the capture: its wrapper calls this one
            self.orig = self.modeling.eager_attention_forward

            def spy(module, q, k, v, mask, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
                self._seen(q, k, v, mask)
                return self.orig(module, q, k, v, mask, *args, **kwargs)

            self.modeling.eager_attention_forward = spy
        return self

    def __exit__(self, *exc: object) -> None:
        for h in self.hooks:
            h.remove()
        if self.impl == "sdpa":
            F.scaled_dot_product_attention = self.orig
        else:
            self.modeling.eager_attention_forward = self.orig
