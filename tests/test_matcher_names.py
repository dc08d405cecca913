"""Matcher: op, variant and dtype that are not strings get a one-line CatalogError naming the field.

    python -m pytest -q tests/test_matcher_names.py
"""

from __future__ import annotations

import pytest

from optwin.errors import CatalogError

GOOD = ("rmsnorm", "native-dtype", "float16")
SKETCH = {"numel": 256.0, "rows": 4.0, "absmax": 4.0, "rms": 1.0, "nonfinite": 0.0, "hidden": 64.0,
          "max_row_rms": 1.0, "weight_absmax": 1.0}


@pytest.mark.parametrize("bad,kind", [(["rmsnorm"], "list"), ({"a": 1}, "dict"), (None, "NoneType"), (3, "int"),
                                      (b"rmsnorm", "bytes")])
@pytest.mark.parametrize("field", [0, 1, 2], ids=["op", "variant", "dtype"])
def test_names_that_are_not_strings_are_catalog_errors(m, field, bad, kind):
    # A JSON record's "op": [...] reached the index lookup as a list: a bare TypeError (unhashable type: 'list').
    names = list(GOOD)
    names[field] = bad
    what = ("op", "variant", "dtype")[field]
    for call in (lambda: m.assess(*names, sketch=SKETCH), lambda: m.stream("s", *names), lambda: m.triple_index(*names)):
        with pytest.raises(CatalogError) as e:
            call()
        assert str(e.value) == f"{what} must be a string, got {kind}"
    assert m.assess(*GOOD, sketch=SKETCH).probability  # the good names still answer


def test_unknown_string_names_keep_their_catalog_message(m):
    with pytest.raises(CatalogError, match="unknown operator 'RMSNorm'; expected one of"):
        m.assess("RMSNorm", "native-dtype", "float16", sketch=SKETCH)
    with pytest.raises(CatalogError, match="unknown variant 'nope'"):
        m.assess("rmsnorm", "nope", "float16", sketch=SKETCH)
