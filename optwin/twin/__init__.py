"""FP64 twins of the catalog's GPU operator variants, with emulated numerics and rounding noise.

    python -c "import torch; from optwin import twin; x = torch.randn(4, 64).half()*300; \
w = torch.ones(64).half(); print(twin.run('rmsnorm', 'native-dtype', 'float16', {'x': x, 'weight': w}).faults)"

`run` is the public entry point (shared/spec/api.md). Each operator lives in `optwin/twin/<op>.py`
and exposes:
- `reference(inputs, params) -> Tensor`: the float64 reference of the spec;
- `reference_probabilities(inputs, params) -> Tensor` (softmax, attention): the float64 row
  probabilities that `low_entropy` judges;
- `twin(num, variant, dtype, inputs, params) -> Tensor`: the variant step by step, each rounding
  point of the real implementation a `num.round(...)` / `num.sum(...)` call. Inputs are float64 and
  may carry a leading replay dim, so twins index trailing dims only;
- optionally `noise_free_rows(variant, dtype, inputs, params) -> bool Tensor (..., 1) | None`: rows whose every
  noisy replay is the deterministic emulation (layernorm's exactly constant rows where the emulation is the
  GPU's row for row), None when there are none.
"""

from __future__ import annotations

import importlib
import numbers
from dataclasses import dataclass, field
from typing import Any, Mapping

import torch

from optwin.catalog import Tolerances, resolve_params, resolve_tolerances
from optwin.errors import CatalogError, InputError
from optwin.twin.faults import fault_flags, relative_error
from optwin.twin.numerics import NOISE_MODES, Numerics
from optwin.validation import validate

TWIN_VERSION = "11"

__all__ = ["run", "TwinResult", "TWIN_VERSION", "NOISE_MODES", "twin_module", "to_float64", "references"]


@dataclass
class TwinResult:
    """What `run` returns (shared/spec/api.md)."""

    op: str
    variant: str
    dtype: str
    exact: torch.Tensor  # float64 reference
    emulated: torch.Tensor  # float64: the variant under deterministic emulation
    faults: dict[str, bool]  # for `emulated`
    replay_faults: dict[str, torch.Tensor] = field(default_factory=dict)  # fault -> bool [replays]
    replays: torch.Tensor | None = None  # float64 [replays, ...] outputs of the noisy replays (keep_replays only)
    noise: str = "none"
    rel_error: float = 0.0  # ||emulated - exact|| / ||exact|| over finite-reference elements
    replay_rel_error: torch.Tensor | None = None  # [replays]

    @property
    def probability(self) -> dict[str, float]:
        """Fraction of replays that fault, per type (the deterministic flags when there are none).
        `run` gives replay_faults every fault type even without replays ([0] tensors, whose mean is
        NaN), so "no replays" is told by their length; an empty dict (a hand-built result) too."""
        if not any(v.numel() for v in self.replay_faults.values()):
            return {k: float(v) for k, v in self.faults.items()}
        return {k: float(v.double().mean()) for k, v in self.replay_faults.items()}


def twin_module(op: str):
    return importlib.import_module(f"optwin.twin.{op}")


def to_float64(inputs: Mapping[str, torch.Tensor], op: str = "") -> dict[str, torch.Tensor]:
    """Exact float64 CPU copies of dtype-rounded inputs. Integer inputs (rope's int64 positions) are
    exact in float64 only below 2^53 in magnitude: one at or past it is a one-line InputError (naming
    `op`), as the float64 reference would silently round it (the spec's exact integer positions)."""
    for k, v in inputs.items():
        if not v.is_floating_point() and not v.is_complex() and v.dtype != torch.bool:
            if bool(((v >= 2**53) | (v <= -(2**53))).any()):  # no abs(): abs(-2^63) overflows int64
                where = f"{op}: " if op else ""
                raise InputError(f"{where}input {k!r} holds integers of magnitude >= 2^53, "
                                 "past what float64 (the reference) holds exactly")
    return {k: v.detach().to("cpu", torch.float64) for k, v in inputs.items()}


