"""GET /ui/: the console's static files, open without the token; its data is not."""

from __future__ import annotations

import re

import pytest

from sidecar.control.console import is_console_path
from tests.unit.control.test_tasks_routes import problem_of

ASSETS = ["index.html", "app.js", "api.js", "dom.js", "tasks.js", "task.js", "waiting.js",
          "review.js", "rules.js", "style.css", "icon.svg"]  # fmt: skip


async def test_the_root_redirects_to_the_console(client):
    response = await client.get("/", allow_redirects=False)
    assert response.status == 302
    assert response.headers["Location"] == "/ui/"


async def test_the_console_page_loads_its_modules_from_this_origin_only(client):
    response = await client.get("/ui/")
    assert response.status == 200
    assert response.content_type == "text/html"
    page = await response.text()
    assert '<script type="module" src="app.js">' in page
    assert not re.search(r"(src|href)=\"(https?:)?//", page), "nothing fetched from elsewhere"
    policy = response.headers["Content-Security-Policy"]
    assert "default-src 'self'" in policy
    assert "script-src 'self';" in policy
    assert response.headers["X-Content-Type-Options"] == "nosniff"


@pytest.mark.parametrize("name", ASSETS)
async def test_every_file_the_console_imports_is_shipped_and_typed(client, name):
    response = await client.get(f"/ui/{name}")
    assert response.status == 200, name
    kind = {"html": "text/html", "js": "text/javascript", "css": "text/css", "svg": "image/svg+xml"}
    assert response.content_type == kind[name.rsplit(".", 1)[1]]
    text = await response.text()
    assert "http://" not in text.replace("http://www.w3.org/2000/svg", "")
    assert "https://" not in re.sub(r"placeholder: \"https://[^\"]+\"", "", text)


async def test_the_modules_import_only_files_that_are_shipped(client):
    for name in ASSETS:
        if not name.endswith(".js"):
            continue
        text = await (await client.get(f"/ui/{name}")).text()
        for imported in re.findall(r'from "\./([^"]+)"', text):
            assert imported in ASSETS, f"{name} imports {imported}"


async def test_an_unchanged_file_is_answered_304(client):
    first = await client.get("/ui/app.js")
    again = await client.get("/ui/app.js", headers={"If-None-Match": first.headers["ETag"]})
    assert again.status == 304


@pytest.mark.parametrize("name", ["nope.js", "..%2Fapp.py", "app.py", ".hidden.js"])
async def test_a_file_the_console_does_not_ship_is_not_found(client, name):
    await problem_of(await client.get(f"/ui/{name}"), 404, "not_found")


async def test_with_a_token_the_page_is_open_and_its_data_is_not(make_client):
    client = await make_client(token="s3cret")
    assert (await client.get("/ui/")).status == 200
    assert (await client.get("/ui/app.js")).status == 200
    assert (await client.get("/", allow_redirects=False)).status == 302
    await problem_of(await client.get("/v1/tasks"), 401, "unauthorized")
    await problem_of(await client.get("/v1/rules"), 401, "unauthorized")
    await problem_of(await client.get("/ui/nope/../../v1/tasks"), 401, "unauthorized")
    listed = await client.get("/v1/tasks", headers={"Authorization": "Bearer s3cret"})
    assert listed.status == 200


def test_only_the_console_files_are_open_paths():
    assert is_console_path("/")
    assert is_console_path("/ui/")
    assert is_console_path("/ui/app.js")
    assert not is_console_path("/ui")
    assert not is_console_path("/ui/sub/app.js")
    assert not is_console_path("/ui/app.py")
    assert not is_console_path("/v1/tasks")
