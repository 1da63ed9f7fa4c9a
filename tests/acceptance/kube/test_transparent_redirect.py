"""Transparent mode in a real network namespace: the pod as Kubernetes would build it.

A "pod" network namespace with a veth to the host; the host's end of the veth stands in
for the internet (the GitHub emulator, a private PostgreSQL). In the pod:

* `sidecar serve --mode transparent --task 312` as uid 1337;
* the redirect installed by `sidecar redirect`, as the init container runs it (twice:
  idempotent);
* UNMODIFIED clients as uid 1001, with no proxy settings and no PGOPTIONS, only the
  sidecar's CA bundle in SSL_CERT_FILE / GIT_SSL_CAINFO (as the injected env would).

HTTPS and git, routed: the pod's /etc/hosts sends api.github.com and github.com to the
host, where the emulator serves plain HTTP on port 80 and nothing listens on 443, so
only the redirect can make the client work; the sidecar routes both names (--route) to
the emulator. The client (clone, commit, push with the git CLI, open a PR with requests,
read over plain HTTP) runs twice, as an agent resumed from the top. Proves the traffic
went through the sidecar (both effects in its log for task 312, both replayed the second
time; one branch at the first commit and one PR in the emulator) and that the sidecar's
own connections to port 80, which the redirect covers, were not looped back into it
(the owner-uid RETURN rule counted packets).

HTTPS and git to the original destination: no --route. The emulator serves HTTPS on the
host's port 443 with a certificate for api.github.com and github.com from a test CA, the
sidecar is given that CA (--upstream-ca) and no routes, so it must reach the emulator
where the agent was going and verify it as it would GitHub: mitmproxy relays (clone, ref
listings) to the original destination address (SO_ORIGINAL_DST) with the agent's SNI,
and the effects the sidecar sends itself (push, PR) go to the host the agent named,
resolved in the pod. Same client without the plain-HTTP read, same proofs, for port 443.
And the operator's failure case: told to trust another CA, the sidecar refuses the
emulator's certificate; the agent gets 502 for the relayed git request and for the PR,
the emulator gets no PR, and the PR's effect is logged as failed (nothing was sent).

PostgreSQL: psql connects to the server's own address; the redirect sends it to the
relay, which finds the server through SO_ORIGINAL_DST (its --pg-upstream points
nowhere) and binds the connection to the sidecar's --task. The migration runs twice,
the table is created once.

Needs root, iproute2, util-linux (setpriv), iptables and (for the PostgreSQL test) a
PostgreSQL installation; skipped with the precise reason otherwise, failed under CI=true.
"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import socket
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from sidecar.kube.redirect import CHAIN, REDIRECT_CHAIN
from sidecar.rules.packs import packs_dir
from sidecar.testing.github import REPO, SOURCE
from sidecar.testing.processes import Child
from tests.support import certs
from tests.support.netns import PodNetwork, sidecar_argv, unavailable
from tests.support.pgcluster import SUPERUSER, PgCluster, private_cluster

pytestmark = pytest.mark.acceptance

SIDECAR_UID = 1337
AGENT_UID = 1001
TASK = "312"
BRANCH = "agent/312-orders"

CLIENT = r"""
import os, subprocess, sys, requests

work = sys.argv[1]
identity = ["-c", "user.name=agent", "-c", "user.email=agent@example.com"]
def git(*args, cwd=work):
    subprocess.run(["git", *identity, *args], cwd=cwd, check=True, capture_output=True)

git("clone", "-q", "https://github.com/acme/app.git", work, cwd=None)
git("checkout", "-q", "-b", "agent/312-orders")
with open(os.path.join(work, "app.py"), "a") as f:
    f.write("\n\ndef cancel_order(order):\n    return {'status': 'cancelled'}\n")
git("commit", "-q", "-am", "Add order cancellation")
head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=work, check=True,
                      capture_output=True, text=True).stdout.strip()
