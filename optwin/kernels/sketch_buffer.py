"""The sketch buffer our Triton kernels write (the finished sketch features), and the workspace
they merge into.

    python -c "from optwin.kernels.sketch_buffer import WORKSPACE; print(WORKSPACE['softmax'])"

One launch does everything: each persistent kernel program accumulates its rows' partials in
registers, merges them once into a small per-(op, device, stream) workspace with scalar atomics
(max / min / add), and the last program to finish (an acq_rel ticket) reads the workspace back
(plain loads, all in flight at once), resets it for the next launch, and writes the contract's
features, in optwin.ingest's order, as float64 into the call's buffer. The buffer is final when
the kernel completes: no second launch, no zero-fill, no host sync. `read_sketch` is one `.tolist()`.
rmsnorm's and layernorm's launches with a program per row write row records instead (one or two
64-bit words per row, `row_records`; layernorm's flagged rows also merge into its workspace), which
their finisher program polls and resets
(optwin.kernels._common.poll_records); attention's programs (one per SM) write a record each the same way
(RECORD_OPS: no workspace). Softmax's row launch and layernorm's Welford launch may instead defer their
finisher (optwin.kernels.deferred): the buffer is then final once its page settles, which reduce_sketch and
read_sketch see to.

Definitions follow optwin.ingest.sketch exactly (magnitudes over finite elements, counts of
non-finite values; softmax's -inf is a mask, not a non-finite). Per-row values are float32 (the
kernel's own reductions where the row is all finite, an exact finite-only recomputation where it
is not); cross-row sums are float64 in an order set by the atomics, so features agree with ingest
to float32 rounding and may differ run to run in the last float32 bits. Counts are exact (int64).
Two launches of the same op must not overlap on one stream's workspace: streams get their own.
Pure torch, no triton.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from optwin.catalog import operator
from optwin.errors import InputError

# Stand-in for +inf in max_mean_over_std (std == 0, mean != 0); the same cap as optwin.ingest.
RATIO_CAP = 1e30

# Workspace per op: float64 slots (name, identity) merged with atomic max/min/add, and int64 slots
# (slot 0 is the ticket). Kernels index the slots by position; the identities are what the last
# program writes back, so a workspace is always ready for the next launch.
INF = float("inf")
WORKSPACE: dict[str, tuple[tuple[tuple[str, float], ...], tuple[str, ...]]] = {
    "rmsnorm": ((("absmax", 0.0), ("sumsq", 0.0), ("max_row_ms", 0.0)), ("ticket", "nonfinite", "weight_nonfinite")),
    "softmax": (
        (("sumsq", 0.0), ("max", -INF), ("min", INF), ("max_row_range", 0.0), ("min_row_max", INF)),
        ("ticket", "nonfinite", "neginf", "masked_and_peaked_rows", "eligible_rows"),
    ),
    "layernorm": (
        (("absmax", 0.0), ("sumsq", 0.0), ("max_ratio", 0.0), ("min_std", INF), ("const_absmax", 0.0)),
        ("ticket", "nonfinite", "param_nonfinite"),
    ),
    "rope": ((("absmax", 0.0), ("sumsq", 0.0), ("max_pos", 0.0)), ("ticket", "nonfinite")),
}
# Ops whose kernel publishes through program records only (no workspace): attention's programs, one per SM,
# each store a record that the grid's last program reduces (optwin.kernels.attention_sketch).
RECORD_OPS = ("attention",)

# Slots of each kind in every op's workspace (its own, then unused ones), and the offset of the float
# identities: _common.reset_workspace copies and zeroes this many without knowing the op.
SLOTS = 8

_WS: dict[tuple[str, str, int], tuple[torch.Tensor, torch.Tensor]] = {}

# Row records (the launches with a program per row): int64 words per row, SENTINEL between
# launches; a row's program overwrites it and the finisher program polls the words until none holds
# the sentinel in either half, reduces them and writes the sentinel back (_common.poll_records). A row
# whose partials the words cannot hold puts them elsewhere: rmsnorm's in its extra record (two int64),
# layernorm's merged into the op's workspace (no extra record).
SENTINEL = -1  # all ones: a NaN pattern in both halves, which no record half takes
_SCRATCH: dict[tuple[str, str, int], torch.Tensor] = {}
_OUTGROWN: list[torch.Tensor] = []
_RECORDS: dict[tuple[str, str, int], tuple[torch.Tensor, torch.Tensor]] = {}


def feature_names(op: str) -> tuple[str, ...]:
    """The sketch contract's feature names of `op`, in order (= the buffer's layout)."""
    from optwin.ingest.sketch import SKETCH_FEATURES  # torch + catalog only

    operator(op)
    if op not in WORKSPACE and op not in RECORD_OPS:
        raise InputError(f"{op}: no Triton sketch kernel; expected one of {', '.join((*WORKSPACE, *RECORD_OPS))}")
    return SKETCH_FEATURES[op]


_N_FEATURES: dict[str, int] = {}  # op -> len(feature_names(op)), once checked (new_buffer runs every sketched call)


def new_buffer(op: str, device: torch.device | str) -> torch.Tensor:
    """Uninitialised float64 (features,): the kernel writes every entry."""
    n = _N_FEATURES.get(op)
    if n is None:
        n = _N_FEATURES[op] = len(feature_names(op))
    return torch.empty(n, dtype=torch.float64, device=device)


def _stream_key(op: str, device: torch.device) -> tuple[str, str, int]:
    """(op, device, current stream): launches on different streams may overlap, so each stream gets
    its own workspace and row records."""
    if device.type != "cuda":
        return op, str(device), 0
    idx = device.index if device.index is not None else torch.cuda.current_device()
    # the raw handle (what Triton launches on), not torch.cuda.current_stream(): that builds a Stream
    # object, ~5 µs of every sketched launch's host time (bench/launch_cost.py --profile)
    return op, f"cuda:{idx}", int(torch._C._cuda_getCurrentRawStream(idx))


def workspace_identities(op: str) -> list[float]:
    """The SLOTS float identities of `op`'s workspace (its own slots', then 0 for the unused ones, never
    read): what each launch leaves in the float slots and keeps beside them."""
    fslots = WORKSPACE[op][0]
    assert len(fslots) <= SLOTS
    return [v for _, v in fslots] + [0.0] * (SLOTS - len(fslots))


def fresh_workspaces(op: str, device: torch.device, copies: tuple[int, ...] = ()) -> tuple[torch.Tensor, torch.Tensor]:
    """(float64 (*copies, 2 * SLOTS), int64 (*copies, SLOTS)): `op`'s workspace at its identities, each of
    `copies` of it (optwin.kernels.deferred keeps one a call). The float slots, then their identities
    (read-only: a finisher copies them back). Filled on the device, not copied from a host list: a first
    launch inside CUDA graph capture (a new stream) may not copy from pageable host memory."""
    assert len(WORKSPACE[op][1]) <= SLOTS
    idents = workspace_identities(op)
    f = torch.zeros((*copies, 2 * SLOTS), dtype=torch.float64, device=device)
    for k, v in enumerate(idents + idents):
        if v != 0.0:
            f[..., k].fill_(v)
    return f, torch.zeros((*copies, SLOTS), dtype=torch.int64, device=device)


def workspace(op: str, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(float64 slots, int64 slots) of `op` on `device` for the current stream, created once at
    their identities (fresh_workspaces); every sketch launch leaves them at their identities again."""
    key = _stream_key(op, device)
    if key not in _WS:
        _WS[key] = fresh_workspaces(op, device)
    return _WS[key]


