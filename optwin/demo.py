"""`optwin demo`: the main job end to end on a fresh machine, in a few minutes on 2 CPU cores.

    optwin demo --workdir optwin-demo

1. A quick fingerprint build restricted to what the demo model uses (rmsnorm), written to
   WORKDIR/fingerprints.duckdb (reused when it is already there; --rebuild forces a new one).
2. A small real model: a Llama-style stack (token embedding, residual MLP blocks, final norm, LM head)
   in float16 whose norms are T5LayerNorm-style RMSNorm *without* upcast: every intermediate in
   float16, the catalog's `rmsnorm/native-dtype` variant. Its weights are seeded random.
3. The model serves batches while its activations drift: the embedding table is scaled up by a small
   factor every step, as a model whose residual stream slowly diverges; an identical copy that does
   not drift serves the same batches as a control (its warnings are false alarms). Both run under
   `optwin.monitor(model, db=..., policy="warn")` (every call checked, clock = simulated time
   t = step / rate), and each norm call's inputs are labelled by the twin (optwin.twin.run on the
   captured x and weight: the spec's fault definitions against the float64 reference).
4. Warnings are printed as they are raised; when a stream's first real fault comes, the line says
   how long before it the stream warned (the lead time). A summary table and the command that opens
   the dashboard on the database close the run.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

import typer

OP, VARIANT, DTYPE = "rmsnorm", "native-dtype", "float16"


@dataclass(frozen=True)
class DemoConfig:
    """Sizes of the demo; `fast()` is the shrunk preset the tests run."""

    hidden: int = 256
    layers: int = 2
    vocab: int = 512
    batch: int = 4
    seq: int = 16
    steps: int = 160
    growth: float = 1.04  # embedding scale factor per step: |x| x64 (4 -> 256, fp16 x*x overflow) in ~106 steps
    rate_hz: float = 20.0  # simulated serving rate: t = step / rate_hz
    seed: int = 0
    build_cases: int | None = None  # None: the builder's quick preset
    build_replays: int | None = None
    forecast: str = "default"

    @staticmethod
    def fast() -> "DemoConfig":
        return DemoConfig(hidden=64, layers=1, vocab=128, batch=2, seq=8, steps=140, build_cases=16, build_replays=8)


@dataclass
class StreamReport:
    name: str
    control: bool = False  # a call site of the non-drifting control copy: its warnings are false alarms
    calls: int = 0
    first_warn_t: float | None = None
    first_warn_step: int | None = None
    first_fault_t: float | None = None
    first_fault_step: int | None = None
    lead_s: float | None = None  # first fault - first warning (>= 0 when the warning came first)
    warned_calls: int = 0  # warning episodes the monitor raised
    faulting_calls: int = 0


@dataclass
class DemoResult:
    db: str
    build_id: str
    build_s: float
    run_s: float
    steps: int
    streams: list[StreamReport] = field(default_factory=list)

    @property
    def early_warnings(self) -> int:
        return sum(1 for s in self.streams if not s.control and s.lead_s is not None and s.lead_s > 0)

    @property
    def false_alarms(self) -> int:
        """Warning episodes on control streams that never faulted."""
        return sum(s.warned_calls for s in self.streams if s.control and s.first_fault_t is None)


# ----------------------------------------------------------------------------- the model


def _model_classes():
    """The demo model's classes (defined lazily so `import optwin.demo` stays torch-free for the CLI)."""
    import torch
    from torch import nn

    class DemoRMSNorm(nn.Module):
        """T5LayerNorm without the float32 upcast: every step in the input's dtype (rmsnorm/native-dtype)."""

        def __init__(self, hidden: int, eps: float = 1e-6) -> None:
            super().__init__()
            self.weight = nn.Parameter(torch.ones(hidden))
            self.eps = eps

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            v = (x * x).mean(-1, keepdim=True)  # (B, S, 1) in dtype: x*x overflows fp16 past 256
            return self.weight * (x * torch.rsqrt(v + self.eps))  # (B, S, H) in dtype

    class Block(nn.Module):
        def __init__(self, hidden: int) -> None:
            super().__init__()
            self.norm = DemoRMSNorm(hidden)
            self.up = nn.Linear(hidden, 2 * hidden, bias=False)
            self.down = nn.Linear(2 * hidden, hidden, bias=False)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x + self.down(torch.relu(self.up(self.norm(x))))  # (B, S, H) residual

    class DemoLM(nn.Module):
        """Embedding -> residual MLP blocks (pre-norm) -> final norm -> LM head."""

        def __init__(self, cfg: DemoConfig) -> None:
            super().__init__()
            self.embed = nn.Embedding(cfg.vocab, cfg.hidden)
            self.layers = nn.ModuleList(Block(cfg.hidden) for _ in range(cfg.layers))
            self.norm = DemoRMSNorm(cfg.hidden)
            self.head = nn.Linear(cfg.hidden, cfg.vocab, bias=False)

        def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
            h = self.embed(input_ids)  # (B, S, H)
            for layer in self.layers:
                h = layer(h)
            return self.head(self.norm(h))  # (B, S, V)

    return DemoRMSNorm, DemoLM


