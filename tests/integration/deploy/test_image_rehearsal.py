"""deploy/Dockerfile rehearsed without docker: what can be proven of the image, proven.

No docker daemon and no base image here, so the build is replayed by reading the
Dockerfile itself:

* the build context is made the way BuildKit makes it: only what
  deploy/Dockerfile.dockerignore admits (Docker's documented matching, implemented below);
* the builder stage's own instructions (ENV, WORKDIR, COPY, and each RUN as ``/bin/sh -c``,
  as root, umask 022) run in a scratch root file system in which the image's absolute paths
  (/opt, /src, /var) are rebased; a Python 3.12 stands in for python:3.12-slim's
  /usr/local/bin/python, so the venv links to the base's interpreter as in the image;
* the final stage starts afresh: ``COPY --from=builder`` brings back only what it names,
  at the same path (the venv's scripts name their interpreter by absolute path), the
  RUN's ``useradd`` is stood in for by a home directory owned by the uid, ENV/WORKDIR/USER
  are applied, and ENTRYPOINT/CMD are what is run, as that uid (``setpriv``, when root),
  with the image's environment only and outside the repository.

Not rehearsed: the base image itself, its apt packages (the host's ca-certificates, git
and iptables stand in; no test here needs them), PIP_NO_CACHE_DIR (dropped so that pip's
cache may serve re-runs), and pip's configuration on this machine (ignored: the image has
none). The dependencies come from PyPI: without it these tests skip, under CI=true they
fail.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import NoReturn

import pytest

from sidecar.rules.loader import load_rules
from sidecar.rules.packs import default_rule_paths
from sidecar.testing.processes import Child, ProcessFailed

REPO = Path(__file__).resolve().parents[3]
DOCKERFILE = REPO / "deploy" / "Dockerfile"
DOCKERIGNORE = REPO / "deploy" / "Dockerfile.dockerignore"

# The builder's install command; the rehearsal runs the Dockerfile's RUN line, so this
# names what must be in it for the rehearsal to prove what deploy/README.md says.
PIP_INSTALL = "pip install --only-binary=:all: --no-binary=effect-sidecar ."
# Top-level directories the Dockerfile writes; in the rehearsal they live under its root.
IMAGE_DIRS = ("opt", "src", "var")
IMAGE_PATH = re.compile(r"(?<![\w.$/-])/(?=(?:opt|src|var)(?:/|$|[\s:'\"]))")
# python:3.12-slim's PATH and LANG (its /usr/local/bin holds the interpreter).
BASE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
BASE_ENV = {"LANG": "C.UTF-8"}
# ENV of the builder the rehearsal leaves out: pip's cache serves its re-runs.
NOT_REHEARSED_ENV = {"PIP_NO_CACHE_DIR"}
# How this host reaches PyPI, passed to the builder's RUNs (the image build has its own).
NETWORK_SETTINGS = (
    *("HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "http_proxy", "https_proxy", "no_proxy"),
    *("PIP_INDEX_URL", "PIP_CERT", "PIP_DEFAULT_TIMEOUT"),
    *("SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE"),
)


def prerequisite(reason: str) -> NoReturn:
    if os.environ.get("CI") == "true":
        pytest.fail(f"{reason} (CI=true: the image rehearsal needs it)")
    pytest.skip(reason)


def needs_pypi[F: Callable[..., object]](test: F) -> F:
    """Marks a test that uses the rehearsed image: PyPI, and a cold build's time."""
    marked: F = pytest.mark.timeout(900)(pytest.mark.needs_pypi(test))
    return marked


# --- .dockerignore, read and matched as Docker documents it ---------------------------


@dataclass(frozen=True)
class IgnorePattern:
    text: str
    negated: bool  # a "!" line: admits again what earlier lines excluded
    regex: re.Pattern[str]


