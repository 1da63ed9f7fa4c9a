"""GET /v1/review/report: the review's HTML report, as the console shows it."""

from __future__ import annotations

from tests.unit.conftest import claim
from tests.unit.control.test_tasks_routes import problem_of


async def test_the_report_is_one_html_page_with_its_charts_and_no_script(client):
    await claim(client)
    response = await client.get("/v1/review/report?since=7d")
    assert response.status == 200
    assert response.content_type == "text/html"
    html = await response.text()
    assert '<section id="refusals">' in html
    assert "<svg" in html
    assert "<script" not in html


async def test_a_bad_period_is_a_problem(client):
    await problem_of(await client.get("/v1/review/report?since=soon"), 400, "invalid_request")
