"""HookDispatch: the sidecar's addons as one entry of mitmproxy's chain, each addon's hook
called in order, each failure on its own, as mitmproxy's chain calls them."""

from __future__ import annotations

import asyncio
import inspect
import logging
import subprocess
import sys

import pytest
from mitmproxy import exceptions, hooks, options
from mitmproxy.hooks import ConfigureHook
from mitmproxy.master import Master
from mitmproxy.proxy.layers.http import HttpRequestHeadersHook, HttpRequestHook
from mitmproxy.test import tflow

from sidecar.proxy.dispatch import HookDispatch


class Recording:
    def __init__(self, name: str, calls: list[str]) -> None:
        self.label = name
        self.calls = calls


class Headers(Recording):
    def requestheaders(self, flow: object) -> None:
        self.calls.append(f"{self.label}.requestheaders")


class AsyncHeaders(Recording):
    async def requestheaders(self, flow: object) -> None:
        self.calls.append(f"{self.label}.requestheaders:start")
        await _yield()
        self.calls.append(f"{self.label}.requestheaders:end")


class MaybeAsyncRequest(Recording):
    """A plain hook that hands back a coroutine for some flows only."""

    def request(self, flow: object) -> object:
        self.calls.append(f"{self.label}.request")
        return self._later()

    async def _later(self) -> None:
        await _yield()
        self.calls.append(f"{self.label}.request:awaited")


class Failing(Recording):
    def requestheaders(self, flow: object) -> None:
        self.calls.append(f"{self.label}.requestheaders")
        raise RuntimeError("a bug")


class Halting(Recording):
    def requestheaders(self, flow: object) -> None:
        self.calls.append(f"{self.label}.requestheaders")
        raise exceptions.AddonHalt()


async def _yield() -> None:
    await asyncio.sleep(0)


async def fire(master: Master, hook: hooks.Hook) -> None:
    await master.addons.handle_lifecycle(hook)


def master_with(*addons: object) -> Master:
    master = Master(options.Options())
    master.addons.add(HookDispatch(*addons))
    return master


async def test_each_addon_hook_runs_in_order_and_only_hooks_some_addon_has_exist():
    calls: list[str] = []
    dispatch = HookDispatch(Headers("a", calls), Recording("none", calls), Headers("b", calls))
    assert hasattr(dispatch, "requestheaders")
    assert not hasattr(dispatch, "response")
    assert not inspect.iscoroutinefunction(dispatch.requestheaders)

    await fire(master_with(*dispatch.dispatched), HttpRequestHeadersHook(tflow.tflow()))
    assert calls == ["a.requestheaders", "b.requestheaders"]


async def test_an_async_hook_ends_before_the_next_addon_runs():
    calls: list[str] = []
    master = master_with(AsyncHeaders("a", calls), Headers("b", calls))
    assert inspect.iscoroutinefunction(master.addons.get("sidecar").requestheaders)

    await fire(master, HttpRequestHeadersHook(tflow.tflow()))
    assert calls == ["a.requestheaders:start", "a.requestheaders:end", "b.requestheaders"]


async def test_a_plain_hook_that_returns_a_coroutine_is_awaited_before_the_next():
    calls: list[str] = []
    second = MaybeAsyncRequest("b", calls)
    master = master_with(MaybeAsyncRequest("a", calls), second)

    await fire(master, HttpRequestHook(tflow.tflow()))
    assert calls == ["a.request", "a.request:awaited", "b.request", "b.request:awaited"]


async def test_an_addon_that_raises_is_logged_and_the_next_still_runs(caplog):
    calls: list[str] = []
    master = master_with(Failing("a", calls), AsyncHeaders("b", calls), Failing("c", calls))

    with caplog.at_level(logging.ERROR, logger="sidecar.proxy"):
        await fire(master, HttpRequestHeadersHook(tflow.tflow()))

    assert calls == [
        "a.requestheaders",
        "b.requestheaders:start",
        "b.requestheaders:end",
        "c.requestheaders",
    ]
    failures = [r for r in caplog.records if "failed on requestheaders" in r.getMessage()]
    assert [r.getMessage() for r in failures] == [
        "addon Failing failed on requestheaders",
        "addon Failing failed on requestheaders",
    ]
    assert all(r.exc_info and r.exc_info[0] is RuntimeError for r in failures)


async def test_addon_halt_stops_the_event_as_it_stops_mitmproxys_chain():
    calls: list[str] = []
    after = Headers("after", calls)
    master = Master(options.Options())
    master.addons.add(HookDispatch(Halting("a", calls), Headers("b", calls)), after)

    await fire(master, HttpRequestHeadersHook(tflow.tflow()))
    assert calls == ["a.requestheaders"]


async def test_hooks_mitmproxy_calls_synchronously_stay_plain_functions():
    seen: list[object] = []

    class Configured:
        def configure(self, updated: set[str]) -> None:
            seen.append(updated)

    master = Master(options.Options())
    master.addons.add(HookDispatch(Configured()))
    master.addons.trigger(ConfigureHook({"listen_port"}))
    assert seen == [{"listen_port"}]


@pytest.mark.parametrize("addon", ["binder", "effects", "gate", "router", "uncovered"])
def test_every_hook_of_the_sidecars_addons_is_dispatched(addon):
    module = __import__(f"sidecar.proxy.addons.{addon}", fromlist=["*"])
    with_hooks = {
        cls: set(vars(cls)) & hooks.all_hooks.keys()
        for cls in vars(module).values()
        if isinstance(cls, type) and cls.__module__ == module.__name__
    }
    with_hooks = {cls: names for cls, names in with_hooks.items() if names}
    assert with_hooks, f"no hook found in sidecar.proxy.addons.{addon}"
    for cls, names in with_hooks.items():
        dispatch = HookDispatch(object.__new__(cls))
        assert all(callable(getattr(dispatch, name, None)) for name in names), cls


def test_importing_the_dispatch_knows_every_hook_mitmproxy_has():
    """HookDispatch looks its addons' hooks up in mitmproxy's registry, which a hook joins
    when its module is imported: the dispatch module imports them all itself."""
    count = "from mitmproxy import hooks; {imports}; print(len(hooks.all_hooks))"
    alone = count.format(imports="import sidecar.proxy.dispatch")
    everything = count.format(
        imports="import mitmproxy.tools.main, mitmproxy.tools.dump, mitmproxy.proxy.server, "
        "mitmproxy.addons, mitmproxy.addonmanager, mitmproxy.log"
    )
    known = [
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
        for code in (alone, everything)
    ]
    assert known[0].stdout == known[1].stdout
    assert int(known[0].stdout) > 40
