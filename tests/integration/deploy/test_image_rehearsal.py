"""deploy/Dockerfile's build replayed without docker, and the result run.

tests/integration/deploy/test_manifests.py reads the Dockerfile's lines (base, USER,
ENTRYPOINT, apt packages); this module runs them.  The build context is the repository as
deploy/Dockerfile.dockerignore filters it (Docker's matching); the builder stage's ENV,
WORKDIR, COPY and RUN (``/bin/sh -c``) run in a scratch root in which the image's paths
(/opt, /src, /var) are rebased, this Python standing in for the base image's; the final
stage keeps only what ``COPY --from=builder`` names, and its ENTRYPOINT + CMD run with its
ENV.  Not rehearsed: the base image, its apt packages and user, running as uid 1337.  The
dependencies come from PyPI: without it the image tests skip (under CI=true they fail).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from sidecar.rules.loader import load_rules
from sidecar.rules.packs import default_rule_paths
from sidecar.testing.processes import Child

REPO = Path(__file__).resolve().parents[3]
DOCKERFILE = REPO / "deploy" / "Dockerfile"
IGNORE = (REPO / "deploy" / "Dockerfile.dockerignore").read_text(encoding="utf-8")
IMAGE_PATH = re.compile(r"(?<![\w.$/-])/(?=(?:opt|src|var)(?:/|$|[\s:'\"]))")


def instructions(text: str) -> list[list[str]]:
    """[KEYWORD, arguments] of each instruction: continuations joined, comments dropped."""
    lines = [line for line in text.splitlines() if not line.lstrip().startswith("#")]
    joined = "\n".join(lines).replace("\\\n", " ").splitlines()
    return [[w.split()[0].upper(), w.split(maxsplit=1)[1]] for w in joined if w.strip()]


def pattern_regex(pattern: str) -> re.Pattern[str]:
    """A .dockerignore pattern as moby compiles it: ``**`` spans folders, ``*``/``?`` don't."""
    parts = re.split(r"(\*\*/?|\*|\?)", os.path.normpath(pattern).lstrip("/"))
    table = {"**/": "(.*/)?", "**": ".*", "*": "[^/]*", "?": "[^/]"}
    return re.compile("".join(table.get(p, re.escape(p)) for p in parts) + "$")


def sent(path: str, ignore: str = IGNORE) -> bool:
    """Whether the build context holds ``path``: the last pattern matching the path or a
    parent folder decides (``!`` admits)."""
    prefixes = ["/".join(path.split("/")[: n + 1]) for n in range(path.count("/") + 1)]
    patterns = [p.strip() for p in ignore.splitlines() if p.strip() and p[0] != "#"]
    verdict = True
    for pattern in patterns:
        if any(pattern_regex(pattern.lstrip("!")).match(prefix) for prefix in prefixes):
            verdict = pattern.startswith("!")
    return verdict


@dataclass
class Image:
    root: Path  # the final stage's file system (the image's /opt and /var under it)
    env: dict[str, str]
    workdir: Path
    argv: list[str]  # ENTRYPOINT + CMD

    def command(self, args: list[str] | None = None) -> list[str]:
        """``docker run IMAGE [ARGS]``: the ENTRYPOINT with ARGS (or CMD), found on PATH."""
        argv = self.argv if args is None else [self.argv[0], *args]
        program = shutil.which(argv[0], path=self.env["PATH"])
        assert program, f"{argv[0]} is not on the image's PATH"
        return [program, *argv[1:]]

    def run(self, argv: list[str]) -> subprocess.CompletedProcess[str]:
        return run(argv, env=self.env, cwd=self.workdir)


def run(argv: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=900, check=False, **kwargs)


