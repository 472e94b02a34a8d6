"""Witnesses (C2SP tlog-witness, tlog-cosignature, tlog-policy; issue 48): three witnesses
run as processes of their own on loopback (tests/witness/witness.py, written from the
specifications, sharing no code with the ledger), two of three make the quorum.

They cosign the log's honest growth, and `evidence checkpoint --witness` publishes the
cosigned checkpoint, which `verify --policy` accepts. They never cosign a forked log
(another tree of the same size, or a larger one that does not extend theirs), a
truncated log or a rolled-back checkpoint, and the client says which each time; a
checkpoint without the quorum is not published, and `verify --policy` refuses one whose
cosignatures were stripped or forged."""

from __future__ import annotations

import base64
import json
import os
import shutil
import sys
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest
from starlette.testclient import TestClient

import ledger
from commands.plane.witnesses import witness
from commands.rules.signing import plane_key_path
from commands.service import create_app
from commands.service.checkpoints import origin_of
from ledger.checkpoints import SIGNATURE_PREFIX, stored_leaves, verifier_key
from ledger.cosignatures import CosignerKey
from ledger.keys import generate_key_pair, load_private_key
from ledger.merkle import consistency_proof
from ledger.tlog_policy import parse_policy
from tests.conformance import harness
from tests.helpers import append_plans, run_cli


@pytest.fixture
def policy(sqlite_url: str, tmp_path: Path) -> Iterator[Path]:
    """A ledger (its plane key the log's), three witnesses on loopback that trust it,
    and a policy naming them, 2 of 3: the policy file."""
    assert run_cli("init", "--db", sqlite_url).returncode == 0
    log = load_private_key(plane_key_path(sqlite_url))
    with ledger.open(sqlite_url, create=False) as store:
        origin = origin_of(store)  # the checkpoints' default origin, the service's too
    lines = [f"log {verifier_key(origin, log)}"]
    with ExitStack() as stack:
        for name in ("w1", "w2", "w3"):
            generate_key_pair(tmp_path / f"{name}.key")
            key = load_private_key(tmp_path / f"{name}.key")
            state = str(tmp_path / f"{name}.state")
            argv = [
                sys.executable, "-m", "tests.witness.witness", f"witness.example/{name}",
                str(tmp_path / f"{name}.key"), verifier_key(origin, log), state,
            ]  # fmt: skip
            url = stack.enter_context(harness.serving(argv, stderr=tmp_path / f"{name}.log"))
            cosigner = CosignerKey.of(f"witness.example/{name}", key)
            lines.append(f"witness {name} {cosigner} {url}")
        lines += ["# two of the three", "group witnesses 2 w1 w2 w3", "quorum witnesses"]
        path = tmp_path / "witnesses.policy"
        path.write_text("\n".join(lines) + "\n")
        yield path


def _origin(policy: Path) -> str:
    """The log's origin the policy names (a forked or truncated copy claims it too)."""
    return parse_policy(policy.read_text()).logs[0][0].name


def _checkpoint(url: str, policy: Path) -> tuple[int, str, dict]:
    done = run_cli(
        "checkpoint", "--origin", _origin(policy), "--witness", str(policy), "--db", url, "--json"
    )
    assert done.stdout, done.stderr
    return done.returncode, done.stderr, json.loads(done.stdout)


