"""``POST /v1/tasks/{task}/resume-check``: the resume checklist, run inside the sidecar.

The running sidecar has what the checklist needs loaded already: its store, its rules,
and its upstream client with the ``--route`` table (:data:`sidecar.control.keys.UPSTREAM`),
so ``sidecar resume TASK --control URL`` probes exactly as the proxy would.  The body may
give probe headers (the agent's credentials are never stored); they are used for this
check's probes only, never stored or echoed.  The answer is the same report the CLI
prints with ``--json`` (:class:`sidecar.resume.model.Report`), whatever the verdict:
the verdict is in it, not in the HTTP status.
"""

from __future__ import annotations

from typing import Annotated

from aiohttp import web
from pydantic import Field

from sidecar.control.endpoints import TASK_PROBLEMS, Api, json_answer, parse_body, task_param
from sidecar.control.keys import CLOCK, RULES, STORE, UPSTREAM
from sidecar.control.schemas import Request
from sidecar.rules import RuleSet

api = Api("resume")

HeaderName = Annotated[
    str, Field(min_length=1, max_length=256, pattern=r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")
]
HeaderValue = Annotated[str, Field(max_length=8192, pattern=r"^[^\r\n\x00]*$")]


class ResumeCheckRequest(Request):
    probe_headers: dict[HeaderName, HeaderValue] = Field(
        default_factory=dict,
        description="Headers every probe carries (e.g. Authorization): the agent's own "
        "credentials are never stored. Used for this check only.",
    )


@api.route(
    "POST",
    "/v1/tasks/{task}/resume-check",
    summary="The resume checklist, now: lease free or expired, store writable, last "
    "checkpoint, every pending/unknown effect probed, what the next attempt will do, "
    "fencing, and the verdict (exit_code 0 safe, 3 CANNOT DETERMINE, 4 lease held, 5 "
    "store unavailable). Claims nothing and records nothing.",
    body=ResumeCheckRequest,
    answer="sidecar.resume.model:Report",
    problems=TASK_PROBLEMS,
)
async def resume_check(request: web.Request) -> web.Response:
    # The checklist's modules load with the first check asked for, not with every sidecar.
    from sidecar.resume.checklist import run_checklist  # noqa: PLC0415
    from sidecar.resume.probing import Prober  # noqa: PLC0415

    task = task_param(request)
    body = await parse_body(request, ResumeCheckRequest)
    rules = request.app.get(RULES) or RuleSet()
    sender = request.app.get(UPSTREAM)
    prober = None if sender is None else Prober(rules, sender, list(body.probe_headers.items()))
    report = await run_checklist(
        request.app[STORE], task, rules=rules, prober=prober, clock=request.app[CLOCK]
    )
    return json_answer(report)
