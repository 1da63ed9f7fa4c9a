"""The agent's namespace made without root: a helper in a user namespace of its own.

A process that is not root cannot ``unshare`` a network namespace, but it may make a
user namespace (where it is root) and a network namespace owned by it. ``unshare(2)``
of a user namespace needs a single-threaded process, which exec is not, so exec starts
a helper through ``unshare --user --map-root-user --net`` (this module run as a
program). The helper, already inside, does what :func:`.netns.wire` does for root -
links, exec's listening sockets, the nat and filter rules (iptables works on a network
namespace its user namespace owns) - then sends the sockets and the two namespace
descriptors to exec over a socket pair (``SCM_RIGHTS``) and ends. Sockets keep the
namespace they were made in, whoever holds them; the descriptors keep both namespaces
alive, and let the agent's ``nsenter --user --net`` join them: exec's user owns the user
namespace, so it needs no privilege to enter it.

Where unprivileged user namespaces are turned off (a sysctl, an AppArmor policy, a
container's seccomp profile), ``unshare`` fails and its message becomes the
:class:`.netns.IsolationError`.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sidecar.agent.isolation import netns

SWITCHES = (
    # Debian's and Ubuntu's own switch, and the generic limit (0 turns them off).
    (Path("/proc/sys/kernel/unprivileged_userns_clone"), "kernel.unprivileged_userns_clone"),
    (Path("/proc/sys/user/max_user_namespaces"), "user.max_user_namespaces"),
)
MAX_FDS = 16


def unavailable() -> str | None:
    """Why a rootless namespace cannot be made here, as far as a cheap look tells."""
    for path, name in SWITCHES:
        with contextlib.suppress(OSError, ValueError):
            if int(path.read_text().strip()) == 0:
                return f"it is not root and unprivileged user namespaces are off ({name}=0)"
    return None


def create(
    mirrors: Sequence[tuple[str, int]], *, pg: bool, dns: bool, pg_ports: Sequence[int]
) -> netns.Namespace:
    """A new namespace made by the helper, with the sockets it made inside."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    order = {"mirrors": [list(m) for m in mirrors], "pg": pg, "dns": dns, "pg_ports": [*pg_ports]}
    # Fixed argv: the helper is this module, run by this interpreter.
    argv = ["unshare", "--user", "--map-root-user", "--net", "--",
            sys.executable, "-m", __name__, str(theirs.fileno())]  # fmt: skip
    try:
        helper = subprocess.Popen(  # noqa: S603
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            pass_fds=(theirs.fileno(),),
            text=True,
        )
    except OSError as error:
        ours.close()
        raise netns.IsolationError(f"cannot start unshare: {error}") from error
    finally:
        theirs.close()
    try:
        _, errors = helper.communicate(json.dumps(order), timeout=netns.SETUP_TIMEOUT_S)
    except subprocess.TimeoutExpired as error:
        helper.kill()
        helper.wait()
        ours.close()
        raise netns.IsolationError("the rootless namespace helper timed out") from error
    with ours:
        ours.settimeout(1.0)
        try:
            message, fds, _, _ = socket.recv_fds(ours, 1 << 16, MAX_FDS)
        except OSError:
            message, fds = b"", []
    if helper.returncode != 0 or not message:
        for fd in fds:
            os.close(fd)
        why = (errors or "").strip().splitlines()[-1:] or [f"status {helper.returncode}"]
        raise netns.IsolationError(f"cannot create a rootless network namespace: {why[0]}")
    return _received(json.loads(message), fds)


def _received(made: dict[str, Any], fds: list[int]) -> netns.Namespace:
    """The namespace from the helper's message and descriptors, in the order sent."""
    taken = iter(fds)
    space = netns.Namespace(next(taken), user_fd=next(taken))
    for host, port in made["mirrors"]:
        space.mirrors[(host, port)] = socket.socket(fileno=next(taken))
    space.http = socket.socket(fileno=next(taken))
    if made["pg"]:
        space.pg = socket.socket(fileno=next(taken))
    if made["dns"]:
        space.dns = socket.socket(fileno=next(taken))
    return space


def _helper(channel_fd: int) -> int:
    """Inside the new namespaces: wire them, send the results, end."""
    order = json.loads(sys.stdin.read())
    space = netns.Namespace(os.open("/proc/self/ns/net", os.O_RDONLY))
    space.user_fd = os.open("/proc/self/ns/user", os.O_RDONLY)
    try:
        netns.wire(
            space,
            [(host, port) for host, port in order["mirrors"]],
            pg=order["pg"],
            dns=order["dns"],
            pg_ports=order["pg_ports"],
        )
    except netns.IsolationError as error:
        print(error, file=sys.stderr)
        return 1
    made = {"mirrors": [list(m) for m in space.mirrors], "pg": space.pg is not None}
    made["dns"] = space.dns is not None
    fds = [*space.fds(), *(sock.fileno() for sock in space.sockets())]
    with socket.socket(fileno=channel_fd) as channel:
        socket.send_fds(channel, [json.dumps(made).encode()], fds)
    return 0


if __name__ == "__main__":
    sys.exit(_helper(int(sys.argv[1])))
