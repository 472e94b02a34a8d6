"""A 401 at /mcp as the MCP authorization specification asks (2025-06-18, 2025-11-25):
``WWW-Authenticate: Bearer`` naming the protected-resource metadata (RFC 9728) the
service serves without a credential — with no authorization server, since an operator
issues the credentials (docs/service.md, "MCP over HTTP").

In-process (Starlette's TestClient behind the door's Host check, as `evidence serve` on
127.0.0.1:8750 builds it): the challenge parses (RFC 7235 auth-params, and with the
official SDK's own parser) and names the metadata's URL; both metadata documents are
JSON, name their resource as the request named the service, and are in the OpenAPI
document; a foreign Host is still 421 on them.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import httpx2
import pytest
from starlette.testclient import TestClient

from commands.service import create_app
from commands.service.door import service_hosts
from tests.helpers import run_cli

BASE = "http://127.0.0.1:8750"
MCP_HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
INITIALIZE = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {}}
WELL_KNOWN = "/.well-known/oauth-protected-resource"
# RFC 7235 section 2.1: auth-param = token BWS "=" BWS ( token / quoted-string )
_PARAM = re.compile(r'\s*([!#$%&\'*+.^_`|~0-9A-Za-z-]+)\s*=\s*("(?:[^"\\]|\\.)*"|[^\s,]+)\s*(,|$)')


@pytest.fixture
def client(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[TestClient]:
    url = f"sqlite:///{tmp_path / 'evidence.db'}"
    assert run_cli("init", "--db", url).returncode == 0
    monkeypatch.setenv("EVIDENCE_ALLOWED_HOSTS", "plane.example.org")
    app = create_app(url, hosts=service_hosts("127.0.0.1", 8750))
    with TestClient(app, base_url=BASE) as found:
        yield found


def _challenge(value: str) -> tuple[str, dict[str, str]]:
    """The scheme and the auth-params of one challenge, every byte accounted for."""
    scheme, _, rest = value.partition(" ")
    params: dict[str, str] = {}
    at = 0
    while at < len(rest):
        found = _PARAM.match(rest, at)
        assert found is not None, f"not an auth-param at {rest[at:]!r}"
        name, raw = found.group(1), found.group(2)
        assert name not in params, name
        params[name] = re.sub(r"\\(.)", r"\1", raw[1:-1]) if raw.startswith('"') else raw
        at = found.end()
    return scheme, params


def test_a_401_at_mcp_names_the_metadata_and_says_how_a_credential_is_obtained(
    client: TestClient,
) -> None:
    for headers, token_given in (({}, False), ({"Authorization": "Bearer evd_x_y"}, True)):
        answer = client.post("/mcp", json=INITIALIZE, headers={**MCP_HEADERS, **headers})
        assert answer.status_code == 401, answer.text
        value = answer.headers["www-authenticate"]
        scheme, params = _challenge(value)
        assert scheme == "Bearer"
        assert params["realm"] == "evidence"
        assert params["resource_metadata"] == f"{BASE}{WELL_KNOWN}/mcp"
        # RFC 6750 section 3: an error code only when a token was given
        assert params.get("error") == ("invalid_token" if token_given else None)
        description = params["error_description"]
        assert "evidence credential issue" in description
        assert ("no credential" in description) != token_given
        # RFC 6750's characters for error_description: printable ASCII but " and \
        assert re.fullmatch(r"[\x20-\x21\x23-\x5b\x5d-\x7e]+", description), description
        # the official SDK's client reads the same URL out of it
        from mcp.client.auth.utils import extract_resource_metadata_from_www_auth

        raw = httpx2.Response(401, headers={"WWW-Authenticate": value})
        assert extract_resource_metadata_from_www_auth(raw) == params["resource_metadata"]
    # a JSON route's 401 names the service's own metadata (the root document)
    plan = client.get("/v1/plan")
    assert plan.status_code == 401
    assert _challenge(plan.headers["www-authenticate"])[1]["resource_metadata"] == (
        f"{BASE}{WELL_KNOWN}"
    )


def test_the_metadata_is_served_without_a_credential(client: TestClient) -> None:
    from mcp.shared.auth_utils import check_resource_allowed

    mcp = client.get(f"{WELL_KNOWN}/mcp")
    assert mcp.status_code == 200 and mcp.headers["content-type"] == "application/json"
    found = mcp.json()
    # RFC 9728 section 3.3: the resource is the URL with the well-known part taken out
    assert found["resource"] == f"{BASE}/mcp"
    assert found["bearer_methods_supported"] == ["header"]
    assert found["resource_name"]
    # no authorization server: an operator issues the credentials
    assert "authorization_servers" not in found
    assert found["resource_documentation"] == f"{BASE}/docs/credentials"
    root = client.get(WELL_KNOWN).json()
    assert root["resource"] == BASE and set(root) == set(found)
    # both cover /mcp, as an MCP client checks them (RFC 8707 resource, hierarchically)
    assert check_resource_allowed(f"{BASE}/mcp", found["resource"])
    assert check_resource_allowed(f"{BASE}/mcp", root["resource"])
    # the documentation says how a credential is obtained, in plain text
    doc = client.get("/docs/credentials")
    assert doc.status_code == 200 and doc.headers["content-type"].startswith("text/plain")
    assert "evidence credential issue --plan PLAN" in doc.text
    assert "No OAuth authorization server" in doc.text
    # the resource is the service as the request named it (a name the door let in)
    other = client.get(f"{WELL_KNOWN}/mcp", headers={"Host": "plane.example.org"}).json()
    assert other["resource"] == "http://plane.example.org/mcp"
    assert other["resource_documentation"] == "http://plane.example.org/docs/credentials"


def test_a_foreign_host_is_421_on_the_new_routes(client: TestClient) -> None:
    for path in (WELL_KNOWN, f"{WELL_KNOWN}/mcp", "/docs/credentials"):
        for bad in ("evil.example.com", "127.0.0.1.nip.io:8750", ""):
            answer = client.get(path, headers={"Host": bad})
            assert answer.status_code == 421, (path, bad)
            assert "EVIDENCE_ALLOWED_HOSTS" in answer.json()["error"]
        # and a web page's request is 403, as everywhere
        page = client.get(path, headers={"Origin": "http://evil.example.com"})
        assert page.status_code == 403, path


def test_the_routes_are_in_the_openapi_document(client: TestClient) -> None:
    doc = client.get("/openapi.json").json()
    for path in (WELL_KNOWN, f"{WELL_KNOWN}/mcp", "/docs/credentials"):
        operation = doc["paths"][path]["get"]
        assert operation["security"] == [], path  # no credential needed
        assert {"200", "403", "421"} <= set(operation["responses"]), path
    metadata = doc["paths"][f"{WELL_KNOWN}/mcp"]["get"]["responses"]["200"]
    assert metadata["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/ProtectedResourceMetadata"
    }
    shared = doc["components"]["schemas"]["ProtectedResourceMetadata"]
    assert "authorization_servers" not in shared["properties"]
    mcp = doc["paths"]["/mcp"]["post"]["responses"]["401"]
    assert "resource_metadata" in mcp["headers"]["WWW-Authenticate"]["description"]
    assert mcp["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/JsonRpcError"
    }
    validator = pytest.importorskip("openapi_spec_validator")
    validator.validate(doc)
