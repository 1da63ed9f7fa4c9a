"""Creating an isolated agent's network namespace, and starting the agent inside it.

The namespace is anonymous: exec creates it in a thread of its own (``unshare`` and
``setns`` of a network namespace act on the calling thread only), keeps one file
descriptor to it and returns to the host's namespace. It lives as long as that
descriptor or a process inside it does - a SIGKILLed exec leaves nothing behind once its
agent ends, and nothing ever needs sweeping; concurrent execs never share a name, a
chain or a rule.

Inside: loopback, and a veth pair whose both ends stay inside (169.254.231.2 routes by
default via .1), because the kernel needs a route for a connection to, say,
``198.18.0.1:443`` to be attempted at all - the nat rules (:mod:`.rules`) then redirect
it before it leaves. Exec's listening sockets are created inside while the thread is
there: the sidecar's loopback ports mirrored at the same addresses (so
``HTTP_PROXY=http://...@127.0.0.1:7301`` and the control API work unchanged), a
transparent HTTP listener, a PostgreSQL one and a DNS one; exec serves them from the
host's namespace (:mod:`.forward`).

Without root the namespace is made by a helper process in a user namespace of its own
(:mod:`.rootless`), which hands the same sockets and namespace descriptors back; the rest
is the same.

The agent starts through ``nsenter --net`` (into the namespace; ``--user`` too when it
was made rootless, so the agent is root only inside it), ``unshare --mount`` (a private
mount namespace) and ``sh``, which bind-mounts the namespace's hosts and resolv.conf
over ``/etc`` and ``exec``s the command: the agent keeps the process id exec started, so
signals and exit statuses are the command's own.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field

from sidecar.agent.isolation import rootless
from sidecar.agent.isolation.rules import namespace_rules

TOOLS = ("ip", "iptables-restore", "nsenter", "unshare", "mount", "sh")
DEBIAN = "apt-get install iproute2 iptables util-linux mount"
VETH_INSIDE = "169.254.231.2"
VETH_PEER = "169.254.231.1"
SETUP_TIMEOUT_S = 10.0
ENTER = (
    'h=$1 r=$2; shift 2; mount --bind "$h" /etc/hosts || exit 125; '
    'if [ -n "$r" ] && [ -e /etc/resolv.conf ]; then '
    'mount --bind "$r" /etc/resolv.conf || exit 125; fi; exec "$@"'
)


class IsolationError(Exception):
    """The namespace could not be made; the message says why (one line)."""


def unavailable() -> str | None:
    """Why ``--isolate`` cannot work on this machine, or None if it can (cheap: no
    namespace is created)."""
    if sys.platform != "linux":
        return f"network namespaces need Linux, this is {sys.platform}"
    missing = [tool for tool in TOOLS if shutil.which(tool) is None]
    if missing:
        return f"missing {', '.join(missing)} (Debian: {DEBIAN})"
    if os.geteuid() != 0:
        return rootless.unavailable()
    return None


@dataclass
class Namespace:
    """An isolated namespace and the sockets exec created inside it."""

    fd: int
    user_fd: int | None = None  # the user namespace it was made in, when made rootless
    mirrors: dict[tuple[str, int], socket.socket] = field(default_factory=dict)
    http: socket.socket | None = None
    pg: socket.socket | None = None
    dns: socket.socket | None = None

    def argv(self, command: Sequence[str], hosts: str, resolv: str) -> list[str]:
        """``command`` run inside the namespace with ``hosts`` (and ``resolv``, unless
        empty) mounted over /etc's; ``pass_fds=self.fds()`` must be given to the spawn."""
        # --preserve-credentials: exec's user is the one mapped to root inside already,
        # and setgroups is denied in a namespace an unprivileged user made.
        user = (
            []
            if self.user_fd is None
            else [f"--user=/proc/self/fd/{self.user_fd}", "--preserve-credentials"]
        )
        return [
            "nsenter", *user, f"--net=/proc/self/fd/{self.fd}", "--",
            "unshare", "--mount", "--propagation", "private", "--",
            "sh", "-c", ENTER, "sidecar-isolate", hosts, resolv, *command,
        ]  # fmt: skip

    def fds(self) -> tuple[int, ...]:
        """The namespace descriptors the agent's ``nsenter`` opens."""
        return (self.fd,) if self.user_fd is None else (self.fd, self.user_fd)

    def sockets(self) -> list[socket.socket]:
        found = [*self.mirrors.values(), self.http, self.pg, self.dns]
        return [s for s in found if s is not None]

    def close(self) -> None:
        for sock in self.sockets():
            sock.close()
        for fd in self.fds():
            with contextlib.suppress(OSError):
                os.close(fd)


