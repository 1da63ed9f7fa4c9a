"""The sidecar's addons as one entry of mitmproxy's addon chain.

mitmproxy hands every hook event to every addon of its chain, each time through a
coroutine, two generators and a context manager, whether the addon has that hook or
not: ~3 µs per addon and event on a 2-core VM, and a flow makes eight events (four
lifecycle hooks, each followed by ``update``).  With the sidecar's six addons as six
entries that was ~0.15 ms of every flow's CPU.  :class:`HookDispatch` is one entry: it
has exactly the hooks its addons have, and each calls those addons' hooks in order.

Each call runs in its own ``try``, as mitmproxy runs each addon: an addon that raises is
logged and the next one still runs (the effect addon must see every request, whatever
the binder before it did), and ``AddonHalt`` or ``OptionsError`` stop the event as they
stop mitmproxy's chain.  A hook that returns an awaitable is awaited before the next
addon's runs; a dispatched hook is a coroutine function when one of its addons' is, so
mitmproxy calls it where it calls async hooks.  The addons are not registered with
mitmproxy one by one: none of them has mitmproxy commands or a name others look up.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

# Imported for their hooks: a hook is known (``hooks.all_hooks``) once its module is.
import mitmproxy.addonmanager
import mitmproxy.addons
import mitmproxy.log
import mitmproxy.proxy.server  # noqa: F401
from mitmproxy import exceptions, hooks

log = logging.getLogger("sidecar.proxy")

type Hook = Callable[..., Any]
#: What stops an event rather than being logged (as in mitmproxy's ``safecall``).
_STOPS = (exceptions.AddonHalt, exceptions.OptionsError)


class HookDispatch:
    """One addon standing for ``addons``: it has each hook one of them has."""

    def __init__(self, *addons: object, name: str = "sidecar") -> None:
        self.name = name
        self.dispatched = addons
        for event in sorted(hooks.all_hooks):
            found = [(a, h) for a in addons if callable(h := getattr(a, event, None))]
            if found:
                setattr(self, event, _dispatcher(event, found))


def _dispatcher(event: str, found: Sequence[tuple[object, Hook]]) -> Hook:
    def call_from(start: int, args: tuple[Any, ...]) -> Awaitable[None] | None:
        """Call the hooks from ``start`` on; once one returns an awaitable, the rest is a
        coroutine that awaits it first (a hook runs only after the one before ended)."""
        for index in range(start, len(found)):
            addon, hook = found[index]
            try:
                result = hook(*args)
            except _STOPS:
                raise
            except Exception:
                log.exception("addon %s failed on %s", type(addon).__name__, event)
                continue
            if result is not None and inspect.isawaitable(result):
                return finish(index, result, args)
        return None

    async def finish(index: int, pending: Awaitable[Any], args: tuple[Any, ...]) -> None:
        try:
            await pending
        except _STOPS:
            raise
        except Exception:
            log.exception("addon %s failed on %s", type(found[index][0]).__name__, event)
        rest = call_from(index + 1, args)
        if rest is not None:
            await rest

    if any(inspect.iscoroutinefunction(hook) for _, hook in found):
        # A coroutine function itself, so that mitmproxy calls it where async hooks go.
        async def dispatch_async(*args: Any) -> None:
            rest = call_from(0, args)
            if rest is not None:
                await rest

        return dispatch_async

    def dispatch(*args: Any) -> Awaitable[None] | None:
        return call_from(0, args)

    return dispatch