def make_model(cfg: DemoConfig):
    """The seeded demo model in float16 on the CPU, with small MLP weights (the residual stream is
    dominated by the embeddings, so their drift is what the norms see)."""
    import torch

    _, DemoLM = _model_classes()
    torch.manual_seed(cfg.seed)
    model = DemoLM(cfg)
    with torch.no_grad():
        model.embed.weight.normal_(0.0, 1.0)
        for layer in model.layers:
            layer.up.weight.normal_(0.0, 0.3 / math.sqrt(cfg.hidden))
            layer.down.weight.normal_(0.0, 0.3 / math.sqrt(2 * cfg.hidden))
    return model.to(torch.float16).eval()


def norm_modules(model) -> list[tuple[str, Any]]:
    DemoRMSNorm, _ = _model_classes()
    return [(n, m) for n, m in model.named_modules() if type(m).__name__ == DemoRMSNorm.__name__]


# ----------------------------------------------------------------------------- build


def quick_build(db: str, cfg: DemoConfig, rebuild: bool, echo: Callable[[str], None]) -> tuple[str, float]:
    """The builder's quick mode for rmsnorm only; an existing database is reused unless `rebuild`."""
    from optwin.fingerprints.build import BuildConfig, build

    t0 = time.perf_counter()
    if os.path.exists(db):
        bid = _existing_build(db, echo)
        if bid and not rebuild:
            echo(f"using the fingerprint database {db} (build {bid}); --rebuild makes a new one")
            return bid, 0.0
    echo(f"quick build of the {OP} fingerprints into {db} ...")
    res = build(BuildConfig(out=db, ops=(OP,), quick=True, cases=cfg.build_cases, replays=cfg.build_replays,
                            include_triton=False, seed=cfg.seed),
                on_shard=lambda s: None)
    echo(f"built {res.build_id}: {res.cases} cases, {res.replays} replays, {res.fingerprints} fingerprints "
         f"in {res.duration_s:.1f}s")
    return res.build_id, time.perf_counter() - t0


def _existing_build(db: str, echo: Callable[[str], None]) -> str | None:
    """The newest build in the demo's database (None: it holds none). One at another schema version (left by an
    older or newer optwin's demo) cannot be reused or extended, and `optwin migrate` is not the demo's to ask for:
    the demo's own file is rebuilt instead, the old one moved aside (its name is also `optwin build`'s default
    --out, so with --workdir . it may be a database of the user's own)."""
    from optwin.errors import SchemaVersionError
    from optwin.fingerprints.store import open_store

    try:
        with open_store(db, read_only=True) as store:
            return store.latest_build_id()
    except SchemaVersionError as e:
        kept = _unused_name(db + ".old")
        os.replace(db, kept)
        if os.path.exists(db + ".wal"):  # DuckDB's write-ahead log belongs to the file it was written for
            os.replace(db + ".wal", kept + ".wal")
        versions = re.search(r"schema version \d+, this optwin reads \d+", str(e))
        echo(f"{db} has {versions.group(0) if versions else 'another schema version'}: moved it to {kept}; "
             "building a new one")
        return None


def _unused_name(path: str) -> str:
    n, name = 0, path
    while os.path.lexists(name):
        n += 1
        name = f"{path}.{n}"
    return name


