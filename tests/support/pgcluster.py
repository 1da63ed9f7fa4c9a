"""A private, throw-away PostgreSQL cluster for tests: initdb, TLS, passwords, pg_hba.

    cluster = PgCluster.create(tmp_dir, hba=[...])   # initdb + self-signed cert + start
    cluster.sql("CREATE ROLE alice LOGIN PASSWORD 'secret'")
    ...
    cluster.stop_server(); cluster.start()            # an outage: same data, same port
    cluster.stop()                                    # pg_ctl stop -m immediate, clean up

The cluster listens on 127.0.0.1 on a free port and on a unix socket in its own
directory; the superuser ``admin`` connects over that socket without a password
(``local all admin trust``), everything over TCP follows the ``hba`` lines given.

PostgreSQL refuses to run as root.  When the tests run as root (containers), initdb,
pg_ctl and the server run as an unprivileged system user (``postgres``, else
``nobody``) through ``setpriv``, and the cluster lives in a directory of its own under
the system temporary directory, since pytest's ``tmp_path`` is private to root.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.ports import free_port

SUPERUSER = "admin"


class PgUnavailable(RuntimeError):
    """This machine cannot run a private PostgreSQL cluster (no initdb, no user for it)."""


def find_bindir() -> Path:
    """The directory of initdb, pg_ctl and psql of one PostgreSQL installation."""
    on_path = shutil.which("initdb")
    candidates = [on_path] if on_path else []
    candidates += sorted(
        glob.glob("/usr/lib/postgresql/*/bin/initdb"),  # Debian, Ubuntu: newest first
        key=lambda p: int(Path(p).parts[-3]) if Path(p).parts[-3].isdigit() else 0,
        reverse=True,
    )
    candidates += glob.glob("/usr/pgsql-*/bin/initdb")  # RPM packages
    for candidate in candidates:
        bindir = Path(os.path.realpath(candidate)).parent  # /usr/local/bin/initdb is a link
        if all(os.access(bindir / tool, os.X_OK) for tool in ("initdb", "pg_ctl", "psql")):
            return bindir
    raise PgUnavailable("no PostgreSQL installation (initdb, pg_ctl, psql) found")


def unprivileged_user() -> pwd.struct_passwd | None:
    """Who runs the server when we are root; None when we are not root."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        try:
            return pwd.getpwnam(name)
        except KeyError:
            continue
    raise PgUnavailable("running as root and there is no postgres or nobody user")


def self_signed(directory: Path, owner: pwd.struct_passwd | None) -> None:
    """server.crt / server.key (P-256, CN=localhost, 1 day) in ``directory``."""
    # cryptography comes with mitmproxy; imported here so the module loads without it.
    from tests.support.certs import cert_pem, key_pem, make_ca  # noqa: PLC0415

    cert, key = make_ca("localhost", ca=False, key_id=False)
    crt, pem = directory / "server.crt", directory / "server.key"
    crt.write_bytes(cert_pem(cert))
    pem.write_bytes(key_pem(key))
    pem.chmod(0o600)  # the server refuses a key others can read
    if owner is not None:
        for path in (crt, pem):
            os.chown(path, owner.pw_uid, owner.pw_gid)