def read_dockerignore(text: str) -> list[IgnorePattern]:
    """The patterns of a .dockerignore: comments and blank lines dropped, each pattern
    cleaned (filepath.Clean, no leading "/"), as moby's ignorefile.ReadAll does."""
    patterns = []
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        pattern = line.strip()
        if not pattern:
            continue
        negated = pattern.startswith("!")
        if negated:
            pattern = pattern[1:].strip()
        pattern = os.path.normpath(pattern)
        if len(pattern) > 1 and pattern.startswith("/"):
            pattern = pattern.lstrip("/")
        patterns.append(IgnorePattern(pattern, negated, _compile(pattern)))
    return patterns


def _compile(pattern: str) -> re.Pattern[str]:
    """A pattern's regular expression, as patternmatcher's compile builds it: ``**``
    spans directories, ``*`` and ``?`` stay within one, ``\\`` escapes, [classes] pass."""
    out = "^"
    i = 0
    while i < len(pattern):
        ch = pattern[i]
        i += 1
        if ch == "*" and pattern[i : i + 1] == "*":
            i += 1
            if pattern[i : i + 1] == "/":
                i += 1
            out += ".*" if i == len(pattern) else "(.*/)?"
        elif ch == "*":
            out += "[^/]*"
        elif ch == "?":
            out += "[^/]"
        elif ch == "\\" and i < len(pattern):
            out += re.escape(pattern[i])
            i += 1
        elif ch in ".+()|{}$":
            out += "\\" + ch
        else:
            out += ch
    return re.compile(out + "$")


def excluded(path: str, patterns: Sequence[IgnorePattern]) -> bool:
    """Whether the context leaves ``path`` out (patternmatcher.MatchesOrParentMatches): the
    last pattern matching the path, or one of its parent directories, decides."""
    parents = path.split("/")[:-1]
    matched = False
    for pattern in patterns:
        if pattern.negated != matched:
            continue  # cannot change the outcome
        hit = bool(pattern.regex.match(path)) or any(
            pattern.regex.match("/".join(parents[: n + 1])) for n in range(len(parents))
        )
        if hit:
            matched = not pattern.negated
    return matched


def build_context(repo: Path, patterns: Sequence[IgnorePattern], into: Path) -> list[str]:
    """Copy into ``into`` the files of ``repo`` the patterns admit; their paths, sorted."""
    readmitting = [p.text for p in patterns if p.negated]
    admitted = []
    for folder, dirs, files in os.walk(repo):
        here = Path(folder).relative_to(repo).as_posix()
        prefix = "" if here == "." else f"{here}/"
        # An excluded folder is not walked unless a "!" pattern could admit something in it.
        dirs[:] = sorted(
            d
            for d in dirs
            if not excluded(prefix + d, patterns)
            or any(p.startswith(f"{prefix}{d}/") or p[0] in "*?[\\" for p in readmitting)
        )
        for name in files:
            path = prefix + name
            if not excluded(path, patterns):
                (into / path).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(repo / path, into / path, follow_symlinks=False)
                admitted.append(path)
    return sorted(admitted)


# --- deploy/Dockerfile, read --------------------------------------------------------


@dataclass(frozen=True)
class Instruction:
    keyword: str
    args: str
    line: int

    def __str__(self) -> str:
        return f"deploy/Dockerfile:{self.line}: {self.keyword} {' '.join(self.args.split())}"


def read_dockerfile(text: str) -> tuple[dict[str, str], list[list[Instruction]]]:
    """The global ARGs and the stages' instructions; a continued line (``\\``) is joined
    as Docker joins it, comment lines inside it dropped."""
    instructions = []
    pending: list[str] = []
    start = 0
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        if not pending:
            start = number
        if line.rstrip().endswith("\\"):
            pending.append(line.rstrip()[:-1])
            continue
        keyword, _, args = "".join([*pending, line]).strip().partition(" ")
        instructions.append(Instruction(keyword.upper(), args.strip(), start))
        pending = []
    assert not pending, "deploy/Dockerfile ends inside a continued line"
    arguments: dict[str, str] = {}
    stages: list[list[Instruction]] = []
    for instruction in instructions:
        if instruction.keyword == "FROM":
            stages.append([instruction])
        elif stages:
            stages[-1].append(instruction)
        elif instruction.keyword == "ARG":
            name, _, default = instruction.args.partition("=")
            arguments[name] = default
        else:
            pytest.fail(f"{instruction}: only ARG may come before the first FROM")
    return arguments, stages