# ----------------------------------------------------------------------------- the watched run


def _fault_names(faults: dict[str, bool]) -> str:
    return ", ".join(k for k, v in faults.items() if v)


def run_watched(served, db: str, cfg: DemoConfig, echo: Callable[[str], None]) -> list[StreamReport]:
    """Serve `cfg.steps` batches to both models of `served` (nn.ModuleDict: "drift", whose embeddings
    grow every step, and "control", an identical copy that does not drift) under one optwin.monitor
    (warn policy, every call checked, simulated clock); each norm call is also labelled by the twin."""
    import torch

    import optwin
    from optwin import twin
    from optwin.fingerprints.forecast import ForecastConfig

    reports: dict[str, StreamReport] = {}
    clock = {"t": 0.0, "step": 0}

    def on_warning(w: dict[str, Any]) -> None:
        """Monitor callback: one event per warning episode of a stream ("<module path>:rmsnorm")."""
        name = str(w.get("stream", "")).rsplit(":", 1)[0]
        rep = reports.get(name)
        if rep is None:
            return
        rep.warned_calls += 1  # episodes, here: the monitor emits once per episode
        if rep.first_warn_t is not None:
            return
        t, step = float(w.get("t", clock["t"])), clock["step"]
        rep.first_warn_t, rep.first_warn_step = t, step
        probs = w.get("probability") or {}
        ft, p = max(probs.items(), key=lambda kv: kv[1]) if probs else ("-", 0.0)
        eta = w.get("eta_s")
        why = (f"p({ft}) = {p:.2f} on this call" if w.get("reason") == "risk" else
               "forecast: drifting into a fault region" + ("" if eta is None else f" in ~{eta:.1f}s"))
        kind = " (control: false alarm)" if rep.control else ""
        echo(f"t={t:6.2f}s step {step:4d}  WARNING{kind} {name}: {why} (input |x| max {clock['absmax'].get(name, 0):.1f})")

    def label_hook(name: str):
        def pre(mod, args):
            x = args[0].detach()
            inputs = {"x": x.reshape(-1, x.shape[-1]), "weight": mod.weight.detach()}  # (B*S, H), (H,)
            clock["absmax"][name] = float(x.abs().max())
            faults = twin.run(OP, VARIANT, DTYPE, inputs).faults  # the spec's labels, float64 reference
            rep = reports[name]
            rep.calls += 1
            if any(faults.values()):
                rep.faulting_calls += 1
                if rep.first_fault_t is None:
                    t, step = clock["t"], clock["step"]
                    rep.first_fault_t, rep.first_fault_step = t, step
                    if rep.first_warn_t is not None:
                        rep.lead_s = t - rep.first_warn_t
                        tail = f"warned {rep.lead_s:.2f}s earlier (step {rep.first_warn_step})"
                    else:
                        tail = "NOT warned before it"
                    echo(f"t={t:6.2f}s step {step:4d}  FAULT   {name}: {_fault_names(faults)} (twin-labelled); {tail}")
        return pre

    clock["absmax"] = {}
    handles = []
    for name, mod in norm_modules(served):
        reports[name] = StreamReport(name, control=name.startswith("control."))
        handles.append(mod.register_forward_pre_hook(label_hook(name)))
    g = torch.Generator().manual_seed(cfg.seed)
    mon = optwin.monitor(served, db=db, policy="warn", ops=(OP,), sampling="always", callbacks=[on_warning],
                         forecast=ForecastConfig.preset(cfg.forecast), clock=lambda: clock["t"])
    # The callback prints each warning once; keep logging's last-resort handler from repeating it.
    mon_log = logging.getLogger("optwin.monitor")
    quiet = logging.NullHandler()
    mon_log.addHandler(quiet)
    try:
        with mon, torch.no_grad():
            for step in range(cfg.steps):
                clock["t"], clock["step"] = step / cfg.rate_hz, step
                ids = torch.randint(0, cfg.vocab, (cfg.batch, cfg.seq), generator=g)  # (B, S)
                served["drift"](ids)
                served["control"](ids)
                served["drift"].embed.weight.mul_(cfg.growth)  # the drift: activations grow a few % per step
    finally:
        mon_log.removeHandler(quiet)
        for h in handles:
            h.remove()
    return list(reports.values())


