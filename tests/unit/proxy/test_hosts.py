"""The host a request is for: mitmproxy's ``pretty_host``, parsed once per Host header."""

from __future__ import annotations

import pytest
from mitmproxy.test import tutils

from sidecar.proxy import hosts
from sidecar.proxy.hosts import request_host


@pytest.mark.parametrize(
    "host_header",
    [
        "api.github.com",
        "API.GitHub.com:8443",
        "127.0.0.1:7300",
        "[::1]:8080",
        "[2001:db8::1]",
        "xn--bcher-kva.example",
        "bücher.example",
        "not a host!",
        "host:notaport",
        "host:99999",
        "",
    ],
)
def test_the_host_is_the_one_mitmproxy_names_whatever_the_header_says(host_header: str):
    request = tutils.treq(host="10.0.0.7", port=443)
    if host_header:
        request.headers["Host"] = host_header
    else:
        request.headers.pop("Host", None)
    assert request_host(request) == request.pretty_host
    assert request_host(request) == request.pretty_host  # and again, from what was kept


@pytest.mark.parametrize("version", [b"HTTP/1.1", b"HTTP/2.0", b"HTTP/3"])
@pytest.mark.parametrize("authority", [b"", b"api.example.com:443"])
@pytest.mark.parametrize(
    "fields",
    [
        [],
        [(b"Host", b"a.example")],
        [(b"X-A", b"1"), (b"HOST", b"b.example:8080")],
        [(b"host", b"a.example"), (b"Host", b"b.example")],  # folded, as Headers.get folds
        [(b"Host", b"caf\xc3\xa9.example"), (b"Host", b"\xff")],
    ],
)
def test_the_host_header_read_is_mitmproxy_s(version, authority, fields):
    request = tutils.treq(http_version=version, authority=authority)
    request.headers.fields = tuple(fields)
    assert hosts._host_header(request) == request.host_header


def test_an_http2_request_is_named_by_its_authority():
    request = tutils.treq(http_version=b"HTTP/2.0", authority=b"api.example.com:443")
    request.headers.pop("Host", None)
    assert request_host(request) == request.pretty_host == "api.example.com"


def test_what_is_kept_is_bounded_in_number_and_length(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(hosts, "_kept", {})
    monkeypatch.setattr(hosts, "KEPT", 4)
    for n in range(10):
        request = tutils.treq()
        request.headers["Host"] = f"h{n}.example:8080"
        assert request_host(request) == f"h{n}.example"
    assert 0 < len(hosts._kept) <= 4
    long = tutils.treq()
    long.headers["Host"] = "a" * 5000
    assert request_host(long) == long.pretty_host
    assert "a" * 5000 not in hosts._kept