def _identity_slots(op: str, device: torch.device) -> torch.Tensor:
    """What a workspace's float64 slots hold between launches: its identities, twice (workspace's layout)."""
    return torch.tensor(workspace_identities(op) * 2, dtype=torch.float64, device=device)


def leftover_state() -> tuple[int, int, int, int]:
    """(record words not at the sentinel, of all; workspace slots off their identities, of all) over every
    row-record buffer and workspace made in this process. Completed launches leave both at 0: a finisher
    writes the sentinel back to every word it read, the last program the identities to every slot. A bench
    probe that skips the finisher's reads leaves them set, and every later launch's finisher then takes
    those stale words without waiting for its own rows (bench/RESULTS.md, stop 36). One device sync."""
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    words = sum(int((w != SENTINEL).sum()) for w, _ in _RECORDS.values())
    n_words = sum(w.numel() for w, _ in _RECORDS.values())
    slots = n_slots = 0
    for (op, _, _), (f, i) in _WS.items():
        slots += int((f != _identity_slots(op, f.device)).sum()) + int((i != 0).sum())
        n_slots += f.numel() + i.numel()
    return words, n_words, slots, n_slots


def reset_state() -> None:
    """Every row-record word back at the sentinel, every workspace at its identities (after a bench probe
    that left them set: leftover_state). Copies from the host: not inside CUDA graph capture."""
    for w, _ in _RECORDS.values():
        w.fill_(SENTINEL)
    for (op, _, _), (f, i) in _WS.items():
        f.copy_(_identity_slots(op, f.device))
        i.zero_()