def build(work: Path) -> Image:
    """Replay deploy/Dockerfile's builder stage, then its final stage, under ``work``."""
    stages: list[list[list[str]]] = []
    for keyword, args in instructions(DOCKERFILE.read_text(encoding="utf-8")):
        if keyword == "FROM":
            stages.append([])
        elif stages:
            stages[-1].append([keyword, args])
    builder, final = stages
    base = work / "base" / "usr" / "local" / "bin"  # the base image's python
    base.mkdir(parents=True)
    for name in ("python", "python3"):
        (base / name).symlink_to(Path(sys.executable).resolve())
    context, root = work / "context", work / "root"
    for top in REPO.iterdir():  # the folders the context admits (no .git, no .venv)
        files = [top] if top.is_file() else top.rglob("*") if sent(top.name) else []
        for file in files:
            relative = file.relative_to(REPO).as_posix()
            if file.is_file() and sent(relative):
                (context / relative).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(file, context / relative)
    # How this machine reaches PyPI reaches the RUNs (its pip configuration does not).
    env = {"PATH": f"{base}:/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": str(Path.home())}
    network = ("PIP_INDEX_URL", "PIP_CERT", "SSL_CERT_FILE")
    env |= {k: v for k, v in os.environ.items() if k in network or k.lower().endswith("_proxy")}
    env["PIP_CONFIG_FILE"] = os.devnull
    done = run([sys.executable, "-m", "pip", "index", "versions", "setuptools"], env=env)
    if done.returncode != 0:  # no PyPI: skip, fail under CI=true
        reason = f"pip cannot reach PyPI: {done.stderr.strip()[-500:]}"
        (pytest.fail if os.environ.get("CI") == "true" else pytest.skip)(reason)
    workdir = root  # the base image's: /
    root.mkdir()
    for keyword, args in builder:
        rebased = IMAGE_PATH.sub(f"{root}/", args)
        if keyword == "ENV":
            for word in shlex.split(rebased):
                name, _, value = word.partition("=")
                if name != "PIP_NO_CACHE_DIR":  # pip's cache serves the re-runs
                    env[name] = value
        elif keyword == "WORKDIR":
            workdir = Path(rebased)
            workdir.mkdir(parents=True, exist_ok=True)
        elif keyword == "COPY":
            *sources, dest = shlex.split(rebased)
            target = Path(dest) if dest.startswith("/") else workdir / dest
            for source in sources:
                found = context / source
                assert found.exists(), f"COPY {args}: {source} is not in the build context"
                if found.is_dir():  # a directory's contents are copied, not the directory
                    shutil.copytree(found, target, dirs_exist_ok=True)
                else:
                    target.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(found, target / found.name)
        elif keyword == "RUN":
            done = run(["/bin/sh", "-c", rebased], cwd=workdir, env=env)
            assert done.returncode == 0, f"RUN {args}\n{(done.stdout + done.stderr)[-4000:]}"
        else:
            pytest.fail(f"{keyword} {args}: not rehearsed in the builder (teach this test)")
    # A new stage starts from the base: the builder's files are set aside, and only what
    # COPY --from names comes back, where it says (the venv's scripts name their path).
    aside = root.rename(work / "builder-stage")
    root.mkdir()
    image = Image(root, {"PATH": f"{base}:/usr/bin:/bin", "LANG": "C.UTF-8"}, root, [])
    for keyword, args in final:
        rebased = IMAGE_PATH.sub(f"{root}/", args)
        if keyword == "COPY":
            flag, source, dest = shlex.split(args)
            assert flag == "--from=builder", f"COPY {args}"
            (root / dest.lstrip("/")).parent.mkdir(parents=True, exist_ok=True)
            (aside / source.lstrip("/")).rename(root / dest.lstrip("/"))
        elif keyword == "ENV":
            for word in shlex.split(rebased):
                name, _, value = word.partition("=")
                image.env[name] = value.replace("$PATH", image.env["PATH"])
        elif keyword == "WORKDIR":
            image.workdir = Path(rebased)
            image.workdir.mkdir(parents=True, exist_ok=True)
            image.env["HOME"] = rebased  # the user's home, as useradd makes it
        elif keyword in {"ENTRYPOINT", "CMD"}:
            image.argv += json.loads(args)
        elif keyword not in {"RUN", "USER"}:  # apt packages and the user: test_manifests
            pytest.fail(f"{keyword} {args}: not rehearsed in the final stage")
    return image


