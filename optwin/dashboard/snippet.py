"""The copyable Python snippet that reproduces one stored case with `optwin.twin.run`.

    python -c "from optwin.dashboard.snippet import reproduce_snippet; print(reproduce_snippet({'op': 'rmsnorm', 'variant': 'native-dtype', 'dtype': 'float16', 'source': 'default', 'family': 'normal', 'seed': 0, 'case_index': 3, 'replays': 16, 'noise': 'stochastic'}))"

Sweep cases are regenerated, not stored: the generators are deterministic in (op, dtype, seed, case
index) and case i does not depend on how many cases were asked for, so asking for `case_index + 1`
cases and taking the last one gives the build's case back. The replay is the build's own: the builder
(optwin.fingerprints.shards) seeds a case's noisy replays with `case_id % 2**31`, not the generator's
seed, and judges faults with the build's tolerances (its recorded flags), so the snippet passes both;
with any other seed or tolerances its fault counts are another sample than the stored ones.
"""

from __future__ import annotations

from typing import Any, Mapping

REPLAY_SEED_MOD = 2**31  # the builder's replay seed is case_id % 2**31 (shards._case_row)


def generator_of(source: str | None, family: str | None) -> str | None:
    """The optwin.ingest generator that made a case, or None for profile cases."""
    if source not in ("sweep", "default"):
        return None
    # boundary_sweep tags its families "boundary:<family>"
    return "boundary_sweep" if (family or "").startswith("boundary:") else "default_sweep"


def params_json(text: Any) -> str:
    """The case's stored params column (JSON text), or "{}" when the row has none."""
    return text if isinstance(text, str) and text.strip() else "{}"


def reproduce_snippet(case: dict[str, Any], flags: Mapping[str, Any] | None = None) -> str:
    """Python source that regenerates the case's inputs and replays it through the twin as the build did.

    `flags`: the build's recorded flags (builds.flags as a dict); their "tolerances" are passed to twin.run.
    Without them (older builds did not record them) the snippet says it uses the defaults."""
    op, variant, dtype = case["op"], case["variant"], case["dtype"]
    seed, index = int(case.get("seed") or 0), int(case.get("case_index") or 0)
    case_id = case.get("case_id")
    replay_seed = int(case_id) % REPLAY_SEED_MOD if case_id is not None else 0
    tol = (flags or {}).get("tolerances")
    replays = int(case.get("replays") or 0)
    noise = case.get("noise") or ("stochastic" if replays else "none")
    gen = generator_of(case.get("source"), case.get("family"))
    head = [
        f"# case {case.get('case_id')} of build {case.get('build_id')}: {op}/{variant}/{dtype}, "
        f"source {case.get('source')}, family {case.get('family')}, region {case.get('region')}",
        "from optwin import twin",
    ]
    if gen is not None:
        head += [
            f"from optwin.ingest import {gen}",
            "",
            f"case = {gen}({op!r}, {dtype!r}, {index + 1}, {seed})[{index}]  # n_cases = case_index + 1",
            "inputs, params = case.inputs, case.params",
        ]
    else:
        head += [
            "",
            f"# this case came from a captured profile (source {case.get('source')!r}, shard {case.get('shard')!r}):",
            "# load its tensors from that profile; the sketch it matched is",
            f"# {case.get('sketch')}",
            "inputs = ...",
            # the stored params (causal attention, a model's rope base ...) are part of the case: the
            # defaults would replay another computation. JSON text, so json.loads gives them back exactly.
            "import json",
            f"params = json.loads({params_json(case.get('params'))!r})  # the case's stored params",
        ]
    if isinstance(tol, Mapping) and tol:
        head.append(f"tolerances = {dict(sorted(tol.items()))!r}  # the build's (its flags)")
    else:
        head.append("tolerances = None  # the build recorded none: the defaults")
    head += [
        f"res = twin.run({op!r}, {variant!r}, {dtype!r}, inputs=inputs, params=params,",
        f"               noise={noise!r}, replays={replays}, tolerances=tolerances,",
        f"               seed={replay_seed})  # the build's replay seed: case_id % 2**31",
        "print(res.faults, res.probability, res.rel_error)",
    ]
    return "\n".join(head) + "\n"
