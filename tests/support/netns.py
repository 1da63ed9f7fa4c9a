"""A pod's network, for transparent-mode tests: a network namespace wired to the host.

    with PodNetwork.create() as pod:        # netns "esc-pod-XXXX", veth to the root netns
        pod.write_hosts({"api.github.com": pod.host_ip})
        child = Child(pod.argv([...], uid=1337))  # a process inside the pod, as uid 1337
        pod.run(["iptables", "-t", "nat", "-S"])

The pod namespace has loopback and one veth (``pod_ip``, and ``pod_ip6`` unless IPv6 is
disabled) whose peer (``host_ip``, ``host_ip6``) lives in the root namespace, with a
default route through it: a process in the root namespace
listening on ``host_ip`` plays "the internet" for the pod, and the test can still talk to
it directly. ``ip netns exec`` bind-mounts ``/etc/netns/NAME/hosts`` over ``/etc/hosts``,
which is how the pod resolves public names to that address. Everything is deleted on
exit, also when the block fails; the namespace names are random, so parallel runs and
leftovers of a killed run do not collide.

:func:`unavailable` says precisely why this machine cannot run such a test (not root, a
missing tool, namespaces refused), or returns None.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import subprocess
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

TOOLS = ("ip", "setpriv", "iptables", "iptables-restore")
NETNS_ETC = Path("/etc/netns")


def unavailable() -> str | None:
    """Why a network-namespace test cannot run here, or None if it can."""
    if sys.platform != "linux":
        return f"network namespaces need Linux, this is {sys.platform}"
    if os.geteuid() != 0:
        return "network namespaces and iptables need root (CAP_NET_ADMIN, CAP_SYS_ADMIN)"
    missing = [tool for tool in TOOLS if shutil.which(tool) is None]
    if missing:
        apt = "apt-get install iproute2 util-linux iptables"
        return f"missing {', '.join(missing)} (Debian: {apt})"
    name = f"esc-probe-{secrets.token_hex(3)}"
    made = _run(["ip", "netns", "add", name])
    if made.returncode != 0:
        return f"cannot create a network namespace: {made.stderr.strip()}"
    try:
        listed = _run(["ip", "netns", "exec", name, "iptables", "-w", "-t", "nat", "-S"])
        if listed.returncode != 0:
            return f"iptables nat table unusable in a namespace: {listed.stderr.strip()}"
    finally:
        _run(["ip", "netns", "del", name])
    return None


def _run(
    argv: Sequence[str], env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    # Fixed tools (ip, iptables, this interpreter) with arguments the callers build.
    return subprocess.run(list(argv), capture_output=True, text=True, check=False, env=env)


def _must(argv: Sequence[str]) -> str:
    done = _run(argv)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({done.returncode}): {done.stderr.strip()}")
    return done.stdout


@dataclass
class PodNetwork:
    name: str
    host_if: str
    host_ip: str
    pod_ip: str
    host_ip6: str = ""  # empty when IPv6 is disabled here
    pod_ip6: str = ""

    @classmethod
    @contextlib.contextmanager
    def create(cls) -> Iterator[PodNetwork]:
        """A pod namespace with a veth to the root namespace; deleted on exit."""
        suffix = secrets.token_hex(3)
        subnet = 64 + secrets.randbelow(128)  # 10.231.N.0/30, away from common ranges
        pod = cls(
            name=f"esc-pod-{suffix}",
            host_if=f"esc-h-{suffix}",
            host_ip=f"10.231.{subnet}.1",
            pod_ip=f"10.231.{subnet}.2",
            host_ip6=f"fd00:231:{subnet:x}::1",
            pod_ip6=f"fd00:231:{subnet:x}::2",
        )
        try:
            pod._build()
            yield pod
        finally:
            pod.delete()

    def _build(self) -> None:
        peer = f"esc-p-{self.name[-6:]}"
        _must(["ip", "netns", "add", self.name])
        _must(["ip", "link", "add", self.host_if, "type", "veth", "peer", "name", peer])
        _must(["ip", "link", "set", peer, "netns", self.name])
        _must(["ip", "addr", "add", f"{self.host_ip}/30", "dev", self.host_if])
        _must(["ip", "link", "set", self.host_if, "up"])
        inside = ["ip", "netns", "exec", self.name]
        _must([*inside, "ip", "link", "set", "lo", "up"])
        _must([*inside, "ip", "addr", "add", f"{self.pod_ip}/30", "dev", peer])
        _must([*inside, "ip", "link", "set", peer, "up"])
        _must([*inside, "ip", "route", "add", "default", "via", self.host_ip])
        six = [
            ["ip", "addr", "add", f"{self.host_ip6}/64", "dev", self.host_if, "nodad"],
            [*inside, "ip", "addr", "add", f"{self.pod_ip6}/64", "dev", peer, "nodad"],
        ]
        if any(_run(argv).returncode != 0 for argv in six):
            self.host_ip6 = self.pod_ip6 = ""  # IPv6 disabled: IPv4 only

    def delete(self) -> None:
        """Remove the namespace, the veth and the hosts file; safe to call twice."""
        _run(["ip", "link", "del", self.host_if])  # takes its peer with it
        _run(["ip", "netns", "del", self.name])
        shutil.rmtree(NETNS_ETC / self.name, ignore_errors=True)
        with contextlib.suppress(OSError):
            NETNS_ETC.rmdir()  # only if empty, i.e. if nobody else uses it

    def write_hosts(self, names: Mapping[str, str]) -> None:
        """The pod's /etc/hosts: localhost plus ``name -> address``."""
        folder = NETNS_ETC / self.name
        folder.mkdir(parents=True, exist_ok=True)
        lines = ["127.0.0.1 localhost", "::1 localhost"]
        lines += [f"{address} {name}" for name, address in names.items()]
        (folder / "hosts").write_text("\n".join(lines) + "\n")

    def argv(self, argv: Sequence[str], *, uid: int | None = None) -> list[str]:
        """``argv`` run inside the pod, as ``uid`` (same gid, no supplementary groups)."""
        prefix = ["ip", "netns", "exec", self.name]
        if uid is not None:
            prefix += ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups"]
            prefix += [*_reach(), "--"]
        return [*prefix, *argv]

    def run(
        self, argv: Sequence[str], *, uid: int | None = None, env: Mapping[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` in the pod to completion (check it yourself)."""
        return _run(self.argv(argv, uid=uid), env)

    def counters(self, table: str, chain: str) -> list[tuple[int, str]]:
        """``(packets, rule text)`` for each rule of ``chain``, from ``iptables -L -v -x``."""
        listing = _must(self.argv(["iptables", "-w", "-t", table, "-L", chain, "-v", "-n", "-x"]))
        rows: list[tuple[int, str]] = []
        for line in listing.splitlines()[2:]:
            fields = line.split(maxsplit=2)
            if len(fields) == 3 and fields[0].isdigit():
                rows.append((int(fields[0]), fields[2]))
        return rows


def _reach() -> list[str]:
    """setpriv flags letting an unprivileged uid run this interpreter where it lives.

    A development interpreter often sits under a private home (``/root/.pyenv``, mode
    0700 on ``/root``): then the uid gets ``CAP_DAC_READ_SEARCH`` as an ambient
    capability, which only lifts file read and directory search checks. The uid, and so
    the redirect's owner match, is unchanged; in a real image the interpreter is public
    and nothing is added.
    """
    here = Path(os.path.realpath(sys.executable)).parent
    private = [d for d in (here, *here.parents) if not os.stat(d).st_mode & 0o001]
    if not private:
        return []
    return ["--inh-caps=+dac_read_search", "--ambient-caps=+dac_read_search"]


def sidecar_argv(verb: str, *args: str) -> list[str]:
    """``python -m sidecar VERB ARGS`` with this interpreter."""
    return [sys.executable, "-m", "sidecar", verb, *args]