def test_witnesses_cosign_honest_growth_and_verify_accepts_it(
    sqlite_url: str, policy: Path, tmp_path: Path
) -> None:
    append_plans(sqlite_url, 0, 100)
    code, _, first = _checkpoint(sqlite_url, policy)
    assert code == 0 and first["quorum"] and first["cosigned"] == ["w1", "w2", "w3"], first
    append_plans(sqlite_url, 100, 37)
    text = run_cli("checkpoint", "--witness", str(policy), "--db", sqlite_url)
    assert text.returncode == 0, text.stderr
    assert text.stdout.count(SIGNATURE_PREFIX) == 4  # the log's and three cosignatures
    assert "witness w2: cosigned" in text.stderr
    kept = tmp_path / "kept.checkpoint"
    kept.write_text(text.stdout)
    checked = run_cli(
        "verify", "--checkpoint", str(kept), "--policy", str(policy), "--db", sqlite_url
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "cosigned by w1, w2, w3: the policy's quorum holds" in checked.stdout
    # An event's offline proof against the cosigned checkpoint, checked with the policy.
    made = run_cli(
        "prove", "7", "--format", "tlog-proof", "--checkpoint", str(kept), "--db", sqlite_url
    )
    assert made.returncode == 0, made.stderr
    proof = tmp_path / "event.tlog-proof"
    proof.write_text(made.stdout)
    offline = run_cli("verify", "--tlog-proof", str(proof), "--policy", str(policy), "--json")
    assert offline.returncode == 0, offline.stdout
    found = json.loads(offline.stdout)
    assert found["position"] == 7 and found["policy"]["cosigned"] == ["w1", "w2", "w3"]


def test_stripped_or_forged_cosignatures_do_not_make_a_quorum(
    sqlite_url: str, policy: Path, tmp_path: Path
) -> None:
    append_plans(sqlite_url, 0, 10)
    note = _checkpoint(sqlite_url, policy)[2]["checkpoint"]
    lines = note.split("\n")
    body, signatures = (
        lines[: lines.index("") + 1],
        [line for line in lines[lines.index("") + 1 :] if line],
    )
    log_line, w1, _w2, w3 = signatures
    # w3's own key id and time, a signature it never made
    w3_name, w3_blob = w3.removeprefix(SIGNATURE_PREFIX).split(" ")
    forged_blob = base64.b64decode(w3_blob)[:12] + bytes(64)
    forged = f"{SIGNATURE_PREFIX}{w3_name} {base64.b64encode(forged_blob).decode()}"
    for kept, ok in (
        ([log_line, w1, w3], True),
        ([log_line, w1], False),
        ([log_line, w1, forged], False),
    ):
        path = tmp_path / "kept.checkpoint"
        path.write_text("\n".join(body) + "\n" + "\n".join(kept) + "\n")
        checked = run_cli(
            "verify",
            "--checkpoint",
            str(path),
            "--policy",
            str(policy),
            "--db",
            sqlite_url,
            "--json",
        )
        assert checked.returncode == (0 if ok else 1), checked.stdout
        assert json.loads(checked.stdout)["policy"]["quorum"] is ok


def _other_ledger(sqlite_url: str, tmp_path: Path, name: str) -> str:
    """A second ledger signed with the same plane key (the same log, to a witness: the
    tests' EVIDENCE_PLANE_KEY names one key for every ledger)."""
    url = f"sqlite:///{tmp_path / name}"
    assert plane_key_path(url) == plane_key_path(sqlite_url)
    return url


def test_a_forked_log_is_never_cosigned(sqlite_url: str, policy: Path, tmp_path: Path) -> None:
    append_plans(sqlite_url, 0, 50)
    assert _checkpoint(sqlite_url, policy)[0] == 0  # the witnesses hold tree 50
    fork = _other_ledger(sqlite_url, tmp_path, "fork.db")
    append_plans(fork, 0, 50, resource="other")  # the same size, another root
    code, _, found = _checkpoint(fork, policy)
    assert code == 1 and found["checkpoint"] is None and found["cosigned"] == []
    assert set(found["witnesses"].values()) == {
        "it has cosigned another tree of size 50: the log forked"
    }
    append_plans(fork, 50, 10, resource="other")  # larger, but not extending what they hold
    code, _, found = _checkpoint(fork, policy)
    assert code == 1 and all("the log forked" in why for why in found["witnesses"].values())


def test_a_truncated_log_or_a_rolled_back_checkpoint_is_never_cosigned(
    sqlite_url: str, policy: Path, tmp_path: Path
) -> None:
    append_plans(sqlite_url, 0, 40)
    old_note = _checkpoint(sqlite_url, policy)[2]["checkpoint"]
    older = tmp_path / "older.db"
    shutil.copy(sqlite_url.removeprefix("sqlite:///"), older)  # the log as it was at 40
    append_plans(sqlite_url, 40, 20)
    assert _checkpoint(sqlite_url, policy)[0] == 0  # the witnesses hold tree 60
    truncated = _other_ledger(sqlite_url, tmp_path, "older.db")
    code, _, found = _checkpoint(truncated, policy)
    assert code == 1 and found["checkpoint"] is None
    assert all("larger tree of this log (60 events" in why for why in found["witnesses"].values())
    text = run_cli(
        "checkpoint", "--origin", _origin(policy), "--witness", str(policy), "--db", truncated
    )
    assert text.returncode == 1 and text.stdout == ""  # nothing published
    assert "not published: no quorum" in text.stderr
    # The checkpoint of 40 the log signed before, sent again: a rollback, refused.
    with ledger.open(sqlite_url, create=False) as store:
        leaves = stored_leaves(store, 40)
    body = old_note.split("\n\n")[0] + "\n\n" + old_note.split("\n\n")[1].split("\n")[0] + "\n"
    again = witness(
        body, parse_policy(policy.read_text()), lambda old: consistency_proof(leaves, old)
    )
    assert not again.check.quorum
    assert all("rolled back" in (a.why or "") for a in again.asked)


def test_one_witness_away_still_makes_two_of_three(
    sqlite_url: str, tmp_path: Path, policy: Path
) -> None:
    text = policy.read_text().split("\n")
    down = [
        line
        if not line.startswith("witness w3 ")
        else line.rsplit(" ", 1)[0] + " http://127.0.0.1:9"
        for line in text
    ]
    policy.write_text("\n".join(down))
    append_plans(sqlite_url, 0, 5)
    code, _, found = _checkpoint(sqlite_url, policy)
    assert code == 0 and found["cosigned"] == ["w1", "w2"]
    assert found["witnesses"]["w3"].startswith("unreachable")


def test_a_policy_that_is_not_one_is_refused(sqlite_url: str, tmp_path: Path) -> None:
    assert run_cli("init", "--db", sqlite_url).returncode == 0
    bad = tmp_path / "bad.policy"
    mldsa = "witness.example/pq+01020304+" + base64.b64encode(b"\x06" + bytes(1312)).decode()
    for text, why in (
        ("log nope\nquorum none\n", "not a verifier key"),
        (f"witness pq {mldsa}\nquorum pq\n", "ML-DSA-44 cosignatures (type 0x06) are not accepted"),
        ("quorum w9\n", "not defined on an earlier line"),
        ("group g 1\n", "not a policy line"),
    ):
        bad.write_text(text)
        done = run_cli("checkpoint", "--witness", str(bad), "--db", sqlite_url)
        assert done.returncode == 2 and why in done.stderr, (text, done.stderr)


def test_the_service_publishes_only_checkpoints_its_witnesses_cosigned(
    sqlite_url: str, policy: Path
) -> None:
    """`evidence serve --witness-policy`: the published checkpoint carries the quorum's
    cosignatures; while the witnesses are away, the last cosigned one stays published."""
    parsed = parse_policy(policy.read_text())
    append_plans(sqlite_url, 0, 20)
    app = create_app(sqlite_url, witness_policy=parsed)
    with TestClient(app) as client:
        service = app.state.service
        first = service.publish_checkpoint()
        with ledger.open(sqlite_url, create=False) as store:
            size = store.head().size
        assert first is not None and first.size == size
        note = client.get("/checkpoint").text
        assert parsed.check(note).ok and note == first.note
        append_plans(sqlite_url, 20, 5)
        away = policy.read_text().replace("http://127.0.0.1:", "http://127.0.0.1:9#")
        service.witness_policy = parse_policy(away)
        kept = service.publish_checkpoint()  # (the service's own first round may race it)
        assert kept is not None and kept.size == size
        still = client.get("/checkpoint").text
        assert still.split("\n")[1] == str(size) and parsed.check(still).ok
        service.witness_policy = parsed
        assert service.publish_checkpoint().size == size + 5
    refused = run_cli(
        "serve", "--witness-policy", str(policy), "--db", f"sqlite:///{policy.parent / 'other.db'}"
    )
    assert refused.returncode == 2


def test_bundles_and_tiles_carry_the_cosigned_checkpoint(
    sqlite_url: str, policy: Path, tmp_path: Path
) -> None:
    """`export --bundle/--tiles --witness`: the checkpoint written is the quorum's
    cosigned one (a bundle carries the policy too), `verify --bundle --policy` holds it
    to the auditor's policy; without the quorum nothing is written (exit 1)."""
    append_plans(sqlite_url, 0, 30)
    bundle = tmp_path / "log.bundle"
    made = run_cli(
        "export", "--bundle", str(bundle), "--origin", _origin(policy),
        "--witness", str(policy), "--db", sqlite_url,
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    checked = run_cli("verify", "--bundle", str(bundle), "--policy", str(policy), "--json")
    assert checked.returncode == 0, checked.stdout
    report = json.loads(checked.stdout)
    assert report["policy"] == {
        "log": _origin(policy),
        "cosigned": ["w1", "w2", "w3"],
        "quorum": True,
    }
    assert report["carried_policy"] == policy.read_text()
    plain = tmp_path / "plain.bundle"
    assert (
        run_cli(
            "export", "--bundle", str(plain), "--origin", _origin(policy), "--db", sqlite_url
        ).returncode
        == 0
    )
    unwitnessed = run_cli("verify", "--bundle", str(plain), "--policy", str(policy), "--json")
    assert unwitnessed.returncode == 1
    assert [p["kind"] for p in json.loads(unwitnessed.stdout)["problems"]] == ["witness_policy"]
    tiles = tmp_path / "tiles"
    exported = run_cli(
        "export", "--tiles", str(tiles), "--origin", _origin(policy), "--witness", str(policy),
        "--db", sqlite_url,
    )  # fmt: skip
    assert exported.returncode == 0, exported.stderr
    assert parse_policy(policy.read_text()).check((tiles / "checkpoint").read_text()).ok
    before = (tiles / "checkpoint").read_text()
    append_plans(sqlite_url, 30, 3)
    away = tmp_path / "away.policy"
    away.write_text(policy.read_text().replace("http://127.0.0.1:", "http://127.0.0.1:9#"))
    again = run_cli(
        "export", "--tiles", str(tiles), "--origin", _origin(policy), "--witness", str(away),
        "--db", sqlite_url,
    )  # fmt: skip
    assert again.returncode == 1 and "checkpoint not written" in again.stderr
    assert (tiles / "checkpoint").read_text() == before
    gone = run_cli(
        "export", "--bundle", str(tmp_path / "no.bundle"), "--origin", _origin(policy),
        "--witness", str(away), "--db", sqlite_url,
    )  # fmt: skip
    assert gone.returncode == 1 and not (tmp_path / "no.bundle").exists()


def test_an_operator_has_the_service_publish_now(
    sqlite_url: str, policy: Path, tmp_path: Path, socket_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`evidence checkpoint --server`: the service publishes one now, cosigned by its
    witnesses' quorum; a request not signed by an operator key is refused (401)."""
    operator = tmp_path / "ops.key"
    generate_key_pair(operator)
    run_cli("keys", "add", "ops", f"{operator}.pub", "--role", "operator", "--db", sqlite_url)
    append_plans(sqlite_url, 0, 12)
    sock = socket_dir / "serve.sock"
    serve = [sys.executable, "-m", "commands.cli", "serve", "--db", sqlite_url, "--uds", str(sock),
             "--witness-policy", str(policy), "--insecure-single-user"]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k != "EVIDENCE_DB"}
    with harness.serving(serve, stderr=tmp_path / "serve.log", env=env) as url:
        append_plans(sqlite_url, 12, 4)
        done = run_cli("checkpoint", "--server", url, "--operator-key", str(operator), "--json")
        assert done.returncode == 0, done.stderr
        answer = json.loads(done.stdout)
        assert (
            answer["published"] is True
            and parse_policy(policy.read_text()).check(answer["checkpoint"]).ok
        )
        with ledger.open(sqlite_url, create=False) as store:
            assert answer["size"] == store.head().size
        stranger = tmp_path / "agent.key"
        generate_key_pair(stranger)
        refused = run_cli("checkpoint", "--server", url, "--operator-key", str(stranger))
        assert refused.returncode == 2, refused.stderr
        assert "not signed by an active operator key" in refused.stderr
