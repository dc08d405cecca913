"""Every sidecar address the README shows is one the monitor accepts.

    python -m pytest -q tests/test_readme_sidecar_url.py

The README showed sidecar="http://127.0.0.1:8765"; the monitor refuses it (ListenError: addresses are
tcp://HOST:PORT or unix:///PATH, ../shared/spec/api.md), so the example failed as written.
"""

from __future__ import annotations

import os
import re

import optwin.monitor as om
from optwin.fingerprints.sidecar import parse_listen

README = os.path.join(os.path.dirname(__file__), os.pardir, "README.md")


def test_readme_sidecar_addresses_are_accepted():
    with open(README, encoding="utf-8") as f:
        urls = re.findall(r'sidecar="([^"]+)"', f.read())
    assert urls  # the README shows at least one
    for url in urls:
        parse_listen(url)  # ListenError otherwise
        om.monitor(None, sidecar=url).client.close()  # the monitor takes it (nothing needs to listen)