@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Image]:
    work = tmp_path_factory.mktemp("image")
    yield build(work)
    shutil.rmtree(work, ignore_errors=True)


@pytest.mark.parametrize(
    ("path", "in_context"),
    [
        *((p, True) for p in ("pyproject.toml", "README.md", "sidecar/__init__.py")),
        *((p, True) for p in ("sidecar/store/sql/sqlite/schema.sql", "rules/github.yaml")),
        *((p, False) for p in ("sidecar/__pycache__/cli.cpython-312.pyc", "sidecar/x.pyc")),
        *((p, False) for p in ("rules/__pycache__/x", ".venv/bin/python", ".git/HEAD")),
        *((p, False) for p in ("tests/conftest.py", "deploy/Dockerfile", "run", "sidecarx/a")),
    ],
)
def test_the_build_context_holds_the_sources_only(path: str, in_context: bool) -> None:
    assert sent(path) is in_context


def test_the_context_matcher_is_dockers() -> None:
    ignore = "docs\n!docs/keep/**\ndocs/keep/*.tmp\n/a/*/c\n# x\n b? \n"
    paths = ["docs/x.md", "docs/keep/y/x.md", "docs/keep/x.tmp", "docs/keep/y/x.tmp"]
    paths += ["a/b/c/d", "a/b/b/c", "bz", "bzz"]
    assert [sent(path, ignore) for path in paths] == [False, True] * 4


@pytest.mark.needs_pypi
@pytest.mark.timeout(900)
def test_the_image_holds_a_compiled_venv_without_pip_and_nothing_of_the_build(
    image: Image,
) -> None:
    assert sorted(p.name for p in image.root.iterdir()) == ["opt", "var"]  # no /src
    venv = image.root / "opt" / "effect-sidecar"
    cfg = (venv / "pyvenv.cfg").read_text(encoding="utf-8").splitlines()
    assert any(line.startswith("home = ") and "/usr/local/bin" in line for line in cfg), cfg
    assert not list((venv / "bin").glob("pip*"))
    assert not list((venv / "lib").glob("python*/site-packages/pip"))
    (package,) = (venv / "lib").glob("python*/site-packages/sidecar")
    assert list((package / "serve" / "__pycache__").glob("server.cpython-*.pyc"))
    assert list((package / "store" / "sql").rglob("*.sql"))


@pytest.mark.needs_pypi
@pytest.mark.timeout(900)
def test_the_default_command_is_the_help(image: Image) -> None:
    done = image.run(image.command())
    assert done.returncode == 0, done.stderr
    for verb in ("serve", "redirect", "webhook", "inject"):
        assert verb in done.stdout


@pytest.mark.needs_pypi
@pytest.mark.timeout(900)
def test_serve_loads_the_rule_packs_shipped_in_the_image(image: Image) -> None:
    probe = "import sidecar.rules.packs as r; print(r.__file__); print(r.packs_dir())"
    done = image.run([str(image.root / "opt/effect-sidecar/bin/python"), "-c", probe])
    assert done.returncode == 0, done.stderr
    module, packs = map(Path, done.stdout.splitlines())
    assert module.is_relative_to(image.root / "opt"), "the repository's sidecar ran"
    assert packs == image.root / "opt/effect-sidecar/share/effect-sidecar/rules"
    argv = image.command(["serve", "--data-dir", str(image.workdir / "data")])
    argv += ["--control-listen", "127.0.0.1:0", "--proxy-listen", "127.0.0.1:0"]
    log = image.workdir / "serve.log"
    with Child(argv, env=image.env, cwd=image.workdir, stderr_path=log) as sidecar:
        control = sidecar.wait_for(r"effect-sidecar ready control=(\S+)", 60).group(1)
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        with opener.open(f"{control}/v1/proxy", timeout=10) as answer:
            rules = json.loads(answer.read())["rules"]
        assert sidecar.terminate() == 0, log.read_text(errors="replace")[-4000:]
    assert rules == [rule.name for rule in load_rules(default_rule_paths())]
    assert any(r.startswith("github.") for r in rules)