def expand(text: str, variables: dict[str, str]) -> str:
    """``$NAME`` and ``${NAME}`` replaced, as in ENV and FROM (unset: empty)."""
    return re.sub(r"\$(?:\{(\w+)\}|(\w+))", lambda m: variables.get(m[1] or m[2], ""), text)


def python_version(image: str) -> str:
    found = re.fullmatch(r"python:(3\.\d+)(?:\.\d+)?-slim(?:-\w+)?(?:@sha256:[0-9a-f]+)?", image)
    assert found, f"the rehearsal stands in for python:3.X-slim images only, not {image}"
    return found.group(1)


# --- the interpreter standing in for the base image's ---------------------------------


@dataclass(frozen=True)
class Interpreter:
    path: Path
    version: str
    how: str


def _version_of(candidate: str | Path) -> str | None:
    try:
        done = subprocess.run(
            [candidate, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    except OSError:
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def find_python(version: str) -> Interpreter:
    """Python ``version``: on PATH, else in pyenv's versions (its shims answer "command not
    found" for a version not selected), else this interpreter if it is as new."""
    on_path = shutil.which(f"python{version}")
    if on_path and _version_of(on_path) == version:
        return Interpreter(Path(on_path), version, f"python{version} on PATH")
    if pyenv := shutil.which("pyenv"):
        root = subprocess.run(
            [pyenv, "root"], capture_output=True, text=True, timeout=30, check=False
        ).stdout.strip()
        found = Path(root, "versions").glob(f"{version}.*/bin/python3") if root else []
        for candidate in sorted(found, key=lambda p: [int(n) for n in p.parts[-3].split(".")]):
            if _version_of(candidate) == version:
                return Interpreter(candidate, version, "pyenv")
    mine = "{}.{}".format(*sys.version_info[:2])
    if sys.version_info[:2] >= tuple(int(n) for n in version.split(".")):
        how = f"this interpreter, not the image's {version}"
        return Interpreter(Path(sys.executable), mine, how)
    prerequisite(f"no Python {version} (python{version} on PATH, pyenv) and this is {mine}")


def pypi_problem(env: dict[str, str]) -> str | None:
    """Why pip cannot reach PyPI from here, or None."""
    done = subprocess.run(
        [sys.executable, "-m", "pip", "index", "versions", "setuptools"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    return None if done.returncode == 0 else f"pip cannot reach PyPI: {done.stderr.strip()}"


# --- the rehearsal ------------------------------------------------------------------------


@dataclass
class Image:
    """The rehearsed image: its root file system and its configuration."""

    root: Path
    env: dict[str, str]
    workdir: Path
    uid: int
    gid: int
    entrypoint: list[str]
    cmd: list[str]
    interpreter: Interpreter
    venv: Path
    ran: list[Instruction]

    def exec(self, argv: Sequence[str]) -> list[str]:
        """``argv`` as the container would run it: the program found on the image's PATH,
        as the image's USER (setpriv, when root; otherwise as whoever runs the tests)."""
        program = shutil.which(argv[0], path=self.env["PATH"])
        assert program, f"{argv[0]} is not on the image's PATH"
        return [*self.as_user(), program, *argv[1:]]

    def argv(self, args: Sequence[str] | None = None) -> list[str]:
        """``docker run IMAGE [ARGS]``: the ENTRYPOINT with ARGS, or with CMD."""
        return self.exec([*self.entrypoint, *(self.cmd if args is None else args)])

    def as_user(self) -> list[str]:
        if os.geteuid() != 0:
            return []
        setpriv = shutil.which("setpriv")
        if setpriv is None:
            prerequisite("setpriv (util-linux) is not installed: cannot run as the image's uid")
        prefix = [setpriv, f"--reuid={self.uid}", f"--regid={self.gid}", "--clear-groups"]
        # An interpreter under a private home (/root/.pyenv) is reachable for the uid
        # only with CAP_DAC_READ_SEARCH (as in tests/support/netns.py); the image's is
        # public and needs nothing.
        here = self.interpreter.path.resolve().parent
        if any(not os.stat(d).st_mode & 0o001 for d in (here, *here.parents)):
            prefix += ["--inh-caps=+dac_read_search", "--ambient-caps=+dac_read_search"]
        return [*prefix, "--"]

    def run(self, argv: Sequence[str]) -> subprocess.CompletedProcess[str]:
        return subprocess.run(  # noqa: PLW1510 - callers check
            argv, env=self.env, cwd=self.workdir, capture_output=True, text=True, timeout=120
        )

    def own(self, path: Path) -> None:
        """Give ``path`` to the image's user (when root: otherwise it is ours already)."""
        if os.geteuid() == 0:
            os.chown(path, self.uid, self.gid)


@dataclass
class Rehearsal:
    """Replays the Dockerfile's stages in ``root``, a stand-in for the image's file system."""

    work: Path
    interpreter: Interpreter
    timings: list[tuple[str, float]] = field(default_factory=list)
    ran: list[Instruction] = field(default_factory=list)
    stood_in: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.root = self.work / "rootfs"
        self.context = self.work / "context"
        self.base_bin = self.root / "usr" / "local" / "bin"
        self.base_bin.mkdir(parents=True)
        for name in ("python", "python3", f"python{self.interpreter.version}"):
            (self.base_bin / name).symlink_to(self.interpreter.path.resolve())
        self.network = {
            "HOME": os.environ.get("HOME", "/root"),  # pip's cache
            "PIP_CONFIG_FILE": os.devnull,  # this machine's pip configuration is not the image's
            **{name: os.environ[name] for name in NETWORK_SETTINGS if name in os.environ},
        }
        self.pypi_checked = False
        self.stage_start()

    def stage_start(self) -> None:
        self.env = {"PATH": BASE_PATH.replace("/usr/local/bin", str(self.base_bin)), **BASE_ENV}
        self.workdir = self.root
        self.user: tuple[int, int] | None = None
        self.home: tuple[int, Path] | None = None
        self.entrypoint: list[str] = []
        self.cmd: list[str] = []

    def rebase(self, text: str) -> str:
        return IMAGE_PATH.sub(f"{self.root}/", text)

    def timed(self, label: str, started: float) -> None:
        self.timings.append((label, time.monotonic() - started))

    def make_context(self) -> list[str]:
        started = time.monotonic()
        patterns = read_dockerignore(DOCKERIGNORE.read_text(encoding="utf-8"))
        self.context.mkdir()
        files = build_context(REPO, patterns, self.context)
        self.timed("context", started)
        return files

    def build(self) -> Image:
        arguments, stages = read_dockerfile(DOCKERFILE.read_text(encoding="utf-8"))
        assert len(stages) == 2, "the rehearsal knows a builder and a final stage"
        builder, final = stages
        for i, stage in enumerate(stages):
            image, _, alias = expand(stage[0].args, arguments).partition(" AS ")
            assert python_version(image) == self.interpreter.version or "not the image" in (
                self.interpreter.how
            )
            assert alias == ("builder" if i == 0 else ""), stage[0]
        self.make_context()
        for instruction in builder[1:]:
            self.builder_step(instruction)
        self.final_stage(final)
        assert self.user is not None, "the final stage has no USER"
        venv = self.root / "opt" / "effect-sidecar"
        return Image(
            root=self.root,
            env=self.env,
            workdir=self.workdir,
            uid=self.user[0],
            gid=self.user[1],
            entrypoint=self.entrypoint,
            cmd=self.cmd,
            interpreter=self.interpreter,
            venv=venv,
            ran=self.ran,
        )

    def builder_step(self, instruction: Instruction) -> None:
        match instruction.keyword:
            case "ENV":
                self.set_env(instruction)
            case "WORKDIR":
                self.set_workdir(instruction)
            case "COPY":
                self.copy(instruction)
            case "RUN":
                self.run(instruction)
            case _:
                pytest.fail(f"{instruction}: not rehearsed in the builder (teach this test)")
        self.ran.append(instruction)

    def final_stage(self, stage: list[Instruction]) -> None:
        # A new stage starts from the base: the builder's files are set aside.
        builder = self.work / "builder-stage"
        for top in IMAGE_DIRS:
            if (self.root / top).exists():
                builder.mkdir(exist_ok=True)
                (self.root / top).rename(builder / top)
        self.stage_start()
        for instruction in stage[1:]:
            match instruction.keyword:
                case "RUN":
                    self.stand_in(instruction)
                case "COPY":
                    self.copy_from(instruction, builder)
                case "ENV":
                    self.set_env(instruction)
                case "WORKDIR":
                    self.set_workdir(instruction)
                case "USER":
                    uid, _, gid = instruction.args.partition(":")
                    assert uid.isdigit(), f"{instruction}: not numeric"
                    assert gid.isdigit(), f"{instruction}: not numeric"
                    self.user = (int(uid), int(gid))
                case "ENTRYPOINT":
                    self.entrypoint = self.exec_form(instruction)
                case "CMD":
                    self.cmd = self.exec_form(instruction)
                case _:
                    pytest.fail(f"{instruction}: not rehearsed in the final stage")
            self.ran.append(instruction)
        # Docker sets HOME from the user's passwd entry when the image does not.
        if self.home and self.user and self.home[0] == self.user[0]:
            self.env.setdefault("HOME", str(self.home[1]))

    def set_env(self, instruction: Instruction) -> None:
        for word in shlex.split(instruction.args):
            name, equals, value = word.partition("=")
            assert equals, f"{instruction}: only the ENV NAME=VALUE form is rehearsed"
            if name in NOT_REHEARSED_ENV:
                self.stood_in.append(f"ENV {name} not set")
                continue
            self.env[name] = self.rebase(expand(value, self.env))

    def set_workdir(self, instruction: Instruction) -> None:
        assert instruction.args.startswith("/"), f"{instruction}: relative WORKDIR"
        self.workdir = Path(self.rebase(instruction.args))
        self.workdir.mkdir(parents=True, exist_ok=True)

    def copy(self, instruction: Instruction) -> None:
        *sources, dest = shlex.split(instruction.args)
        assert not any(s.startswith("--") for s in sources), f"{instruction}: flags"
        target = Path(self.rebase(dest)) if dest.startswith("/") else self.workdir / dest
        into = dest.endswith("/") or len(sources) > 1
        for source in sources:
            found = self.context / source
            # What docker reports as "not found in build context" (e.g. .dockerignore'd).
            assert found.exists(), f"{instruction}: {source} is not in the build context"
            if found.is_dir():  # a directory's contents are copied, not the directory
                shutil.copytree(found, target, symlinks=True, dirs_exist_ok=True)
            else:
                file = target / found.name if into else target
                file.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(found, file)

    def copy_from(self, instruction: Instruction, builder: Path) -> None:
        flag, source, dest = shlex.split(instruction.args)
        assert flag == "--from=builder", f"{instruction}: only --from=builder is rehearsed"
        # The venv's scripts and pyvenv.cfg name absolute paths: it must land where it was made.
        assert source == dest, f"{instruction}: the venv must keep its path"
        assert source.startswith("/"), instruction
        assert source.split("/")[1] in IMAGE_DIRS, instruction
        target = Path(self.rebase(dest))
        target.parent.mkdir(parents=True, exist_ok=True)
        (builder / source.lstrip("/")).rename(target)

    def run(self, instruction: Instruction) -> None:
        command = self.rebase(instruction.args)
        env = {**self.env, **self.network}
        if "pip install" in command and not self.pypi_checked:
            problem = pypi_problem({"PATH": os.environ.get("PATH", BASE_PATH), **self.network})
            if problem:
                prerequisite(problem)
            self.pypi_checked = True
        started = time.monotonic()
        done = subprocess.run(
            ["/bin/sh", "-c", command],
            cwd=self.workdir,
            env=env,
            capture_output=True,
            text=True,
            timeout=900,
            umask=0o022,
            check=False,
        )
        self.timed(f"RUN :{instruction.line}", started)
        assert done.returncode == 0, f"{instruction}\n{(done.stdout + done.stderr)[-4000:]}"

    def stand_in(self, instruction: Instruction) -> None:
        """The final stage's RUN installs Debian packages and adds the user: the packages
        are the host's, the user is a home directory owned by its uid."""
        found = re.search(r"\buseradd\b([^&;|]*)", instruction.args)
        assert found, f"{instruction}: the rehearsal stands in for a RUN with useradd only"
        parser = argparse.ArgumentParser(add_help=False)
        parser.add_argument("--uid", type=int, required=True)
        parser.add_argument("--gid", type=int, required=True)
        parser.add_argument("--home-dir", required=True)
        parser.add_argument("--create-home", action="store_true")
        useradd, _ = parser.parse_known_args(shlex.split(found.group(1)))
        assert useradd.create_home, f"{instruction}: useradd without --create-home"
        home = Path(self.rebase(useradd.home_dir))
        home.mkdir(parents=True)
        if os.geteuid() == 0:
            os.chown(home, useradd.uid, useradd.gid)
        self.home = (useradd.uid, home)
        packages = re.findall(r"apt-get install ([^&]*)", instruction.args)
        named = " ".join(w for p in packages for w in shlex.split(p) if not w.startswith("-"))
        self.stood_in.append(f"apt-get install {named} (the host's)")

    @staticmethod
    def exec_form(instruction: Instruction) -> list[str]:
        words = json.loads(instruction.args)
        assert isinstance(words, list), f"{instruction}: shell form is not rehearsed"
        return [str(w) for w in words]

    def summary(self) -> str:
        steps = ", ".join(f"{label} {seconds:.1f}s" for label, seconds in self.timings)
        total = sum(seconds for _, seconds in self.timings)
        return (
            f"image rehearsal: Python {self.interpreter.version} ({self.interpreter.how}: "
            f"{self.interpreter.path}); {steps}; build {total:.1f}s; not rehearsed: "
            f"{'; '.join(self.stood_in)}"
        )


@pytest.fixture(scope="module")
def image(request: pytest.FixtureRequest) -> Iterator[Image]:
    """deploy/Dockerfile, rehearsed once for the module."""
    arguments, _ = read_dockerfile(DOCKERFILE.read_text(encoding="utf-8"))
    interpreter = find_python(python_version(arguments["PYTHON_IMAGE"]))
    # Public (0755), as the image's /opt is to its user; pytest's own tmp is private.
    work = Path(tempfile.mkdtemp(prefix="effect-sidecar-image-"))
    work.chmod(0o755)
    try:
        rehearsal = Rehearsal(work, interpreter)
        built = rehearsal.build()
        say(request, rehearsal.summary())
        yield built
    finally:
        shutil.rmtree(work, ignore_errors=True)


def say(request: pytest.FixtureRequest, line: str) -> None:
    """A line on the terminal, past pytest's output capture (as ``-s`` would show it)."""
    plugins = request.config.pluginmanager
    reporter, capture = plugins.get_plugin("terminalreporter"), plugins.get_plugin("capturemanager")
    if reporter is None or capture is None:
        return
    with capture.global_and_fixture_disabled():
        reporter.write_line(f"\n{line}")


def dev_rule_names() -> list[str]:
    """The rules a development install loads by default (the repository's rules/)."""
    return [rule.name for rule in load_rules(default_rule_paths())]


def get(url: str) -> tuple[int, bytes]:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback only
    with opener.open(url, timeout=10) as response:
        return response.status, response.read()


# --- the context ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "sent"),
    [
        ("pyproject.toml", True),
        ("README.md", True),
        ("sidecar/__init__.py", True),
        ("sidecar/store/sql/sqlite/schema.sql", True),
        ("rules/github.yaml", True),
        ("sidecar/__pycache__/cli.cpython-312.pyc", False),
        ("sidecar/cli/__pycache__/serve.cpython-312.pyc", False),
        ("sidecar/stray.pyc", False),
        ("rules/__pycache__/x", False),
        (".venv/bin/python", False),
        (".git/HEAD", False),
        ("effect_sidecar.egg-info/PKG-INFO", False),
        ("tests/conftest.py", False),
        ("deploy/Dockerfile", False),
        ("bench/control_api.py", False),
        ("run", False),
        ("sidecarx/a.py", False),
        ("docs/sidecar/a.py", False),
    ],
)
def test_dockerignore_sends_the_sources_only(path: str, sent: bool) -> None:
    patterns = read_dockerignore(DOCKERIGNORE.read_text(encoding="utf-8"))
    assert excluded(path, patterns) is not sent


def test_dockerignore_matching_is_moby_s() -> None:
    """The matcher's rules on patterns beyond the file's: last match wins, a folder's
    exclusion covers what is in it, ``**`` spans folders and ``*`` does not."""
    patterns = read_dockerignore("docs\n!docs/keep/**\ndocs/keep/*.tmp\n/a/*/c\n# x\n b? \n")
    assert [p.text for p in patterns] == ["docs", "docs/keep/**", "docs/keep/*.tmp", "a/*/c", "b?"]
    assert excluded("docs/x.md", patterns)
    assert not excluded("docs/keep/deep/x.md", patterns)
    assert excluded("docs/keep/x.tmp", patterns)
    assert not excluded("docs/keep/deep/x.tmp", patterns)
    assert excluded("a/b/c/d", patterns)
    assert not excluded("a/b/b/c", patterns)
    assert excluded("bz", patterns)
    assert not excluded("bzz", patterns)


@pytest.fixture(scope="module")
def context(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    into = tmp_path_factory.mktemp("context")
    patterns = read_dockerignore(DOCKERIGNORE.read_text(encoding="utf-8"))
    return into, build_context(REPO, patterns, into)


def test_context_holds_the_package_its_metadata_and_the_rule_packs(
    context: tuple[Path, list[str]],
) -> None:
    root, files = context
    assert {p.name for p in root.iterdir()} == {"pyproject.toml", "README.md", "sidecar", "rules"}
    assert not [f for f in files if "__pycache__" in f or f.endswith(".pyc")]
    sources = {
        p.relative_to(REPO).as_posix()
        for folder in ("sidecar", "rules")
        for p in (REPO / folder).rglob("*")
        if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"
    }
    assert sources <= set(files)
    assert any(f.startswith("sidecar/store/sql/") and f.endswith(".sql") for f in files)


def test_builder_runs_the_install_the_readme_describes() -> None:
    _, (builder, _) = read_dockerfile(DOCKERFILE.read_text(encoding="utf-8"))
    runs = [i.args for i in builder if i.keyword == "RUN"]
    assert any(PIP_INSTALL in run for run in runs), runs
    assert any("pip uninstall --yes pip" in run for run in runs), runs


# --- the image ----------------------------------------------------------------------------


@needs_pypi
def test_the_dockerfiles_own_instructions_built_the_image(image: Image) -> None:
    installs = [i for i in image.ran if i.keyword == "RUN" and PIP_INSTALL in i.args]
    assert len(installs) == 1
    assert [i.keyword for i in image.ran][-2:] == ["ENTRYPOINT", "CMD"]
    # Only what COPY --from names reached the final stage: no /src.
    assert sorted(p.name for p in image.root.iterdir()) == ["opt", "usr", "var"]
    assert not (image.root / "src").exists()


@needs_pypi
def test_venv_links_the_base_python_and_holds_no_pip(image: Image) -> None:
    version = image.interpreter.version
    cfg = (image.venv / "pyvenv.cfg").read_text(encoding="utf-8")
    assert f"home = {image.root}/usr/local/bin" in cfg.splitlines()
    assert not list((image.venv / "bin").glob("pip*"))
    assert not list((image.venv / "lib").glob("python*/site-packages/pip"))
    script = (image.venv / "bin" / "sidecar").read_text(encoding="utf-8").splitlines()[0]
    assert script == f"#!{image.venv}/bin/python"
    # compileall: the package's bytecode is there for a read-only root file system.
    package = image.venv / "lib" / f"python{version}" / "site-packages" / "sidecar"
    tag = f"cpython-{version.replace('.', '')}"
    assert (package / "serve" / "__pycache__" / f"server.{tag}.pyc").is_file()
    assert (package / "store" / "sql").is_dir()


@needs_pypi
def test_rule_packs_are_shipped_where_an_installed_sidecar_looks(image: Image) -> None:
    shipped = image.venv / "share" / "effect-sidecar" / "rules"
    assert sorted(p.name for p in shipped.iterdir()) == sorted(
        p.name for p in (REPO / "rules").iterdir()
    )
    probe = (
        "import sidecar, sidecar.rules.packs as r; print(sidecar.__file__); print(r.packs_dir())"
    )
    done = image.run(image.exec(["python", "-c", probe]))
    assert done.returncode == 0, done.stderr
    module, packs = done.stdout.splitlines()
    assert Path(module).is_relative_to(image.venv / "lib"), "the repository's sidecar ran"
    assert Path(packs) == shipped


@needs_pypi
def test_default_command_is_the_help(image: Image) -> None:
    argv = image.argv()
    assert argv[-2:] == [str(image.venv / "bin" / "sidecar"), "--help"]
    done = image.run(argv)
    assert done.returncode == 0, done.stderr
    for verb in ("serve", "redirect", "webhook", "inject"):
        assert verb in done.stdout


@needs_pypi
def test_serve_runs_as_1337_and_loads_the_shipped_rule_packs(image: Image) -> None:
    data = image.root.parent / "data"  # what an injected sidecar's emptyDir is
    data.mkdir()
    image.own(data)
    log = image.root.parent / "serve.log"
    argv = image.argv(["serve", "--data-dir", str(data)])
    argv += ["--control-listen", "127.0.0.1:0", "--proxy-listen", "127.0.0.1:0"]
    with Child(argv, env=image.env, cwd=image.workdir, stderr_path=log) as sidecar:
        try:
            ready = sidecar.wait_for(r"effect-sidecar ready control=(\S+) proxy=(\S+)", 60)
        except ProcessFailed as failed:
            pytest.fail(f"{failed}\n{log.read_text(errors='replace')[-4000:]}")
        control = ready.group(1)
        if os.geteuid() == 0:
            status = Path(f"/proc/{sidecar.pid}/status").read_text(encoding="utf-8")
            assert re.search(rf"^Uid:\s+{image.uid}\s+{image.uid}\s", status, re.M), status
        assert get(f"{control}/readyz")[0] == 200
        status_code, body = get(f"{control}/v1/proxy")
        assert status_code == 200
        rules = json.loads(body)["rules"]
        assert rules == dev_rule_names()
        assert any(r.startswith("github.") for r in rules)
        assert any(r.startswith("postgres.") for r in rules)
        assert sidecar.terminate() == 0, log.read_text(errors="replace")[-4000:]
    written = list(data.rglob("*"))
    assert written, "serve wrote nothing in --data-dir"
    assert {p.stat().st_uid for p in written} == {image.uid if os.geteuid() == 0 else os.getuid()}


@needs_pypi
def test_redirect_dry_run_prints_the_rules_without_privileges(image: Image) -> None:
    flags = ["--dry-run", "--proxy-port", "7301", "--pg-port", "7302", "--owner-uid", "1337"]
    done = image.run(image.argv(["redirect", *flags]))
    assert done.returncode == 0, done.stderr
    assert "-m owner --uid-owner 1337 -j RETURN" in done.stdout
    assert "--dport 443 -j REDIRECT --to-ports 7301" in done.stdout
    assert "--dport 5432 -j REDIRECT --to-ports 7302" in done.stdout
    dev = subprocess.run(
        [sys.executable, "-m", "sidecar", "redirect", *flags],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.stdout == dev.stdout
