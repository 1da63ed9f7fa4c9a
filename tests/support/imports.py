"""What a fresh interpreter loads: for the tests that keep a command's start-up cheap."""

from __future__ import annotations

import subprocess
import sys


def loaded_after_importing(module: str) -> set[str]:
    """The sidecar modules a fresh interpreter holds after importing ``module``."""
    code = f"import sys, {module}; print(*(m for m in sys.modules if m.startswith('sidecar')))"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    return set(out.split())