print("head", head, flush=True)
# With an identity: without one git derives it from the host name, whose DNS lookup
# times out in the pod (10 s) before the push updates its reflog.
pushed = subprocess.run(["git", *identity, "push", "--force", "origin", "agent/312-orders"],
                        cwd=work, capture_output=True, text=True)
print("push", pushed.returncode, pushed.stderr.replace("\n", " | "), flush=True)
pull = requests.post(
    "https://api.github.com/repos/acme/app/pulls",
    json={"title": "Order cancellation", "head": "agent/312-orders", "base": "main"},
    headers={"Authorization": "token agent-token"}, timeout=30,
)
print("pull", pull.status_code, pull.headers.get("X-Sidecar-Effect"),
      pull.json().get("number"), flush=True)
"""
# The same agent also reading over plain HTTP (port 80, also redirected).
CLIENT_WITH_READ = (
    CLIENT
    + r"""
read = requests.get("http://api.github.com/repos/acme/app", timeout=30)
print("read", read.status_code, read.headers.get("X-Sidecar-Effect"), flush=True)
"""
)


@pytest.fixture
def pod() -> Iterator[PodNetwork]:
    reason = unavailable()
    if reason is not None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true but the network-namespace test cannot run: {reason}")
        pytest.skip(reason)
    with PodNetwork.create() as network:
        yield network


@pytest.fixture
def base() -> Iterator[Path]:
    """A folder the sidecar's and the agent's uids can reach (pytest's tmp_path is 0700)."""
    folder = Path(tempfile.mkdtemp(prefix="esc-transparent-"))
    folder.chmod(0o755)
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def owned_dir(path: Path, uid: int) -> Path:
    path.mkdir(parents=True, exist_ok=True)  # a second sidecar of the pod reuses its own
    os.chown(path, uid, uid)
    return path


def seed(github: str, *, verify: bool | str = True) -> None:
    """The repository the agent works on; ``verify`` is requests' (a CA file for HTTPS)."""
    auth = {"Authorization": "token test-token"}
    owner, repo = REPO.split("/")
    made = requests.post(
        f"{github}/orgs/{owner}/repos",
        json={"name": repo, "auto_init": True},
        headers=auth,
        verify=verify,
        timeout=30,
    )
    assert made.status_code == 201, made.text
    put = requests.put(
        f"{github}/repos/{REPO}/contents/app.py",
        json={
            "message": "Add the orders endpoint",
            "content": base64.b64encode(SOURCE.encode()).decode(),
            "branch": "main",
        },
        headers=auth,
        verify=verify,
        timeout=30,
    )
    assert put.status_code in {200, 201}, put.text


def in_pod_json(pod: PodNetwork, url: str) -> Any:
    """GET a URL from inside the pod (the control API listens on the pod's loopback)."""
    code = f"import urllib.request as u, sys; sys.stdout.write(u.urlopen({url!r}).read().decode())"
    done = pod.run([sys.executable, "-c", code])
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def start_sidecar(
    pod: PodNetwork, base: Path, *args: str, log: str = "sidecar.log"
) -> tuple[Child, Path]:
    """`sidecar serve --mode transparent --task 312` in the pod, as the sidecar's uid."""
    data = owned_dir(base / "sidecar", SIDECAR_UID)
    serve = [
        sys.executable, "-m", "sidecar", "serve", "--mode", "transparent",
        "--data-dir", str(data), "--control-listen", "127.0.0.1:7300",
        "--proxy-listen", "127.0.0.1:7301", "--task", TASK, "--worker", "pod", *args,
    ]  # fmt: skip
    sidecar = Child(
        pod.argv(serve, uid=SIDECAR_UID),
        env={"PATH": os.environ["PATH"], "HOME": str(data)},
        stderr_path=base / log,
    )
    try:
        sidecar.wait_for(r"effect-sidecar ready", timeout=60)
    except BaseException:
        sidecar.kill()
        raise
    return sidecar, data


def apply_redirect(pod: PodNetwork, *args: str) -> str:
    """The init container: the real verb, as root in the pod, run twice (a restarted init
    container must change nothing); returns what it printed."""
    redirect = sidecar_argv(
        "redirect", "--proxy-port", "7301", "--pg-port", "7302",
        "--owner-uid", str(SIDECAR_UID), *args,
    )  # fmt: skip
    printed = ""
    for _ in range(2):
        applied = pod.run(redirect)
        assert applied.returncode == 0, applied.stderr
        printed = applied.stdout
    hooks = pod.run(["iptables", "-w", "-t", "nat", "-S", "OUTPUT"]).stdout
    assert hooks.count(f"-j {CHAIN}") == 1, hooks
    return printed


def agent_env(home: Path, bundle: Path) -> dict[str, str]:
    """What the injector gives the agent container: the CA bundle, no proxy settings."""
    env = {
        "PATH": os.environ["PATH"],
        "HOME": str(home),
        "SSL_CERT_FILE": str(bundle),
        "REQUESTS_CA_BUNDLE": str(bundle),
        "GIT_SSL_CAINFO": str(bundle),
        "GIT_TERMINAL_PROMPT": "0",
    }
    assert not [name for name in env if name.lower().endswith("_proxy")]
    return env


def assert_not_looped_and_redirected(pod: PodNetwork, port: int) -> None:
    """The sidecar's own connections matched the owner-uid RETURN rule (without it they
    would have been redirected back into the sidecar), and the agent's matched the
    redirect of ``port``."""
    chain = pod.counters("nat", CHAIN)
    owner = [pkts for pkts, rule in chain if f"owner UID match {SIDECAR_UID}" in rule]
    assert owner, chain
    assert owner[0] > 0, chain
    redirected = pod.counters("nat", REDIRECT_CHAIN)
    hits = [pkts for pkts, rule in redirected if f"dpt:{port} " in f"{rule} "]
    assert hits, redirected
    assert hits[0] > 0, redirected


def effects_by_rule(pod: PodNetwork) -> dict[str, dict[str, Any]]:
    log = in_pod_json(pod, f"http://127.0.0.1:7300/v1/tasks/{TASK}/effects")
    return {effect["rule"]: effect for effect in log["effects"]}


def run_agent_twice(pod: PodNetwork, base: Path, data: Path, client: str) -> tuple[str, str]:
    """The agent, then the agent resumed from the top: ``client`` as the agent's uid with
    only the sidecar's CA bundle; returns what each run printed."""
    script = base / "client.py"
    script.write_text(client)
    outputs = []
    for attempt in (1, 2):
        home = owned_dir(base / f"agent-{attempt}", AGENT_UID)
        # The resumed agent redoes the same change later: the same tree, a later commit.
        # (Two runs within one second would make the very same commit, and git would
        # then have nothing to push: no effect for the sidecar to replay.)
        when = f"2026-11-29T10:0{attempt}:00Z"
        done = pod.run(
            [sys.executable, str(script), str(home / "app")],
            uid=AGENT_UID,
            env=agent_env(home, data / "ca-bundle.pem")
            | {"GIT_AUTHOR_DATE": when, "GIT_COMMITTER_DATE": when},
        )
        assert done.returncode == 0, f"{done.stdout}\n{done.stderr}"
        outputs.append(done.stdout)
    first, second = outputs
    assert "push 0" in first, first
    assert "pull 201 recorded" in first, first
    assert "push 0" in second, second
    assert "pull 201 replayed" in second, second
    return first, second


def assert_done_once(state: dict[str, Any], first: str, pod: PodNetwork) -> None:
    """The emulator's ``state`` holds one branch at the first run's commit and one PR (the
    second push was answered by the sidecar), and the sidecar's log for task 312 has both
    effects completed and replayed."""
    repo = state["repos"][REPO]
    assert [name for name in repo["branches"] if name != "main"] == [BRANCH]
    first_head = re.search(r"^head (\w+)", first, re.MULTILINE)
    assert first_head, first
    assert repo["branches"][BRANCH]["sha"] == first_head.group(1)
    assert len(repo["pulls"]) == 1

    by_rule = effects_by_rule(pod)
    assert set(by_rule) == {"github.git.push", "github.pulls.create"}, by_rule
    for effect in by_rule.values():
        assert effect["state"] == "completed", effect
        assert "replayed" in [event["event"] for event in effect["events"]], effect


def test_unmodified_https_and_git_client_goes_through_the_sidecar(
    pod: PodNetwork, base: Path
) -> None:
    github_addr = f"{pod.host_ip}:80"
    github = f"http://{github_addr}"
    emulator = Child(
        [sys.executable, "-m", "sidecar", "emulate", "github", "--listen", github_addr,
         "--data-dir", str(base / "github"), "--api-url", "https://api.github.com",
         "--web-url", "https://github.com"],
        stderr_path=base / "github.log",
    )  # fmt: skip
    with emulator:
        emulator.wait_for(r"github emulator ready", timeout=30)
        seed(github)
        pod.write_hosts({"api.github.com": pod.host_ip, "github.com": pod.host_ip})
        sidecar, data = start_sidecar(
            pod, base, "--rules", str(packs_dir() / "github.yaml"),
            "--route", f"api.github.com={github}", "--route", f"github.com={github}",
        )  # fmt: skip
        with sidecar:
            printed = apply_redirect(pod)
            assert "-p tcp --dport 443 -j REDIRECT --to-ports 7301" in printed

            first, _ = run_agent_twice(pod, base, data, CLIENT_WITH_READ)
            assert "read 200 passthrough" in first, first
            state = requests.get(f"{github}/_emulator/state", timeout=10).json()
            assert_done_once(state, first, pod)

            # Its connections to the emulator's port 80 (a redirected port) were not looped.
            assert_not_looped_and_redirected(pod, 443)
            assert_not_looped_and_redirected(pod, 80)


def https_github(pod: PodNetwork, base: Path) -> tuple[Child, Path, Path]:
    """The GitHub emulator serving HTTPS on the host's veth address, port 443, with a
    certificate for api.github.com, github.com and that address signed by a new test CA,
    not yet waited for. Returns its process, that CA's certificate file, and the
    certificate file of another CA, one that signed nothing the emulator serves."""
    ca_cert, ca_key = certs.make_ca("github test CA")
    ca_file, _ = certs.write_ca(base / "github-ca", ca_cert, ca_key)
    served, served_key = certs.issue(
        ca_cert, ca_key, "github emulator", ip=pod.host_ip, dns=["api.github.com", "github.com"]
    )
    cert_file, key_file = certs.write_ca(base / "github-tls", served, served_key)
    other_file, _ = certs.write_ca(base / "other-ca")
    emulator = Child(
        [sys.executable, "-m", "sidecar", "emulate", "github", "--listen",
         f"{pod.host_ip}:443", "--data-dir", str(base / "github"),
         "--tls-cert", str(cert_file), "--tls-key", str(key_file),
         "--api-url", "https://api.github.com", "--web-url", "https://github.com"],
        stderr_path=base / "github.log",
    )  # fmt: skip
    return emulator, ca_file, other_file


def test_https_goes_to_the_original_destination_without_routes(pod: PodNetwork, base: Path) -> None:
    """No --route: the sidecar reaches api.github.com and github.com where the agent was
    going (the emulator's TLS port on the host), verifying its certificate with
    --upstream-ca, as it would reach GitHub itself."""
    emulator, ca_file, _ = https_github(pod, base)
    with emulator:
        ready = emulator.wait_for(r"github emulator ready (\S+)", timeout=30).group(1)
        github = f"https://{pod.host_ip}:443"
        assert ready == github, ready
        seed(github, verify=str(ca_file))
        pod.write_hosts({"api.github.com": pod.host_ip, "github.com": pod.host_ip})
        sidecar, data = start_sidecar(
            pod, base, "--rules", str(packs_dir() / "github.yaml"),
            "--upstream-ca", str(ca_file),
        )  # fmt: skip
        with sidecar:
            printed = apply_redirect(pod)
            assert "-p tcp --dport 443 -j REDIRECT --to-ports 7301" in printed

            first, _ = run_agent_twice(pod, base, data, CLIENT)
            state = requests.get(f"{github}/_emulator/state", verify=str(ca_file), timeout=10)
            assert_done_once(state.json(), first, pod)

            # Its connections to the emulator's port 443 were not looped back into it.
            assert_not_looped_and_redirected(pod, 443)


UNTRUSTED_CLIENT = r"""
import subprocess, requests

listed = subprocess.run(["git", "ls-remote", "https://github.com/acme/app.git"],
                        capture_output=True, text=True)
print("ls-remote", listed.returncode, listed.stderr.replace("\n", " | "), flush=True)
pull = requests.post(
    "https://api.github.com/repos/acme/app/pulls",
    json={"title": "Order cancellation", "head": "agent/312-orders", "base": "main"},
    headers={"Authorization": "token agent-token"}, timeout=30,
)
print("pull", pull.status_code, pull.text.replace("\n", " "), flush=True)
"""


def test_an_upstream_certificate_the_sidecar_does_not_trust_fails_the_request(
    pod: PodNetwork, base: Path
) -> None:
    """The emulator's certificate is signed by a CA the sidecar was not told to trust:
    the agent (which trusts the sidecar) gets 502 from the sidecar for both the relayed
    git traffic and the PR, the PR never reaches the emulator, and nothing is recorded
    as completed."""
    emulator, ca_file, other_file = https_github(pod, base)
    with emulator:
        emulator.wait_for(r"github emulator ready", timeout=30)
        github = f"https://{pod.host_ip}:443"
        seed(github, verify=str(ca_file))
        pod.write_hosts({"api.github.com": pod.host_ip, "github.com": pod.host_ip})
        sidecar, data = start_sidecar(
            pod, base, "--rules", str(packs_dir() / "github.yaml"),
            "--upstream-ca", str(other_file),
        )  # fmt: skip
        with sidecar:
            apply_redirect(pod)
            script = base / "untrusted.py"
            script.write_text(UNTRUSTED_CLIENT)
            home = owned_dir(base / "agent", AGENT_UID)
            done = pod.run(
                [sys.executable, str(script)],
                uid=AGENT_UID,
                env=agent_env(home, data / "ca-bundle.pem"),
            )
            assert done.returncode == 0, f"{done.stdout}\n{done.stderr}"
            listed = re.search(r"^ls-remote (\d+) (.*)$", done.stdout, re.MULTILINE)
            assert listed, done.stdout
            # mitmproxy answers 502 for the upstream it could not verify; git says so.
            assert listed.group(1) != "0", done.stdout
            assert "502" in listed.group(2), done.stdout
            pull = re.search(r"^pull (\d+) (.*)$", done.stdout, re.MULTILINE)
            assert pull, done.stdout
            assert pull.group(1) == "502", done.stdout
            assert "CERTIFICATE_VERIFY_FAILED" in pull.group(2), done.stdout

            state = requests.get(f"{github}/_emulator/state", verify=str(ca_file), timeout=10)
            assert state.json()["repos"][REPO]["pulls"] == []
            # Logged before it was sent, then failed: the handshake failed, so nothing
            # reached GitHub and a retry (once the CA is right) simply sends it.
            effects = effects_by_rule(pod)
            assert set(effects) == {"github.pulls.create"}, effects
            assert effects["github.pulls.create"]["state"] == "failed", effects
            assert effects["github.pulls.create"]["response"] is None, effects


@pytest.fixture
def cluster(pod: PodNetwork, base: Path) -> Iterator[PgCluster]:
    """A private PostgreSQL on the host's end of the pod's veth."""
    server = private_cluster(
        base / "pg",
        hba=[f"host all all {pod.pod_ip}/32 trust"],
        settings={"listen_addresses": f"'{pod.host_ip}'"},
    )
    server.host = pod.host_ip
    try:
        yield server
    finally:
        server.stop()


def test_unmodified_postgresql_client_goes_through_the_relay(
    pod: PodNetwork, base: Path, cluster: PgCluster
) -> None:
    # --pg-upstream names a port where nothing listens: only the original destination
    # of the redirected connection (SO_ORIGINAL_DST) can take the agent to its server.
    args = [
        "--rules", str(packs_dir() / "postgres.yaml"),
        "--pg-listen", "127.0.0.1:7302", "--pg-upstream", "postgresql://127.0.0.1:9",
    ]  # fmt: skip
    url = f"postgresql://{SUPERUSER}@{pod.host_ip}:{cluster.port}/postgres"
    migration = "CREATE TABLE orders_312 (id int PRIMARY KEY, total int)"
    # The agent, then the agent resumed from the top in a new pod (a Job's retry): a new
    # sidecar, a new attempt of the task.  (Inside one attempt, running the statement
    # again would be new work: SPEC §3.9.)
    for attempt in (1, 2):
        sidecar, _ = start_sidecar(pod, base, *args, log=f"sidecar-{attempt}.log")
        with sidecar:
            if attempt == 1:
                printed = apply_redirect(pod, "--pg-ports", str(cluster.port))
                assert f"--dport {cluster.port} -j REDIRECT --to-ports 7302" in printed
            home = owned_dir(base / f"agent-{attempt}", AGENT_UID)
            done = pod.run(
                ["psql", "-X", "-v", "ON_ERROR_STOP=1", "-c", migration, url],
                uid=AGENT_UID,
                env={"PATH": os.environ["PATH"], "HOME": str(home)},
            )
            assert done.returncode == 0, f"attempt {attempt}: {done.stdout}{done.stderr}"
            assert "CREATE TABLE" in done.stdout
            if attempt == 1:
                assert sidecar.terminate() == 0  # releases the lease on its way out
                continue

            # The database: the table exists, created once (the second run was answered
            # from the record the relay keeps in the agent's own database).
            tables = "SELECT count(*) FROM pg_tables WHERE tablename = 'orders_312'"
            assert cluster.sql(tables) == "1"
            assert cluster.sql("SELECT count(*) FROM effect_sidecar.effects") == "1"
            effect = effects_by_rule(pod)["postgres.ddl"]
            assert effect["state"] == "completed", effect
            assert "replayed" in [event["event"] for event in effect["events"]], effect

            assert_not_looped_and_redirected(pod, cluster.port)


CONNECT = """
import socket, sys
try:
    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=5).close()
    print("connected")
except OSError as error:
    print(type(error).__name__)
"""


def test_ipv6_on_redirected_ports_fails_closed(pod: PodNetwork, base: Path) -> None:
    """IPv6 is not redirected (the sidecar listens on IPv4 loopback): the agent's IPv6
    connections on redirected ports are reset instead of escaping the sidecar; the
    sidecar's own uid and other ports are untouched."""
    if not pod.host_ip6:
        pytest.skip("IPv6 is disabled on this machine")
    listeners = []
    for port in (443, 8080):
        listener = socket.create_server((pod.host_ip6, port), family=socket.AF_INET6)
        listeners.append(listener)
    try:
        printed = apply_redirect(pod)
        assert "-p tcp --dport 443 -j REJECT --reject-with tcp-reset" in printed
        script = base / "connect.py"
        script.write_text(CONNECT)

        def connect(uid: int, port: int) -> str:
            done = pod.run([sys.executable, str(script), pod.host_ip6, str(port)], uid=uid)
            assert done.returncode == 0, done.stderr
            return done.stdout.strip()

        assert connect(AGENT_UID, 443) == "ConnectionRefusedError"
        assert connect(AGENT_UID, 8080) == "connected"
        assert connect(SIDECAR_UID, 443) == "connected"
    finally:
        for listener in listeners:
            listener.close()
