"""patch() of something that is not a model: a one-line InputError naming what was passed.

    python -m pytest -q tests/test_patch_inputs.py
"""

from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported

import pytest  # noqa: E402
import torch  # noqa: E402

import optwin.kernels  # noqa: E402
from optwin.errors import InputError  # noqa: E402


@pytest.mark.parametrize("bad,named", [(None, "NoneType: None"), ("llama", "str: 'llama'"),
                                       (torch.randn(64, 64), "Tensor: tensor(")])
def test_patching_a_non_module_says_what_it_got(bad, named):
    """A model name or a tensor in place of the model failed as a bare AttributeError (no .modules()) from deep
    inside patch; the CLI prints OptwinError messages as one line."""
    with pytest.raises(InputError) as err:
        optwin.kernels.patch(bad)
    msg = str(err.value)
    assert "torch.nn.Module" in msg and named in msg and "\n" not in msg, msg
