"""aiohttp imported by ``sidecar serve`` and ``sidecar exec`` without its TLS contexts'
trusted roots loaded on the start-up's path.

Importing ``aiohttp.connector`` builds two TLS client contexts, and each loads every
trusted root of the system: OpenSSL parses the whole CA bundle, about 20 ms and 0.8 MiB
each on a 2-core VM.  One is for verified connections (``ssl=True``: what the upstream
session and the notifier use); the other is for ``ssl=False``, whose ``CERT_NONE``
never looks at a root.  Together that was about 6% of the sidecar's start-up.

:func:`import_aiohttp` imports it with those loads held back, then loads the roots of
each context that verifies on a thread of its own: OpenSSL parses without the GIL, so
the load overlaps the rest of the imports.  A context that verifies nothing is left
without roots.  :func:`wait_for_roots` returns once the load is done; the server calls it
before it makes any connection, and so does ``exec`` before its first call to the
control API: no connection is ever checked against a context whose roots are still
loading (such a check would fail closed, never pass).

Only the process that calls :func:`import_aiohttp` before anything imports aiohttp is
changed; in any other (tests that run a sidecar or a worker in their own process, the
other verbs) aiohttp loads its roots as it always does.
"""

from __future__ import annotations

import importlib
import ssl
import sys
import threading
from collections.abc import Callable

type _Load = Callable[[ssl.SSLContext], None]


class _Loading:
    #: The thread loading the held-back roots, until :func:`wait_for_roots` joined it.
    thread: threading.Thread | None = None
    #: What the load raised, raised again by :func:`wait_for_roots`.
    failure: BaseException | None = None


def import_aiohttp() -> None:
    """Import aiohttp, the trusted roots of its verifying contexts loaded on a thread.
    Nothing happens if aiohttp is imported already."""
    if "aiohttp" in sys.modules or _Loading.thread is not None:
        return
    held: list[ssl.SSLContext] = []

    def hold(context: ssl.SSLContext) -> None:
        held.append(context)

    load: _Load = ssl.SSLContext.set_default_verify_paths
    # What ``ssl.create_default_context`` and aiohttp's own context call to load the
    # system's roots; only the main thread runs while the sidecar's start-up imports.
    ssl.SSLContext.set_default_verify_paths = hold  # type: ignore[method-assign,assignment]
    try:
        importlib.import_module("aiohttp")
    finally:
        ssl.SSLContext.set_default_verify_paths = load  # type: ignore[method-assign,assignment]
    verifying = [context for context in held if context.verify_mode != ssl.CERT_NONE]
    _Loading.thread = threading.Thread(
        target=_load_roots, args=(load, verifying), name="tls-roots", daemon=True
    )
    _Loading.thread.start()


def wait_for_roots() -> None:
    """Return once the roots :func:`import_aiohttp` held back are loaded (at once if none
    were); raise what loading them raised."""
    thread, _Loading.thread = _Loading.thread, None
    if thread is not None:
        thread.join()
    failure, _Loading.failure = _Loading.failure, None
    if failure is not None:
        raise failure


def _load_roots(load: _Load, contexts: list[ssl.SSLContext]) -> None:
    try:
        for context in contexts:
            load(context)
    except BaseException as error:  # handed to the thread that waits
        _Loading.failure = error
