"""Where tasks, leases, checkpoints and the effect log are kept.

``create_store(url)`` picks the backend by URL scheme:

* ``sqlite:///path/effects.db`` — embedded, durable, one host (:mod:`.sqlite`);
* ``postgresql://user@host:port/db`` — shared by many sidecars on many nodes
  (:mod:`.postgres`);
* ``memory://`` — in-process, for unit tests (:mod:`.memory`).
"""

from __future__ import annotations

from collections.abc import Callable

from sidecar.domain.ids import new_attempt_id
from sidecar.errors import ConfigError
from sidecar.runtime.clock import Clock
from sidecar.store.base import Store, StoreInfo, WriteObserver
from sidecar.store.memory import MemoryStore
from sidecar.store.sqlite import SQLiteStore

__all__ = ["Store", "StoreInfo", "WriteObserver", "create_store"]


def create_store(
    url: str,
    *,
    clock: Clock | None = None,
    new_attempt_id: Callable[[], str] = new_attempt_id,
    read_only: bool = False,
) -> Store:
    """An unopened store for ``url``; ``await store.open()`` (or ``async with``) before use.

    ``read_only`` opens an existing store for inspection without migrating or writing it.
    """
    scheme = url.split(":", 1)[0].lower()
    if scheme == "sqlite":
        return SQLiteStore(url, clock=clock, new_attempt_id=new_attempt_id, read_only=read_only)
    if scheme == "memory":
        return MemoryStore(url, clock=clock, new_attempt_id=new_attempt_id)
    if scheme in {"postgres", "postgresql"}:
        # Imported here: the SQLite-only CLI verbs need not load the PostgreSQL driver.
        from sidecar.store.postgres import PostgresStore  # noqa: PLC0415

        return PostgresStore(url, clock=clock, new_attempt_id=new_attempt_id, read_only=read_only)
    raise ConfigError(
        f"unknown store URL scheme {scheme!r} in {url!r}; "
        "use sqlite:///PATH or postgresql://USER@HOST:PORT/DATABASE"
    )