@dataclass
class PgCluster:
    root: Path
    bindir: Path
    port: int
    owner: pwd.struct_passwd | None
    own_root: bool  # root was created here (as root): removed by stop()
    host: str = "127.0.0.1"

    @property
    def data(self) -> Path:
        return self.root / "data"

    @property
    def sockets(self) -> Path:
        return self.root / "sock"

    @property
    def logfile(self) -> Path:
        return self.root / "server.log"

    @classmethod
    def create(
        cls, directory: Path, hba: list[str], settings: dict[str, str] | None = None
    ) -> PgCluster:
        """initdb a cluster under ``directory``, with TLS and these pg_hba lines, and start it.

        ``settings`` are added to postgresql.conf (values as written there, quoted).
        Raises :class:`PgUnavailable` when this machine has no PostgreSQL to run.
        """
        bindir = find_bindir()
        owner = unprivileged_user()
        own_root = owner is not None
        root = Path(tempfile.mkdtemp(prefix="sidecar-pg-")) if own_root else directory
        if owner is not None:
            os.chown(root, owner.pw_uid, owner.pw_gid)
        cluster = cls(root, bindir, free_port(), owner, own_root)
        try:
            cluster._init(hba, settings or {})
            cluster._start()
        except BaseException:
            cluster.stop()
            raise
        return cluster

    def _as_owner(self, argv: list[str]) -> list[str]:
        if self.owner is None:
            return argv
        user = self.owner.pw_name
        return ["setpriv", f"--reuid={user}", f"--regid={user}", "--init-groups", *argv]

    def _run(self, argv: list[str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            self._as_owner(argv),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            cwd=self.root,
        )
        if done.returncode != 0:
            raise RuntimeError(f"{argv[0]} failed ({done.returncode}): {done.stderr}{done.stdout}")
        return done

    def _init(self, hba: list[str], settings: dict[str, str]) -> None:
        self.sockets.mkdir()
        if self.owner is not None:
            os.chown(self.sockets, self.owner.pw_uid, self.owner.pw_gid)
        self._run(
            [
                str(self.bindir / "initdb"),
                "-D", str(self.data),
                "-U", SUPERUSER,
                "--auth=trust",
                "--no-sync",
                "--encoding=UTF8",
                "--locale=C",
            ]
        )  # fmt: skip
        self_signed(self.data, self.owner)
        conf = {
            "listen_addresses": "'127.0.0.1'",
            "ssl": "on",
            "ssl_cert_file": "'server.crt'",
            "ssl_key_file": "'server.key'",
            "password_encryption": "'scram-sha-256'",
            "log_connections": "on",
            "fsync": "off",
            "synchronous_commit": "off",
            "full_page_writes": "off",
            "max_connections": "30",
            "shared_buffers": "16MB",
        } | settings
        with (self.data / "postgresql.conf").open("a") as f:
            f.write("\n# tests.support.pgcluster\n")
            f.writelines(f"{k} = {v}\n" for k, v in conf.items())
        (self.data / "pg_hba.conf").write_text(
            "\n".join([f"local all {SUPERUSER} trust", *hba]) + "\n"
        )

    def _start(self) -> None:
        self._run(
            [
                str(self.bindir / "pg_ctl"),
                "-D", str(self.data),
                "-o", f"-p {self.port} -k {self.sockets}",
                "-l", str(self.logfile),
                "-w", "-t", "60",
                "start",
            ],
            timeout=90,
        )  # fmt: skip

    def stop_server(self) -> None:
        """Stop the server at once (``-m immediate``: an outage), keeping its data and port;
        :meth:`start` brings it back."""
        if (self.data / "postmaster.pid").exists():
            argv = [str(self.bindir / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "stop"]
            subprocess.run(self._as_owner(argv), capture_output=True, timeout=60, check=False)

    def start(self) -> None:
        """Start the server again after :meth:`stop_server`: same data, same port."""
        self._start()

    def stop(self) -> None:
        """Stop the server at once (``-m immediate``); remove a root-created directory."""
        self.stop_server()
        if self.own_root:
            shutil.rmtree(self.root, ignore_errors=True)

    def sql(self, statement: str, database: str = "postgres") -> str:
        """Run SQL as the superuser over the unix socket; psql's unaligned output."""
        done = self._run(
            [
                str(self.bindir / "psql"),
                "-X", "-q", "-A", "-t",
                "-v", "ON_ERROR_STOP=1",
                "-h", str(self.sockets),
                "-p", str(self.port),
                "-U", SUPERUSER,
                "-d", database,
                "-c", statement,
            ],
            timeout=60,
        )  # fmt: skip
        return done.stdout.strip()

    def create_user(self, name: str, password: str, encryption: str = "scram-sha-256") -> None:
        """A login role whose password is stored as ``encryption`` (scram-sha-256 or md5)."""
        quoted = password.replace("'", "''")
        self.sql(
            f"SET password_encryption = '{encryption}'; "
            f"CREATE ROLE \"{name}\" LOGIN PASSWORD '{quoted}'"
        )

    def url(self, sslmode: str = "require") -> str:
        """The URL `sidecar serve --pg-upstream` takes for this cluster."""
        return f"postgresql://{self.host}:{self.port}/?sslmode={sslmode}"


def private_cluster(
    directory: Path, hba: list[str], settings: dict[str, str] | None = None
) -> PgCluster:
    """:meth:`PgCluster.create` for a test: one this machine cannot run skips the test,
    and fails it under CI=true, where every test must run."""
    try:
        return PgCluster.create(directory, hba=hba, settings=settings)
    except PgUnavailable as error:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true but no private PostgreSQL cluster can run here: {error}")
        pytest.skip(f"no PostgreSQL to run a private cluster: {error}")
