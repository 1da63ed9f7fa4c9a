"""effect-sidecar: lets long-running AI agents crash and resume without repeating side effects."""

from sidecar.errors import SidecarError
from sidecar.store import Store, create_store

__version__ = "0.1.0"
__all__ = ["SidecarError", "Store", "__version__", "create_store"]
