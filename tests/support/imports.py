"""What a fresh interpreter loads: for the tests that keep a command's start-up cheap."""

from __future__ import annotations

import subprocess
import sys


def loaded_after_importing(module: str, among: str = "sidecar") -> set[str]:
    """The modules whose names start with ``among`` (the sidecar's, by default; "" for
    all) that a fresh interpreter holds after importing ``module``."""
    code = f"import sys, {module}; print(*(m for m in sys.modules if m.startswith({among!r})))"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    return set(out.split())