def references(op: str, inputs64: Mapping[str, torch.Tensor], params: Mapping[str, Any]
               ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The float64 reference of `op` and, for softmax/attention, the row probabilities that
    `low_entropy` judges (None for the other ops). Inputs are float64; params resolved."""
    mod = twin_module(op)
    prob = mod.reference_probabilities(inputs64, params) if hasattr(mod, "reference_probabilities") else None
    return mod.reference(inputs64, params), prob


MAX_REPLAYS = 1_000_000  # replays one run takes (their batches bound the memory, not the time)
# Bytes a batch of noisy replays may hold at once: `run` replays in batches of at most this over
# replay_bytes(...) replays (at least one), so its memory stays bounded whatever `replays` is. Each
# replay draws from its own generator, so the batches give the replays of one unbatched run.
REPLAY_BATCH_BYTES = 1 << 29
# float64 tensors of a replay's largest size a twin holds at once, with a margin: peak memory per
# replay measured 1-18 of them over every op (64x1024 rows, 2x128x64 attention, 128x512 @ 512x128)
# under stochastic, mca and order; mca and rope's tables the most.
_LIVE_COPIES = 24


def replay_bytes(inputs64: Mapping[str, torch.Tensor], exact: torch.Tensor, r_prob: torch.Tensor | None) -> int:
    """Memory one noisy replay of these inputs takes: _LIVE_COPIES float64 tensors of its largest size
    (the inputs together, the output, or attention's score matrix, whose size r_prob has)."""
    largest = max(sum(v.numel() for v in inputs64.values()), exact.numel(), 0 if r_prob is None else r_prob.numel())
    return 8 * _LIVE_COPIES * max(1, largest)


def _count(name: str, op: str, v: Any, lo: int, hi: int) -> int:
    """An int argument within [lo, hi] (numpy integers too; bools and floats are refused), or CatalogError."""
    if isinstance(v, bool) or not isinstance(v, numbers.Integral) or not lo <= int(v) <= hi:
        raise CatalogError(f"{op}: {name} must be an int in [{lo}, {hi}], got {v!r:.40}")
    return int(v)


def run(op: str, variant: str, dtype: str, inputs: Mapping[str, torch.Tensor], params: Mapping[str, Any] | None = None,
        noise: str = "none", replays: int = 0, seed: int = 0, tolerances: Tolerances | Mapping[str, float] | None = None,
        keep_replays: bool = False) -> TwinResult:
    """Run one input through the twin of (op, variant, dtype): reference, emulation, noisy replays.

    Noisy replays run in batches of at most REPLAY_BATCH_BYTES (the same replays whatever the split);
    only their flags and errors are kept, and their outputs with `keep_replays` (replays x output).
    `tolerances`: a Tolerances or a dict of some of its fields (the rest the spec's defaults)."""
    if not isinstance(noise, str) or noise not in NOISE_MODES:
        raise CatalogError(f"{op}: unknown noise mode {noise!r:.40}; expected one of {', '.join(NOISE_MODES)}")
    replays = _count("replays", op, replays, 0, MAX_REPLAYS)
    seed = _count("seed", op, seed, 0, 2**63 - 1)  # torch.Generator's seed range
    tolerances = resolve_tolerances(tolerances, op)
    validate(op, variant, dtype, inputs)
    p = resolve_params(op, params)
    x = to_float64(inputs, op)
    mod = twin_module(op)
    exact, r_prob = references(op, x, p)
    emulated = mod.twin(Numerics("none"), variant, dtype, x, p)
    flags = fault_flags(op, dtype, emulated, exact, r_prob, tolerances)
    result = TwinResult(op, variant, dtype, exact, emulated, {k: bool(v) for k, v in flags.items()}, noise=noise,
                        rel_error=float(relative_error(emulated, exact)))
    # replays == 0 takes these branches too: every field sized [replays] is then an empty tensor with
    # every fault type (the spec's bool [replays]), as with replays >= 1, not an empty dict or None.
    if noise == "none":  # deterministic replays are all the emulated output
        result.replay_faults = {k: v.expand(replays).clone() for k, v in flags.items()}
        result.replay_rel_error = torch.full((replays,), result.rel_error, dtype=torch.float64)
        if keep_replays:
            result.replays = emulated.unsqueeze(0).expand(replays, *emulated.shape)
    else:
        batch = max(1, REPLAY_BATCH_BYTES // replay_bytes(x, exact, r_prob))
        exact_rows = mod.noise_free_rows(variant, dtype, x, p) if hasattr(mod, "noise_free_rows") else None
        # Only the flags, the errors (and kept outputs) outlive a batch, each copied into a tensor made
        # before the first: small tensors made batch after batch would pin the freed heap (RSS grew
        # with every batch).
        result.replay_faults = {k: torch.empty(replays, dtype=torch.bool) for k in flags}
        result.replay_rel_error = torch.empty(replays, dtype=torch.float64)
        if keep_replays:
            result.replays = torch.empty(replays, *exact.shape, dtype=torch.float64)
        for first in range(0, replays, batch):
            part = slice(first, min(first + batch, replays))
            num = Numerics(noise, part.stop - first, seed, first_replay=first)
            outs = mod.twin(num, variant, dtype, {k: num.expand(v) for k, v in x.items()}, p)
            if exact_rows is not None:  # rows the emulation pins down exactly: noise would only invent faults there
                outs = torch.where(exact_rows, emulated, outs)
            for k, v in fault_flags(op, dtype, outs, exact, r_prob, tolerances).items():
                result.replay_faults[k][part] = v
            result.replay_rel_error[part] = relative_error(outs, exact)
            if keep_replays:
                result.replays[part] = outs
            del outs, num
    return result
