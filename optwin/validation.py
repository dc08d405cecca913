"""Input checks shared by the twins, the sketch and the kernels: names, shapes, dtypes, values.

Each failure is one `InputError` line that names the op and what was expected.
"""

from __future__ import annotations

from typing import Any, Mapping

import torch

from optwin.catalog import Operator, check_variant_dtype
from optwin.errors import InputError

_TORCH_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32,
                 "int64": torch.int64}


def torch_dtype(name: str) -> torch.dtype:
    return _TORCH_DTYPES[name]


def check_names(spec: Operator, inputs: Mapping[str, Any]) -> None:
    if not isinstance(inputs, Mapping):
        raise InputError(f"{spec.name}: inputs must be a dict of tensors {list(spec.input_names())}, got {type(inputs).__name__}")
    expected = set(spec.input_names())
    missing, extra = expected - set(inputs), set(inputs) - expected
    if missing or extra:
        parts = []
        if missing:
            parts.append(f"missing {sorted(missing)}")
        if extra:
            parts.append(f"unexpected {sorted(extra)}")
        raise InputError(f"{spec.name}: {', '.join(parts)}; expected inputs {list(spec.input_names())}")
    for name in spec.input_names():
        if not isinstance(inputs[name], torch.Tensor):
            raise InputError(f"{spec.name}: input {name!r} must be a torch.Tensor, got {type(inputs[name]).__name__}")


def check_shapes(spec: Operator, inputs: Mapping[str, torch.Tensor]) -> None:
    """Tensors that hold data, ndim per input, then the cross-input shape relations of each op."""
    for i in spec.inputs:
        t = inputs[i.name]
        if t.is_meta:  # a shape without values (a model built on the meta device)
            raise InputError(f"{spec.name}: input {i.name!r} is on the meta device: it holds no values to check")
        if t.layout != torch.strided:  # sparse (COO, CSR, ...) or MKL-DNN: most ops here have no kernel for them
            raise InputError(f"{spec.name}: input {i.name!r} is a {str(t.layout).removeprefix('torch.')} tensor; "
                             "expected a dense (strided) one")
        if t.ndim < i.min_ndim or (i.max_ndim is not None and t.ndim > i.max_ndim):
            raise InputError(f"{spec.name}: input {i.name!r} must be {i.shape}, got shape {tuple(t.shape)}")
        if t.numel() == 0:
            raise InputError(f"{spec.name}: input {i.name!r} is empty (shape {tuple(t.shape)})")
    op, s = spec.name, {k: tuple(v.shape) for k, v in inputs.items()}
    if op in ("rmsnorm", "layernorm"):
        for w in ("weight", "bias") if op == "layernorm" else ("weight",):
            if s[w] != (s["x"][-1],):
                raise InputError(f"{op}: {w} must be [hidden] = [{s['x'][-1]}], got {list(s[w])}")
    elif op == "rope":
        seq, _, d = s["x"]
        if d % 2:
            raise InputError(f"rope: head dim d must be even, got x shape {list(s['x'])}")
        if s["positions"] != (seq,):
            raise InputError(f"rope: positions must be [seq] = [{seq}], got {list(s['positions'])}")
    elif op == "attention":
        q, k, v = s["q"], s["k"], s["v"]
        if not (q[:2] == k[:2] == v[:2] and k[2] == v[2] and q[3] == k[3]):
            raise InputError(f"attention: need q [b,h,sq,d], k [b,h,sk,d], v [b,h,sk,dv]; got q {list(q)}, k {list(k)}, v {list(v)}")
    elif op == "geodesic":
        if len({s[n] for n in spec.input_names()}) != 1:
            raise InputError(f"geodesic: lat1, lon1, lat2, lon2 must share one shape [n], got {s}")
    elif op == "matmul":
        if s["a"][1] != s["b"][0]:
            raise InputError(f"matmul: a [m, k] and b [k, n] disagree on k: {list(s['a'])} @ {list(s['b'])}")


def check_dtypes(spec: Operator, dtype: str, inputs: Mapping[str, torch.Tensor], present_only: bool = False) -> None:
    """Each input in the call's dtype (the catalog's own where it fixes one: rope's positions int64).
    present_only: skip names that are missing or not tensors (check_names, run later, says so)."""
    for i in spec.inputs:
        want = dtype if i.dtype == "op" else i.dtype
        t = inputs.get(i.name) if present_only else inputs[i.name]
        if present_only and not isinstance(t, torch.Tensor):
            continue
        got = t.dtype
        if got != _TORCH_DTYPES[want]:
            raise InputError(f"{spec.name}: input {i.name!r} must be {want}, got {str(got).removeprefix('torch.')}")


def check_kinds(spec: Operator, inputs: Mapping[str, torch.Tensor]) -> None:
    """Real floating tensors where the op takes floats, integer ones where it takes int64 (rope's positions),
    whatever their width: a sketch is taken of any float dtype (a model in float32), never of ints, bools or
    complex numbers, whose magnitudes mean nothing to the op's faults."""
    for i in spec.inputs:
        t = inputs[i.name]
        if i.dtype == "int64":
            ok = not t.is_floating_point() and not t.is_complex() and t.dtype != torch.bool
        else:
            ok = t.is_floating_point()
        if not ok:
            want = "an integer" if i.dtype == "int64" else "a floating"
            raise InputError(f"{spec.name}: input {i.name!r} must be {want} tensor, got {str(t.dtype).removeprefix('torch.')}")


def check_values(spec: Operator, inputs: Mapping[str, torch.Tensor]) -> None:
    """Non-finite inputs are refused except -inf masks where the op allows them."""
    for i in spec.inputs:
        t = inputs[i.name]
        if not t.is_floating_point():
            continue
        bad = torch.isnan(t) | (t == float("inf")) if i.allow_neg_inf else ~torch.isfinite(t)
        n_bad = int(bad.sum())
        if n_bad:
            allowed = " (-inf masks are allowed)" if i.allow_neg_inf else ""
            raise InputError(f"{spec.name}: input {i.name!r} holds {n_bad} non-finite values; expected finite{allowed}")


def validate(op: str, variant: str, dtype: str, inputs: Mapping[str, Any], values: bool = True) -> Operator:
    """Every check above, in order; returns the operator spec."""
    spec = check_variant_dtype(op, variant, dtype)
    check_names(spec, inputs)
    check_shapes(spec, inputs)
    check_dtypes(spec, dtype, inputs)
    if values:
        check_values(spec, inputs)
    return spec
