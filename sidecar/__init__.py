"""effect-sidecar: lets long-running AI agents crash and resume without repeating side effects."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"
__all__ = ["SidecarError", "Store", "__version__", "create_store"]

if TYPE_CHECKING:
    from sidecar.errors import SidecarError
    from sidecar.store import Store, create_store

# Imported on first use: `sidecar exec` and the other light verbs must not pay for the
# store (and everything it imports) at every start.
_LAZY = {
    "SidecarError": "sidecar.errors",
    "Store": "sidecar.store",
    "create_store": "sidecar.store",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'sidecar' has no attribute {name!r}")