def run_demo(workdir: str | os.PathLike[str], cfg: DemoConfig | None = None, rebuild: bool = False,
             echo: Callable[[str], None] = print) -> DemoResult:
    """The whole demo; returns what happened (also written to WORKDIR/demo_report.json)."""
    cfg = cfg or DemoConfig()
    Path(workdir).mkdir(parents=True, exist_ok=True)
    db = os.path.join(os.fspath(workdir), "fingerprints.duckdb")
    build_id, build_s = quick_build(db, cfg, rebuild, echo)
    from torch import nn

    served = nn.ModuleDict({"drift": make_model(cfg), "control": make_model(cfg)})
    names = [n for n, _ in norm_modules(served["drift"])]
    echo(f"serving a {cfg.layers}-layer float16 model (hidden {cfg.hidden}, {OP}/{VARIANT} norms: {', '.join(names)}) "
         f"for {cfg.steps} steps at {cfg.rate_hz:g} steps/s; its embeddings grow x{cfg.growth} per step, "
         f"an identical control copy does not drift")
    t0 = time.perf_counter()
    streams = run_watched(served, db, cfg, echo)
    result = DemoResult(db, build_id, build_s, time.perf_counter() - t0, cfg.steps, streams)
    with open(os.path.join(os.fspath(workdir), "demo_report.json"), "w") as f:
        json.dump({**asdict(result), "early_warnings": result.early_warnings, "false_alarms": result.false_alarms,
                   "config": asdict(cfg)}, f, indent=1)
    return result


def print_summary(result: DemoResult) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    t = Table(title="optwin demo: norm call sites under drift (simulated seconds)")
    for col in ("stream", "calls", "first warning", "first real fault", "lead", "warning episodes", "faulting calls"):
        t.add_column(col, justify="left" if col == "stream" else "right", no_wrap=col == "stream")
    f = lambda x: "-" if x is None else f"{x:.2f}s"  # noqa: E731
    for s in result.streams:
        t.add_row(s.name, str(s.calls), f(s.first_warn_t), f(s.first_fault_t), f(s.lead_s), str(s.warned_calls),
                  str(s.faulting_calls))
    console.print(t)
    drift = [s for s in result.streams if not s.control]
    console.print(f"{result.early_warnings} of {len(drift)} drifting streams warned before their first fault; "
                  f"{result.false_alarms} false alarms on {len(result.streams) - len(drift)} control streams "
                  f"(build {result.build_s:.0f}s, run {result.run_s:.1f}s)")
    typer.echo(f"explore the fingerprints: optwin dashboard --db {result.db}")  # one unwrapped line to copy


def check_workdir(workdir: Path) -> None:
    """Create --workdir (and what is missing above it) and make sure the demo can write in it, or raise one
    OptwinError line naming the option: the OSError alone (`[Errno 17] File exists: optwin-demo`) said neither
    which option was wrong nor why."""
    from optwin.errors import OptwinError
    from optwin.writable import check_writable_in

    if workdir.exists() and not workdir.is_dir():
        raise OptwinError(f"--workdir {workdir} exists and is not a directory: remove it or pass another --workdir")
    check_writable_in("--workdir", workdir, workdir)


def demo_command(
    workdir: Path = typer.Option(Path("optwin-demo"), "--workdir", help="where the database and the report go"),
    fast: bool = typer.Option(False, "--fast", help="a smaller model and build (tests, slow machines)"),
    rebuild: bool = typer.Option(False, "--rebuild", help="build the fingerprints even if WORKDIR has a database"),
    steps: Optional[int] = typer.Option(None, "--steps", min=10, help="serving steps (default 160; --fast 140)"),
) -> None:
    """The main job end to end: quick build, a model whose activations drift under watch, warnings as they come."""
    cfg = DemoConfig.fast() if fast else DemoConfig()
    if steps is not None:
        from dataclasses import replace

        cfg = replace(cfg, steps=steps)
    check_workdir(workdir)
    result = run_demo(workdir, cfg, rebuild, echo=lambda m: typer.echo(m))
    print_summary(result)
