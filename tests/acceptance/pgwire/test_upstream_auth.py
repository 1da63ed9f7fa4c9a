"""Authentication through the PostgreSQL relay, against a private TLS-only cluster.

The cluster (``tests.support.pgcluster``) accepts TCP only over TLS (``hostssl``,
``hostnossl ... reject``), SCRAM-SHA-256 for everyone but an md5 user and a cleartext
``password`` user (whose password really crosses the sidecar).  A real
`sidecar serve` relays to it with ``sslmode=require``; real clients (psql and psycopg on
libpq, asyncpg) connect to the sidecar (over TLS when they ask) and authenticate with the server
itself: the sidecar holds no secret and must never log one.

Skipped where PostgreSQL is not installed, except on CI (``CI=true``), where it fails.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import secrets
import socket
import ssl
import struct
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import asyncpg
import psycopg
import pytest

from sidecar.testing.processes import Child
from tests.support.pgcluster import PgCluster, private_cluster
from tests.support.ports import free_port

pytestmark = pytest.mark.acceptance

READY = r"effect-sidecar ready control=(\S+) proxy=(\S+) pg=(\S+)"
SCRAM_USER = "agent_scram"
MD5_USER = "agent_md5"
CLEARTEXT_USER = "agent_cleartext"
SSL_REQUEST = struct.pack("!ii", 8, 80877103)
PROBE = "SELECT current_user, ssl, version FROM pg_stat_ssl WHERE pid = pg_backend_pid()"
HBA = [
    f"hostssl all {MD5_USER} 127.0.0.1/32 md5",
    f"hostssl all {CLEARTEXT_USER} 127.0.0.1/32 password",
    "hostssl all all 127.0.0.1/32 scram-sha-256",
    "hostnossl all all 127.0.0.1/32 reject",
]


@dataclass(frozen=True)
class Passwords:
    scram: str
    md5: str
    cleartext: str
    wrong: str

    def of(self, user: str) -> str:
        return {SCRAM_USER: self.scram, MD5_USER: self.md5, CLEARTEXT_USER: self.cleartext}[user]

    def all(self) -> tuple[str, ...]:
        return (self.scram, self.md5, self.cleartext, self.wrong)


@dataclass(frozen=True)
class Sidecar:
    child: Child
    host: str
    port: int
    log: Path


@pytest.fixture(scope="module")
def passwords() -> Passwords:
    return Passwords(
        scram=f"scram-pw-{secrets.token_hex(12)}",
        md5=f"md5-pw-{secrets.token_hex(12)}",
        cleartext=f"cleartext-pw-{secrets.token_hex(12)}",
        wrong=f"wrong-pw-{secrets.token_hex(12)}",
    )


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, passwords: Passwords) -> Iterator[PgCluster]:
    """A private cluster: TLS only over TCP; a SCRAM, an md5 and a cleartext user."""
    pg = private_cluster(tmp_path_factory.mktemp("pg"), hba=HBA)
    try:
        pg.create_user(SCRAM_USER, passwords.scram, "scram-sha-256")
        pg.create_user(MD5_USER, passwords.md5, "md5")
        pg.create_user(CLEARTEXT_USER, passwords.cleartext, "scram-sha-256")
        yield pg
    finally:
        pg.stop()


@contextmanager
def serve(directory: Path, upstream: str) -> Iterator[Sidecar]:
    """A real `sidecar serve` relaying to ``upstream``, logging at debug level."""
    directory.mkdir(parents=True, exist_ok=True)
    log = directory / "sidecar.log"
    child = Child.python(
        "sidecar",
        "serve",
        "--data-dir", str(directory / "data"),
        "--control-listen", "127.0.0.1:0",
        "--proxy-listen", "127.0.0.1:0",
        "--pg-listen", "127.0.0.1:0",
        "--pg-upstream", upstream,
        "--log-level", "debug",
        stderr_path=log,
    )  # fmt: skip
    with child:
        pg = urlsplit(child.wait_for(READY, timeout=30).group(3))
        assert pg.hostname is not None
        assert pg.port is not None
        yield Sidecar(child, pg.hostname, pg.port, log)


@pytest.fixture(scope="module")
def sidecar(cluster: PgCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sidecar]:
    with serve(tmp_path_factory.mktemp("sidecar"), cluster.url("require")) as running:
        yield running


# ---- clients ----------------------------------------------------------------------------


def psql(
    cluster: PgCluster, at: Sidecar, user: str, password: str, options: str = "", sql: str = PROBE
) -> subprocess.CompletedProcess[str]:
    """psql (the installed libpq) with the password in PGPASSWORD, never on a command line."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
    env |= {"PGPASSWORD": password, "PGCONNECT_TIMEOUT": "10"}
    dsn = f"host={at.host} port={at.port} user={user} dbname=postgres {options}"
    return subprocess.run(
        [str(cluster.bindir / "psql"), "-X", "-A", "-t", "-c", sql, dsn],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


def connect(at: Sidecar, user: str, password: str, **options: str) -> psycopg.Connection:
    """psycopg (its own libpq, which may be another version than psql's)."""
    return psycopg.connect(
        host=at.host,
        port=at.port,
        user=user,
        password=password,
        dbname="postgres",
        connect_timeout=10,
        **options,
    )


async def asyncpg_connect(at: Sidecar, user: str, password: str) -> asyncpg.Connection:
    """asyncpg: no libpq at all; ssl=False: a plaintext agent leg (TLS: see test_tls.py)."""
    return await asyncpg.connect(
        host=at.host,
        port=at.port,
        user=user,
        password=password,
        database="postgres",
        ssl=False,
        timeout=10,
    )


def first_auth_request(host: str, port: int, user: str, *, tls: bool) -> tuple[int, list[str]]:
    """Start up by hand, stop at the server's first Authentication request: (code, SASL
    mechanisms).  Independent of the sidecar's own codec."""
    with socket.create_connection((host, port), timeout=10) as raw:
        if not tls:
            return auth_request(raw, user)
        raw.sendall(SSL_REQUEST)
        assert raw.recv(1) == b"S"
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        with context.wrap_socket(raw) as encrypted:
            return auth_request(encrypted, user)


def auth_request(sock: socket.socket, user: str) -> tuple[int, list[str]]:
    body = b"user\0" + user.encode() + b"\0database\0postgres\0\0"
    sock.sendall(struct.pack("!ii", len(body) + 8, 196608) + body)
    kind, payload = read_message(sock)
    assert kind == b"R", (kind, payload)
    (code,) = struct.unpack_from("!i", payload)
    if code != 10:  # not AuthenticationSASL: no mechanisms (md5 has a salt there)
        return code, []
    return code, [m.decode() for m in payload[4:].split(b"\0") if m]


def read_message(sock: socket.socket) -> tuple[bytes, bytes]:
    def exactly(n: int) -> bytes:
        data = b""
        while len(data) < n:
            chunk = sock.recv(n - len(data))
            assert chunk, "connection closed mid-message"
            data += chunk
        return data

    head = exactly(5)
    (length,) = struct.unpack("!i", head[1:])
    return head[:1], exactly(length - 4)


def authenticated_since(cluster: PgCluster, mark: int) -> str:
    """The server log's ``connection authenticated`` lines written after ``mark``."""
    with cluster.logfile.open("rb") as f:
        f.seek(mark)
        lines = f.read().decode(errors="replace").splitlines()
    return "\n".join(line for line in lines if "connection authenticated" in line)


def log_size(cluster: PgCluster) -> int:
    return cluster.logfile.stat().st_size


# ---- SCRAM, the server's own choice ------------------------------------------------------


def test_psql_authenticates_with_scram_through_the_sidecar_and_tls_to_the_server(
    cluster, sidecar, passwords
):
    mark = log_size(cluster)
    done = psql(cluster, sidecar, SCRAM_USER, passwords.scram)
    assert done.returncode == 0, done.stderr
    user, tls, version = done.stdout.strip().split("|")
    assert (user, tls) == (SCRAM_USER, "t"), "the server-side connection is TLS"
    assert version.startswith("TLSv1.")
    assert f'identity="{SCRAM_USER}" method=scram-sha-256' in authenticated_since(cluster, mark)


def test_psycopg_authenticates_with_scram_through_the_sidecar_and_tls_to_the_server(
    cluster, sidecar, passwords
):
    mark = log_size(cluster)
    with connect(sidecar, SCRAM_USER, passwords.scram) as conn:
        assert conn.info.parameter_status("server_version")
        row = conn.execute(PROBE).fetchone()
        assert row is not None
        assert row[:2] == (SCRAM_USER, True)
        assert conn.execute("SELECT 40 + 2").fetchone() == (42,)
    assert f'identity="{SCRAM_USER}" method=scram-sha-256' in authenticated_since(cluster, mark)


async def test_asyncpg_authenticates_with_scram_through_the_sidecar(cluster, sidecar, passwords):
    mark = log_size(cluster)
    conn = await asyncpg_connect(sidecar, SCRAM_USER, passwords.scram)
    try:
        row = await conn.fetchrow(PROBE)
        assert row is not None
        assert (row["current_user"], row["ssl"]) == (SCRAM_USER, True)
        assert await conn.fetchval("SELECT $1::int + 1", 41) == 42
    finally:
        await conn.close()
    assert f'identity="{SCRAM_USER}" method=scram-sha-256' in authenticated_since(cluster, mark)


def test_the_sidecar_takes_channel_binding_out_of_the_scram_offer(cluster, sidecar):
    direct = first_auth_request(cluster.host, cluster.port, SCRAM_USER, tls=True)
    relayed = first_auth_request(sidecar.host, sidecar.port, SCRAM_USER, tls=False)
    assert direct[0] == relayed[0] == 10  # AuthenticationSASL
    assert set(direct[1]) == {"SCRAM-SHA-256-PLUS", "SCRAM-SHA-256"}, "the server offers -PLUS"
    assert relayed[1] == ["SCRAM-SHA-256"]


# ---- md5 ---------------------------------------------------------------------------------


async def test_an_md5_user_authenticates_through_the_sidecar(cluster, sidecar, passwords):
    mark = log_size(cluster)
    done = psql(cluster, sidecar, MD5_USER, passwords.md5)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().split("|")[:2] == [MD5_USER, "t"]
    with connect(sidecar, MD5_USER, passwords.md5) as conn:
        assert conn.execute("SELECT current_user").fetchone() == (MD5_USER,)
    conn2 = await asyncpg_connect(sidecar, MD5_USER, passwords.md5)
    try:
        assert await conn2.fetchval("SELECT current_user") == MD5_USER
    finally:
        await conn2.close()
    authenticated = authenticated_since(cluster, mark)
    assert authenticated.count(f'identity="{MD5_USER}" method=md5') == 3, authenticated
    assert authenticated.count("connection authenticated") == 3, "and by no other method"
    code, _ = first_auth_request(sidecar.host, sidecar.port, MD5_USER, tls=False)
    assert code == 5  # AuthenticationMD5Password, passed through


@pytest.mark.parametrize("pieces", [1, 3], ids=["whole", "in-pieces"])
def test_an_md5_answer_computed_by_hand_passes_through_the_sidecar(sidecar, passwords, pieces):
    """The md5 exchange byte by byte: the relay forwards the client's answer untouched,
    also when it arrives in several TCP segments."""
    with socket.create_connection((sidecar.host, sidecar.port), timeout=10) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        body = b"user\0" + MD5_USER.encode() + b"\0database\0postgres\0\0"
        sock.sendall(struct.pack("!ii", len(body) + 8, 196608) + body)
        kind, payload = read_message(sock)
        assert (kind, payload[:4]) == (b"R", struct.pack("!i", 5))
        salt = payload[4:8]
        inner = hashlib.md5((passwords.md5 + MD5_USER).encode()).hexdigest()
        answer = b"md5" + hashlib.md5(inner.encode() + salt).hexdigest().encode() + b"\0"
        message = b"p" + struct.pack("!i", len(answer) + 4) + answer
        step = -(-len(message) // pieces)
        for at in range(0, len(message), step):
            sock.sendall(message[at : at + step])
            time.sleep(0.05)  # separate reads on the relay's side
        kinds = []
        while not kinds or kinds[-1] != b"Z":
            kind, payload = read_message(sock)
            kinds.append(kind)
            assert kind != b"E", payload
        assert kinds[0] == b"R"  # AuthenticationOk
        assert b"K" in kinds  # the server's own cancel key reaches the client


async def test_a_cleartext_password_user_authenticates_through_the_sidecar(
    cluster, sidecar, passwords
):
    """pg_hba ``password``: the agent sends the password itself, in plaintext to the
    sidecar on loopback, and the sidecar carries it to the server inside TLS."""
    code, _ = first_auth_request(sidecar.host, sidecar.port, CLEARTEXT_USER, tls=False)
    assert code == 3  # AuthenticationCleartextPassword
    mark = log_size(cluster)
    done = psql(cluster, sidecar, CLEARTEXT_USER, passwords.cleartext)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().split("|")[:2] == [CLEARTEXT_USER, "t"]
    with connect(sidecar, CLEARTEXT_USER, passwords.cleartext) as conn:
        assert conn.execute("SELECT current_user").fetchone() == (CLEARTEXT_USER,)
    conn2 = await asyncpg_connect(sidecar, CLEARTEXT_USER, passwords.cleartext)
    try:
        assert await conn2.fetchval("SELECT current_user") == CLEARTEXT_USER
    finally:
        await conn2.close()
    authenticated = authenticated_since(cluster, mark)
    assert authenticated.count(f'identity="{CLEARTEXT_USER}" method=password') == 3


# ---- refusals ----------------------------------------------------------------------------


@pytest.mark.parametrize("user", [SCRAM_USER, MD5_USER, CLEARTEXT_USER])
async def test_a_wrong_password_is_refused_with_the_servers_own_error(
    cluster, sidecar, passwords, user
):
    refused = f'password authentication failed for user "{user}"'
    done = psql(cluster, sidecar, user, passwords.wrong)
    assert done.returncode == 2
    assert f"FATAL:  {refused}" in done.stderr
    with pytest.raises(psycopg.OperationalError, match=refused):
        connect(sidecar, user, passwords.wrong)
    with pytest.raises(asyncpg.InvalidPasswordError, match=refused) as raised:
        await asyncpg_connect(sidecar, user, passwords.wrong)
    assert raised.value.sqlstate == "28P01"
    # the relay is not stuck after a refusal: the right password still gets in
    with connect(sidecar, user, passwords.of(user)) as conn:
        assert conn.execute("SELECT current_user").fetchone() == (user,)


@pytest.mark.parametrize("client", ["psql", "psycopg"])
def test_a_client_that_requires_channel_binding_is_told_why_it_cannot_have_it(
    cluster, sidecar, passwords, client
):
    """libpq refuses by itself: the relay takes SCRAM-SHA-256-PLUS out of the offer (it
    terminates TLS, so a binding could not reach the server), and libpq says so."""
    expected = (
        "channel binding is required, but server did not offer an authentication method "
        "that supports channel binding"
    )
    if client == "psql":
        done = psql(cluster, sidecar, SCRAM_USER, passwords.scram, "channel_binding=require")
        assert done.returncode == 2
        assert expected in done.stderr
    else:
        with pytest.raises(psycopg.OperationalError, match=expected):
            connect(sidecar, SCRAM_USER, passwords.scram, channel_binding="require")


def test_a_client_that_requires_tls_to_the_sidecar_gets_it(cluster, sidecar, passwords):
    """The relay answers SSLRequest with S (its own certificate: see test_tls.py); a SCRAM
    login over it goes without channel binding, which cannot cross the relay."""
    options = "sslmode=require channel_binding=disable"
    done = psql(cluster, sidecar, SCRAM_USER, passwords.scram, options)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("|")[:2] == [SCRAM_USER, "t"]


def test_a_tls_client_that_would_bind_its_scram_login_is_told_how_to_connect(
    cluster, sidecar, passwords
):
    """libpq's default channel_binding=prefer, over TLS, would be refused by the server as
    a downgrade with an error naming neither the relay nor the fix: the relay says both."""
    done = psql(cluster, sidecar, SCRAM_USER, passwords.scram, "sslmode=require")
    assert done.returncode == 2
    assert "channel binding cannot cross the sidecar's PostgreSQL relay" in done.stderr
    assert "channel_binding=disable" in done.stderr


async def test_a_plaintext_upstream_is_refused_by_the_server_and_the_client_sees_why(
    cluster, passwords, tmp_path
):
    refused = (
        f'pg_hba.conf rejects connection for host "127.0.0.1", user "{SCRAM_USER}", '
        'database "postgres", no encryption'
    )
    with serve(tmp_path, cluster.url("disable")) as plain:
        done = psql(cluster, plain, SCRAM_USER, passwords.scram)
        assert done.returncode == 2
        assert f"FATAL:  {refused}" in done.stderr
        with pytest.raises(psycopg.OperationalError, match=refused):
            connect(plain, SCRAM_USER, passwords.scram)
        with pytest.raises(asyncpg.InvalidAuthorizationSpecificationError, match=refused) as e:
            await asyncpg_connect(plain, SCRAM_USER, passwords.scram)
        assert e.value.sqlstate == "28000"


def stop(listener: socket.socket) -> None:
    """Close a listening socket and wake the thread blocked in its accept()."""
    with contextlib.suppress(OSError):
        listener.shutdown(socket.SHUT_RDWR)
    listener.close()


@contextmanager
def server_without_tls() -> Iterator[int]:
    """A port whose 'server' answers every SSLRequest with N (no TLS here)."""
    listener = socket.create_server(("127.0.0.1", 0))

    def answer() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            with conn:
                conn.settimeout(10)
                conn.recv(8)
                conn.sendall(b"N")
                conn.recv(1024)

    thread = threading.Thread(target=answer, daemon=True)
    thread.start()
    try:
        yield listener.getsockname()[1]
    finally:
        stop(listener)
        thread.join(timeout=10)


@contextmanager
def nothing_listening() -> Iterator[int]:
    yield free_port()  # just closed: nothing listens there


@pytest.mark.parametrize("server", ["refuses TLS", "not listening"])
def test_an_upstream_the_sidecar_cannot_reach_is_explained_to_the_client(
    cluster, passwords, tmp_path, server
):
    upstream = server_without_tls() if server == "refuses TLS" else nothing_listening()
    with (
        upstream as port,
        serve(tmp_path, f"postgresql://127.0.0.1:{port}/?sslmode=require") as broken,
    ):
        done = psql(cluster, broken, SCRAM_USER, passwords.scram)
    assert done.returncode == 2
    assert (
        f"FATAL:  effect-sidecar: cannot connect to the PostgreSQL server 127.0.0.1:{port}: "
        in done.stderr
    )
    reason = "does not accept TLS, and --pg-upstream has sslmode=require"
    if server == "refuses TLS":
        assert reason in done.stderr
    else:
        assert "Connect call failed" in done.stderr
    assert "server closed the connection unexpectedly" not in done.stderr


# ---- cancel, and what the sidecar keeps to itself -----------------------------------------


@contextmanager
def wiretap(port: int) -> Iterator[tuple[int, list[bytes]]]:
    """A TCP forwarder to 127.0.0.1:``port``; yields its own port and, as they arrive,
    the first 8 bytes of every connection made through it (what goes in plaintext)."""
    heads: list[bytes] = []
    opened: list[socket.socket] = []
    listener = socket.create_server(("127.0.0.1", 0))

    def pump(source: socket.socket, sink: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                sink.sendall(data)
            sink.shutdown(socket.SHUT_WR)

    def accept() -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            server = socket.create_connection(("127.0.0.1", port), timeout=10)
            server.settimeout(None)
            opened.extend((client, server))
            head = b""
            while len(head) < 8 and (chunk := client.recv(8 - len(head))):
                head += chunk
            heads.append(head)
            server.sendall(head)
            for ends in ((client, server), (server, client)):
                threading.Thread(target=pump, args=ends, daemon=True).start()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield listener.getsockname()[1], heads
    finally:
        stop(listener)
        thread.join(timeout=10)
        for sock in opened:
            sock.close()


def cancel_when_sleeping(cluster: PgCluster, conn: psycopg.Connection) -> None:
    """Cancel once the server runs the query (a cancel that comes earlier does nothing)."""
    deadline = time.monotonic() + 20
    sleeping = "SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'PgSleep'"
    while cluster.sql(sleeping) == "0" and time.monotonic() < deadline:
        time.sleep(0.05)
    conn.cancel_safe()


def test_a_cancel_request_reaches_the_server_over_tls(cluster, passwords, tmp_path):
    """The client's CancelRequest (the server's secret key) goes upstream inside TLS, as
    every other connection does: nothing the sidecar sends the server is plaintext."""
    with (
        wiretap(cluster.port) as (port, heads),
        serve(tmp_path, f"postgresql://127.0.0.1:{port}/?sslmode=require") as tapped,
        connect(tapped, SCRAM_USER, passwords.scram, channel_binding="disable") as conn,
    ):
        canceller = threading.Thread(target=cancel_when_sleeping, args=(cluster, conn))
        canceller.start()
        started = time.monotonic()
        with pytest.raises(psycopg.errors.QueryCanceled):
            conn.execute("SELECT pg_sleep(60)")
        canceller.join()
        assert time.monotonic() - started < 30
        conn.rollback()
        assert conn.execute("SELECT 1").fetchone() == (1,)
    assert len(heads) == 2, "the session and the cancel request"
    assert heads == [SSL_REQUEST, SSL_REQUEST]


async def test_the_sidecar_log_never_contains_a_password(cluster, sidecar, passwords):
    for user in (SCRAM_USER, MD5_USER, CLEARTEXT_USER):
        for password in (passwords.of(user), passwords.wrong):
            assert psql(cluster, sidecar, user, password).returncode == (
                0 if password == passwords.of(user) else 2
            )
            if password == passwords.wrong:
                with pytest.raises(psycopg.OperationalError):
                    connect(sidecar, user, password)
            else:
                connect(sidecar, user, password).close()
            try:
                conn = await asyncpg_connect(sidecar, user, password)
            except asyncpg.InvalidPasswordError:
                assert password == passwords.wrong
            else:
                await conn.close()
    text = sidecar.log.read_text()
    assert "sidecar ready" in text  # the log is being written (at debug level)
    stdout = "\n".join(sidecar.child.lines)
    for secret in passwords.all():
        assert secret not in text
        assert secret not in stdout
