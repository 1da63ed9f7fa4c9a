"""A recorded effect's oversized body is refused before it costs the sidecar anything.

Raw sockets and a real client library through the real proxy process: a client that
declares 8 GiB gets its 413 before the body is read, a chunked body is cut off soon
after the rule's limit (1 MiB by default), what still arrives is dropped only up to a
bound, and the sidecar's memory does not grow by what the client tried to send.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest
import requests

from sidecar.proxy.body_limit import DRAIN_BYTES
from tests.acceptance.memory import peak_growth
from tests.support.stack import Stack

pytestmark = pytest.mark.acceptance

EFFECT_ROUTE = "http://api.things.test/repos/acme/app/things"
LIMIT = 1 << 20  # test.things.create keeps the default max_body_bytes


@dataclass
class Answer:
    head: str
    body: bytes
    seconds: float
    sent: int = 0

    @property
    def status(self) -> int:
        return int(self.head.split()[1])

    @property
    def problem(self) -> dict[str, object]:
        parsed: dict[str, object] = json.loads(self.body)
        return parsed


@dataclass
class Upload:
    """A client writing a body in 64 KiB pieces until told to stop or the socket breaks."""

    connection: socket.socket
    piece: bytes
    chunked: bool
    limit: int
    sent: int = 0
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        frame = b"%x\r\n%s\r\n" % (len(self.piece), self.piece) if self.chunked else self.piece
        try:
            while not self.stop.is_set() and self.sent < self.limit:
                self.connection.sendall(frame)
                self.sent += len(self.piece)
        except OSError:
            pass  # the sidecar closed the connection: the point of the test


def connect(stack: Stack) -> socket.socket:
    host, port = stack.proxy_url.removeprefix("http://").rsplit(":", 1)
    return socket.create_connection((host, int(port)), timeout=30)


def read_answer(connection: socket.socket, started: float) -> Answer:
    received = b""
    while b"\r\n\r\n" not in received:
        piece = connection.recv(65536)
        assert piece, f"closed before an answer: {received!r}"
        received += piece
    head, _, body = received.partition(b"\r\n\r\n")
    length = int(
        next(
            line.split(b":")[1]
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length:")
        )
    )
    while len(body) < length:
        body += connection.recv(65536)
    seconds = time.monotonic() - started
    return Answer(head.decode(), body[:length], seconds)


def post(stack: Stack, headers: str, *, chunked: bool, send_up_to: int) -> Answer:
    """POST to the effect route with ``headers``, writing at most ``send_up_to`` body bytes."""
    connection = connect(stack)
    with connection:
        head = f"POST {EFFECT_ROUTE} HTTP/1.1\r\nHost: api.things.test\r\n{headers}\r\n"
        started = time.monotonic()
        connection.sendall(head.encode())
        upload = Upload(connection, b"x" * 65536, chunked, send_up_to)
        writer = threading.Thread(target=upload.run)
        writer.start()
        try:
            answer = read_answer(connection, started)
        finally:
            upload.stop.set()
            writer.join()
        answer.sent = upload.sent
        return answer


def sidecar_growth(stack: Stack, action: Callable[[], Answer]) -> tuple[float, Answer]:
    assert stack.sidecar is not None
    return peak_growth(stack.sidecar.pid, action)


def test_a_declared_8_gib_body_gets_413_before_any_of_it_is_read(stack: Stack) -> None:
    declared = 8 << 30
    growth, answer = sidecar_growth(
        stack,
        lambda: post(stack, f"Content-Length: {declared}\r\n", chunked=False, send_up_to=16 << 20),
    )
    assert answer.status == 413
    assert answer.problem["code"] == "payload_too_large"
    assert f"declares {declared}" in str(answer.problem["detail"])
    assert "connection: close" in answer.head.lower(), "the rest must not be a next request"
    assert answer.seconds < 5, f"answered after {answer.seconds:.1f} s"
    assert growth < 16, f"the sidecar grew by {growth:.1f} MiB"


def test_a_client_that_keeps_sending_is_cut_off_after_the_drain_bound(stack: Stack) -> None:
    connection = connect(stack)
    with connection:
        head = f"POST {EFFECT_ROUTE} HTTP/1.1\r\nHost: api.things.test\r\n"
        connection.sendall(f"{head}Content-Length: {8 << 30}\r\n\r\n".encode())
        upload = Upload(connection, b"x" * 65536, chunked=False, limit=1 << 30)
        growth, _ = peak_growth(stack.sidecar.pid, upload.run)  # type: ignore[union-attr]
    assert upload.sent < DRAIN_BYTES + (32 << 20), f"it took {upload.sent >> 20} MiB"
    assert growth < 16, f"the sidecar grew by {growth:.1f} MiB"


def test_a_chunked_body_is_cut_off_at_the_rules_limit(stack: Stack) -> None:
    growth, answer = sidecar_growth(
        stack,
        lambda: post(stack, "Transfer-Encoding: chunked\r\n", chunked=True, send_up_to=16 << 20),
    )
    assert answer.status == 413
    assert "was cut off at" in str(answer.problem["detail"])
    assert growth < 16, f"the sidecar grew by {growth:.1f} MiB"
    assert stack.counts()["requests"].get("POST /repos/acme/app/things", 0) == 0


def test_a_client_library_that_sends_its_whole_body_first_reads_the_413(stack: Stack) -> None:
    # requests writes the body before it reads: the sidecar keeps reading (and dropping)
    # it, so the agent gets the problem, not a reset or a hang.
    answer = requests.post(
        EFFECT_ROUTE,
        data=b"x" * (3 * LIMIT),
        proxies={"http": stack.proxy_url},
        timeout=30,
    )
    assert answer.status_code == 413
    assert answer.json()["code"] == "payload_too_large"


def test_a_client_waiting_for_100_continue_gets_the_413_instead(stack: Stack) -> None:
    connection = connect(stack)
    with connection:
        head = (
            f"POST {EFFECT_ROUTE} HTTP/1.1\r\nHost: api.things.test\r\n"
            f"Content-Length: {2 * LIMIT}\r\nExpect: 100-continue\r\n\r\n"
        )
        started = time.monotonic()
        connection.sendall(head.encode())
        answer = read_answer(connection, started)
    assert answer.head.startswith("HTTP/1.1 413"), answer.head
    assert "connection: close" in answer.head.lower()


def test_a_body_within_the_limit_on_the_same_route_is_still_taken(stack: Stack) -> None:
    connection = connect(stack)
    with connection:
        body = json.dumps({"name": "fits", "pad": "y" * (LIMIT // 2)}).encode()
        head = (
            f"POST {EFFECT_ROUTE} HTTP/1.1\r\nHost: api.things.test\r\n"
            f"Transfer-Encoding: chunked\r\nContent-Type: application/json\r\n\r\n"
        )
        started = time.monotonic()
        connection.sendall(head.encode() + b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body))
        answer = read_answer(connection, started)
    # Not bound to a task (no `sidecar exec`): refused for that, once the whole body is in.
    assert answer.problem["code"] == "task_unbound", answer.body
