"""``sidecar demo --matrix``: the failure-injection matrix of the reference agent.

The demo's coding agent (model call, git push, pull request, comment) runs against the
GitHub emulator and the model endpoint, under ``sidecar matrix``: every effect x every
fault, each cell checked on the emulator by :mod:`sidecar.demo.check`.  The shipped
github pack is used with its upstream timeouts and settle times cut to 2 s (the
emulator answers at once and does nothing after), so that an unknown outcome settles
in seconds rather than minutes.
"""

from __future__ import annotations

import sys
from pathlib import Path

import yaml

from sidecar.matrix.faults import chosen
from sidecar.matrix.run import Plan, run, summary
from sidecar.matrix.stack import Setup
from sidecar.rules import load_rules
from sidecar.rules.packs import packs_dir
from sidecar.testing.github import REPO, start_emulator
from sidecar.testing.processes import Child

QUICK_TIMEOUT_S = 2


def quick_rules(folder: Path) -> list[Path]:
    """The github pack with 2 s upstream timeouts, and the llm-cache pack."""
    pack = yaml.safe_load((packs_dir() / "github.yaml").read_text())
    for rule in pack["rules"]:
        if rule["effect"] == "non_idempotent":
            # The emulator does its work before it answers, never after: no settle time.
            rule["timeout_s"] = QUICK_TIMEOUT_S
            rule["settle_s"] = QUICK_TIMEOUT_S
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "github-quick.yaml"
    path.write_text(yaml.safe_dump(pack, sort_keys=False))
    return [path, packs_dir() / "llm-cache.yaml"]


def main(out: Path, *, jobs: int, faults: str | None) -> int:
    world = out / "world"
    world.mkdir(parents=True, exist_ok=True)
    emulator, github = start_emulator(world, "github", public_urls=True)
    model = Child.python("sidecar.demo.model", stderr_path=world / "model.log")
    try:
        model_url = model.wait_for(r"model ready (\S+)").group(1)
        rules = quick_rules(world)
        plan = Plan(
            Setup(
                agent=(sys.executable, "-m", "sidecar.demo.agent", "--repo", REPO),
                rules=tuple(rules),
                routes=(
                    f"api.github.com={github}",
                    f"github.com={github}",
                    f"api.openai.com={model_url}",
                ),
            ),
            load_rules(rules),
            chosen(faults),
            out,
            check=f"{sys.executable} -m sidecar.demo.check {github}",
            jobs=jobs,
        )
        result = run(plan)
    finally:
        model.kill()
        emulator.terminate()
    print(summary(result))
    return 1 if result.failed else 0