def create(
    mirrors: Sequence[tuple[str, int]], *, pg: bool, dns: bool, pg_ports: Sequence[int]
) -> Namespace:
    """A new namespace with its sockets and rules (see the module notes)."""
    if os.geteuid() != 0:
        return rootless.create(mirrors, pg=pg, dns=dns, pg_ports=pg_ports)
    made: list[Namespace] = []
    failed: list[BaseException] = []

    def inside() -> None:
        home = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
        try:
            os.unshare(os.CLONE_NEWNET)
            space = Namespace(os.open("/proc/thread-self/ns/net", os.O_RDONLY))
            made.append(space)
            wire(space, mirrors, pg=pg, dns=dns, pg_ports=pg_ports)
        except BaseException as error:  # reported to the caller's thread
            failed.append(error)
        finally:
            # If this fails the thread ends here, and with it its hold on the namespace.
            os.setns(home, os.CLONE_NEWNET)
            os.close(home)

    worker = threading.Thread(target=inside, name="sidecar-isolate", daemon=True)
    worker.start()
    worker.join(SETUP_TIMEOUT_S)
    if failed or worker.is_alive() or not made:
        for space in made:
            space.close()
        why = failed[0] if failed else "timed out"
        if isinstance(why, IsolationError):
            raise why
        raise IsolationError(f"cannot create a network namespace: {why}")
    return made[0]


def wire(
    space: Namespace,
    mirrors: Sequence[tuple[str, int]],
    *,
    pg: bool,
    dns: bool,
    pg_ports: Sequence[int],
) -> None:
    """Set up the namespace the calling thread is in: its links and routes, ``space``'s
    listening sockets, the nat and filter rules."""
    _tool(
        ["ip", "-batch", "-"],
        "link set lo up\n"
        "link add esc0 type veth peer name esc1\n"
        f"addr add {VETH_INSIDE}/30 dev esc0\n"
        f"addr add {VETH_PEER}/30 dev esc1\n"
        "link set esc0 up\n"
        "link set esc1 up\n"
        f"route add default via {VETH_PEER} dev esc0\n",
    )
    for host, port in mirrors:
        space.mirrors[(host, port)] = socket.create_server((host, port))
    space.http = socket.create_server(("127.0.0.1", 0))
    if pg:
        space.pg = socket.create_server(("127.0.0.1", 0))
    if dns:
        space.dns = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        space.dns.bind(("127.0.0.1", 53))
    rules = namespace_rules(
        http_port=space.http.getsockname()[1],
        pg_port=space.pg.getsockname()[1] if space.pg else None,
        pg_ports=pg_ports,
        mirrored=[port for _, port in mirrors],
    )
    _tool(["iptables-restore", "-w"], rules)


def _tool(argv: list[str], text: str) -> None:
    # Fixed tools with input this module builds; run from the namespace's thread, so the
    # child starts inside the namespace.
    done = subprocess.run(  # noqa: S603
        argv, input=text, capture_output=True, text=True, check=False, timeout=SETUP_TIMEOUT_S
    )
    if done.returncode != 0:
        raise IsolationError(
            f"{argv[0]} failed in the agent's network namespace: {done.stderr.strip()}"
        )
