"""The service's door: a foreign ``Origin`` (a web page's request, DNS rebinding) is
refused with 403 before anything else, at /mcp as the MCP specification requires and
at every route; a ``Host`` that is none of the service's names with 421
(commands/service/door.py, docs/service.md "Who may ask")."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from starlette.testclient import TestClient

import ledger
from commands.service import create_app
from commands.service.door import service_hosts
from tests.helpers import run_cli

MCP_HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
INITIALIZE = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {}}


@pytest.fixture
def url(tmp_path: Path) -> str:
    found = f"sqlite:///{tmp_path / 'evidence.db'}"
    assert run_cli("init", "--db", found).returncode == 0
    return found


def _client(url: str, monkeypatch: pytest.MonkeyPatch, **env: str) -> Iterator[TestClient]:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    app = create_app(url, hosts=service_hosts("127.0.0.1", 8750))
    with TestClient(app, base_url="http://127.0.0.1:8750") as client:
        yield client


def _head(url: str) -> int:
    with ledger.open(url, create=False) as store:
        return store.head().size


def test_a_foreign_origin_is_403_before_the_credential_is_looked_at(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    head = _head(url)
    for client in _client(url, monkeypatch):
        # the case: a rebound name, its Host and a matching Origin
        evil = {"Origin": "http://evil.example.com", "Host": "evil.example.com"}
        answer = client.post("/mcp", json=INITIALIZE, headers={**MCP_HEADERS, **evil})
        assert answer.status_code == 403, answer.text
        assert "Origin 'http://evil.example.com' is not allowed" in answer.json()["error"]
        for path in ("/v1/plan", "/healthz"):
            assert client.get(path, headers=evil).status_code == 403
        # a page of another server on loopback (another port, or the bare name of
        # port 80) is a web page as well; a rebound name with its port too
        for page in (
            {"Origin": "http://127.0.0.1:8751"},
            {"Origin": "http://localhost", "Host": "localhost:8750"},
            {"Origin": "https://127.0.0.1:8750"},
            {"Origin": "http://evil.example.com:8750", "Host": "evil.example.com:8750"},
        ):
            answer = client.post("/mcp", json=INITIALIZE, headers={**MCP_HEADERS, **page})
            assert answer.status_code == 403, page
        # the service's own origin, as the request names it: no page of another's (the
        # MCP conformance suite's dns-rebinding-protection asks this of a localhost door)
        for own in ("127.0.0.1:8750", "localhost:8750"):
            same = {"Origin": f"http://{own}", "Host": own}
            answer = client.post("/mcp", json=INITIALIZE, headers={**MCP_HEADERS, **same})
            assert answer.status_code == 401, own
        # no Origin: a client that is no browser, on to the credential (401)
        assert client.post("/mcp", json=INITIALIZE, headers=MCP_HEADERS).status_code == 401
        assert client.get("/healthz").status_code == 200
    assert _head(url) == head


def test_without_a_host_check_no_origin_is_the_services_own(url: str) -> None:
    """An app a test drives in process checks no Host: a rebound name would pass as its
    own origin, so no Origin does."""
    with TestClient(create_app(url), base_url="http://evil.example.com:8750") as client:
        page = {"Origin": "http://evil.example.com:8750"}
        assert client.get("/healthz", headers=page).status_code == 403


def test_an_operator_allows_a_console_origin(url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    console = "https://console.example.org"
    for client in _client(url, monkeypatch, EVIDENCE_ALLOWED_ORIGINS=f"{console}, https://x.org"):
        assert client.get("/healthz", headers={"Origin": console}).status_code == 200
        assert client.get("/healthz", headers={"Origin": "https://y.org"}).status_code == 403


def test_a_host_that_is_none_of_the_services_names_is_421(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for client in _client(url, monkeypatch, EVIDENCE_ALLOWED_HOSTS="plane.example.org"):
        for good in ("127.0.0.1:8750", "localhost:8750", "localhost", "[::1]:8750",
                     "plane.example.org"):  # fmt: skip
            assert client.get("/healthz", headers={"Host": good}).status_code == 200, good
        for bad in ("evil.example.com", "127.0.0.1.nip.io:8750", "plane.example.org:444", ""):
            answer = client.get("/healthz", headers={"Host": bad})
            assert answer.status_code == 421, bad
            assert "EVIDENCE_ALLOWED_HOSTS" in answer.json()["error"]


def test_the_service_knows_its_names() -> None:
    assert "localhost" in service_hosts(None, None)  # a unix socket's requests
    names = service_hosts("10.0.0.5", 443)
    assert {"10.0.0.5:443", "10.0.0.5", "127.0.0.1:443", "localhost"} <= set(names)
    assert "[::1]:8750" in service_hosts("::1", 8750)


def test_the_openapi_document_says_so(url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    for client in _client(url, monkeypatch):
        paths = client.get("/openapi.json").json()["paths"]
    for path, method in (("/mcp", "post"), ("/healthz", "get"), ("/v1/plan", "get")):
        answers = paths[path][method]["responses"]
        assert "Origin" in answers["403"]["description"], path
        assert "Host" in answers["421"]["description"], path
