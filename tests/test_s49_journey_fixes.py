"""Fixes from a user-journey review: a capture of the user's own model factory, build's --out in a missing
directory, and the mode of a profile's tensors file.

    python -m pytest -q tests/test_s49_journey_fixes.py
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

# The `optwin` console script beside this interpreter: what a user runs, whose sys.path[0] is the bin directory
# (under `python -m optwin` it would be the current directory, which hid finding 1a).
OPTWIN = str(Path(sys.executable).parent / "optwin")

LLAMA_FACTORY = """
import torch
from transformers import LlamaConfig, LlamaForCausalLM
def llama():
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(vocab_size={vocab}, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                        num_attention_heads=4, num_key_value_heads=4))
"""


def _run_optwin(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # as a user runs it: nothing on the path
    env["HF_HUB_OFFLINE"] = "1"
    return subprocess.run([OPTWIN, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


def test_capture_imports_a_factory_module_from_the_current_directory(tmp_path: Path) -> None:
    # vocab 1000: the hashed token ids fit, so this checks the import alone
    (tmp_path / "journey_models_cwd.py").write_text(LLAMA_FACTORY.format(vocab=1000))
    r = _run_optwin(["capture", "--model", "journey_models_cwd:llama", "--out", "p", "--max-texts", "2"], tmp_path)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "p" / "profile.json").is_file()


def test_a_factory_module_found_nowhere_names_pythonpath(tmp_path: Path) -> None:
    r = _run_optwin(["capture", "--model", "journey_no_such_module:llama", "--out", "p"], tmp_path)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "No module named 'journey_no_such_module'" in lines[0], r.stderr
    assert "PYTHONPATH" in lines[0], r.stderr


def test_capture_feeds_a_factory_model_without_tokenizer_ids_within_its_vocabulary(tmp_path: Path) -> None:
    # vocab 300 < the 1000 that hashed token ids used to assume: the embedding raised IndexError on batch 0
    (tmp_path / "journey_models_vocab.py").write_text(LLAMA_FACTORY.format(vocab=300))
    r = _run_optwin(["capture", "--model", "journey_models_vocab:llama", "--out", "p", "--max-texts", "8"], tmp_path)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "p" / "profile.json").is_file()


def test_hashed_token_ids_take_the_vocabulary_from_the_module() -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    from optwin.ingest.models import LoadedModel, default_texts

    model = LlamaForCausalLM(LlamaConfig(vocab_size=50, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=2))
    ids = [b["input_ids"] for b in LoadedModel("m", model).batches(default_texts(16), 8)]
    assert max(int(x.max()) for x in ids) < 50
    assert LoadedModel("m", model, vocab_size=20).token_vocab() == 20  # a vocab_size given still wins


def test_build_refuses_an_out_in_a_missing_directory_before_any_work(tmp_path: Path) -> None:
    # It used to make the directories and run the whole build into them. Called through build() (what the CLI
    # runs after its up-front checks): the refusal must come from check_inputs, before the lock or a shard.
    import pytest

    from optwin.errors import OptwinError
    from optwin.fingerprints.build import BuildConfig, build

    out = tmp_path / "missing" / "dir" / "fp.duckdb"
    with pytest.raises(OptwinError) as e:
        build(BuildConfig(out=str(out), ops=("geodesic",), cases=2, replays=1, workers=1),
              on_start=lambda total, done: pytest.fail("the build started"))
    assert str(e.value) == f"--out {out}: directory {out.parent} does not exist (create it first)"
    assert list(tmp_path.iterdir()) == []  # nothing made: no directory, lock or work directory


def test_optwin_build_into_a_missing_directory_is_one_error_line(tmp_path: Path) -> None:
    out = tmp_path / "missing" / "fp.duckdb"
    r = _run_optwin(["build", "--quick", "--ops", "geodesic", "--out", str(out)], tmp_path)
    assert r.returncode == 2 and r.stdout == "", (r.stdout, r.stderr)  # refused before the build's first line
    assert r.stderr == f"error: --out {out}: directory {out.parent} does not exist (create it first)\n"
    assert list(tmp_path.iterdir()) == []


def test_a_profiles_tensors_file_has_the_mode_of_its_other_files(tmp_path: Path) -> None:
    # safetensors wrote tensors.safetensors 0600 while profile.json got 0644: another user read the one, not the other
    import torch

    from optwin.ingest.capture import capture

    norm = torch.nn.RMSNorm(16)
    with torch.no_grad(), capture(norm, sample_rate=1.0, capacity=2, seed=1, ops=("rmsnorm",)) as rec:
        norm(torch.randn(4, 16))
    for umask, want in ((0o022, 0o644), (0o027, 0o640)):  # the umask's file mode, whichever it is
        old = os.umask(umask)
        try:
            prof = rec.write_profile(tmp_path / f"prof{umask:o}", model="tiny-rmsnorm")
        finally:
            os.umask(old)
        modes = {p.name: oct(p.stat().st_mode & 0o777) for p in prof.iterdir()}
        assert "tensors.safetensors" in modes and set(modes.values()) == {oct(want)}, modes