def _capacity(n: int) -> int:
    """The next power of two >= n, at least 1: what the grown buffers hold (_common.next_pow2 gives 0 for 0,
    and _common imports this module)."""
    return max(1, 1 << max(n - 1, 0).bit_length())


def row_records(op: str, device: torch.device, n_rows: int, words: int = 1,
                extra: int = 2) -> tuple[torch.Tensor, torch.Tensor]:
    """(int64 (>= n_rows * words,) record words, all SENTINEL, a row's `words` side by side; int64
    (>= n_rows, extra) extra records) of `op` on `device` for the current stream; grown to the next
    power of two of rows when a launch has more rows (filled on the device, as `workspace`). Every
    launch leaves the words it used at the sentinel."""
    key = _stream_key(op, device)
    rec = _RECORDS.get(key)
    if rec is None or rec[1].shape[0] < n_rows:
        cap = _capacity(n_rows)
        rec = (torch.full((cap * words,), SENTINEL, dtype=torch.int64, device=device),
               torch.zeros((cap, extra), dtype=torch.int64, device=device))
        _RECORDS[key] = rec
    return rec


def scratch(name: str, device: torch.device, numel: int) -> torch.Tensor:
    """A float32 buffer of >= numel elements that the launches of `name` on `device` and the current
    stream share (one at a time: launches on one stream do not overlap), grown to the next power of two.
    For per-program scratch that a launch writes before it reads; nothing is kept between launches. A
    buffer outgrown stays allocated: a CUDA graph may have captured a launch that writes it."""
    key = _stream_key(name, device)
    buf = _SCRATCH.get(key)
    if buf is None or buf.numel() < numel:
        if buf is not None:
            _OUTGROWN.append(buf)
        buf = torch.empty(_capacity(numel), dtype=torch.float32, device=device)
        _SCRATCH[key] = buf
    return buf


def reduce_sketch(
    op: str, buffer: torch.Tensor, shape: Sequence[int] | None = None, params: dict[str, Any] | None = None
) -> tuple[tuple[str, ...], torch.Tensor]:
    """(feature names in optwin.ingest's order, the float64 feature tensor on the device).

    The kernel already reduced everything: this checks the buffer and returns it (no sync). A deferred
    call's buffer (optwin.kernels.deferred) has its page's finisher queued first.
    `shape` and `params` are accepted for callers of the older two-step API and not needed.
    """
    from optwin.kernels import deferred  # it imports this module

    names = feature_names(op)
    if tuple(buffer.shape) != (len(names),) or buffer.dtype != torch.float64:
        raise InputError(f"{op}: sketch buffer has shape {tuple(buffer.shape)} {buffer.dtype}, expected ({len(names)},) float64")
    deferred.settle(buffer)
    return names, buffer


def read_sketch(
    op: str, buffer: torch.Tensor, shape: Sequence[int] | None = None, params: dict[str, Any] | None = None
) -> dict[str, float]:
    """The sketch as {feature: float} (same keys as optwin.ingest.sketch); one host sync."""
    names, values = reduce_sketch(op, buffer, shape, params)
    return dict(zip(names, values.tolist()))
