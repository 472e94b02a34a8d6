"""Offline bundles: ``evidence export --bundle`` and ``verify``/``audit``/``replay
--bundle`` with no database. A bundle verifies, audits and replays exactly as the ledger
it was cut from; any single changed byte fails verification, named at the record it hits;
a checkpoint kept before later appends is shown to be extended by a later bundle."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import pytest
from click.testing import CliRunner

from commands.auditor.audit import audit, replay_plan
from commands.cli import cli
from commands.plane import Plane
from commands.plane.plans import create_plan
from ledger.bundle import BundleError, load_bundle, verify_bundle, write_bundle
from ledger.canonical import canonical_json
from ledger.checkpoints import Checkpoint, sign_checkpoint
from ledger.keys import generate_key_pair, load_private_key, load_public_key
from tests.helpers import applied_plan, assert_refused, run_cli
from tests.ledger.test_tamper import delete_blob, passing_result

ORIGIN = "evidence-ledger/test"


@pytest.fixture
def two_plans(db_url: str, tmp_path: Path):
    """P-1 taken to Apply through an escalation and a signed decision (with blobs: gate
    bytes, raw outputs), and an unrelated plan P-2; a signing key pair in tmp_path."""
    with Plane.open(db_url) as plane:
        applied_plan(plane, tmp_path)
        create_plan(plane, "P-2", project="web", resources=[str(tmp_path)], config={})
        keys = generate_key_pair(tmp_path / "plane.key")
        yield plane, keys, tmp_path


def _bundle(plane: Plane, keys, path: Path, plan: str | None = None) -> Path:
    write_bundle(plane.store, path, key=keys.private_key, origin=ORIGIN, plan=plan)
    return path


def test_a_whole_log_bundle_verifies_audits_and_replays_as_the_ledger(two_plans) -> None:
    plane, keys, tmp = two_plans
    path = _bundle(plane, keys, tmp / "all.bundle")
    bundle = load_bundle(path, public_key=keys.public_key)
    report = bundle.report
    head = plane.store.head()
    assert report.ok, report.problems
    assert (report.size, report.root, report.plan) == (head.size, head.root.hex(), None)
    assert report.events == head.size and report.blobs > 0 and report.signature_ok
    assert report.key_source == "given"
    assert [e.leaf_hash for e in bundle.read_all()] == [e.leaf_hash for e in plane.store.read_all()]
    assert [e.payload for e in bundle.read_all()] == [e.payload for e in plane.store.read_all()]
    assert audit(bundle) == audit(plane.store, read_models=False)
    assert audit(bundle, plan="P-1") == audit(plane.store, plan="P-1")
    assert replay_plan(bundle, "P-1") == replay_plan(plane.store, "P-1")
    middle = plane.store.read_stream("plan:P-1")[10].position
    assert replay_plan(bundle, "P-1", as_of=middle) == replay_plan(plane.store, "P-1", as_of=middle)


def test_a_plan_bundle_holds_that_plan_and_the_streams_it_uses(two_plans) -> None:
    plane, keys, tmp = two_plans
    bundle = load_bundle(_bundle(plane, keys, tmp / "p1.bundle", plan="P-1"))
    assert bundle.report.ok, bundle.report.problems
    assert bundle.report.key_source == "bundle" and bundle.report.plan == "P-1"
    streams = {e.stream for e in bundle.read_all()}
    assert "plan:P-1" in streams and "plan:P-2" not in streams
    assert {"tool:status", "approver:alice"} <= streams
    assert any(s.startswith("attachment:") for s in streams)
    every = [e for e in plane.store.read_all() if e.stream != "plan:P-2"]
    assert [e.position for e in bundle.read_all()] == [e.position for e in every]
    assert bundle.head().size == plane.store.head().size  # the tree of the whole log
    assert audit(bundle, plan="P-1") == audit(plane.store, plan="P-1")
    assert replay_plan(bundle, "P-1") == replay_plan(plane.store, "P-1")
    # the blobs P-1's events name (the validations' raw outputs) came along
    with plane.store.snapshot() as snap:
        stored = {digest: data for digest, _, data in snap.blobs()}
    assert stored and {d: bundle.get_blob(d) for d in stored} == stored
    with pytest.raises(BundleError, match="unknown plan 'nope'"):
        _bundle(plane, keys, tmp / "nope.bundle", plan="nope")
    assert not (tmp / "nope.bundle").exists()


def test_a_kept_checkpoint_is_extended_by_a_later_bundle(two_plans) -> None:
    plane, keys, tmp = two_plans
    early = _bundle(plane, keys, tmp / "early.bundle", plan="P-1")
    kept = load_bundle(early).report
    note = json.loads(early.read_bytes().split(b"\n")[1])["checkpoint"]
    create_plan(plane, "P-3", project="web", resources=[str(tmp)], config={})
    later = _bundle(plane, keys, tmp / "later.bundle", plan="P-1")
    report = verify_bundle(later, public_key=keys.public_key, kept_checkpoint=note)
    assert report.ok, report.problems
    assert report.kept is not None and report.kept.consistent and report.kept.signature_ok
    assert (report.kept.size, report.size) == (kept.size, kept.size + 1)

    # a kept checkpoint the bundle cannot extend: larger, another root, another signer
    root = bytes.fromhex(kept.root)
    bigger = sign_checkpoint(
        Checkpoint(origin=ORIGIN, size=kept.size + 5, root=root), keys.private_key
    )
    assert _kinds(verify_bundle(later, kept_checkpoint=bigger)) == {"kept_truncated"}
    rewritten = sign_checkpoint(
        Checkpoint(origin=ORIGIN, size=kept.size, root=bytes(32)), keys.private_key
    )
    assert _kinds(verify_bundle(later, kept_checkpoint=rewritten)) == {"kept_inconsistent"}
    stranger = generate_key_pair(tmp / "stranger.key").private_key
    foreign = sign_checkpoint(Checkpoint(origin=ORIGIN, size=kept.size, root=root), stranger)
    assert _kinds(verify_bundle(later, kept_checkpoint=foreign)) == {"kept_checkpoint"}


def test_a_bundle_signed_by_another_key_fails_against_the_auditors_key(two_plans) -> None:
    plane, keys, tmp = two_plans
    stranger = generate_key_pair(tmp / "stranger.key")
    path = tmp / "forged.bundle"
    write_bundle(plane.store, path, key=stranger.private_key, origin=ORIGIN)
    assert verify_bundle(path).ok  # self-consistent with the key it carries ...
    report = verify_bundle(path, public_key=keys.public_key)  # ... but not the plane's
    assert _kinds(report) == {"checkpoint_signature", "keys"} and not report.signature_ok


def _kinds(report) -> set[str]:
    return {p.kind for p in report.problems}


def _flip(data: bytes, offset: int) -> bytes:
    changed = bytearray(data)
    changed[offset] ^= 0x01 if data[offset] not in b"\n" else 0x20
    return bytes(changed)


def test_any_changed_byte_fails_verification(two_plans) -> None:
    plane, keys, tmp = two_plans
    data = _bundle(plane, keys, tmp / "p1.bundle", plan="P-1").read_bytes()
    target = tmp / "changed.bundle"
    step = max(1, len(data) // 1500)  # ~1500 offsets spread over every record
    for offset in range(0, len(data), step):
        target.write_bytes(_flip(data, offset))
        report = verify_bundle(target, public_key=keys.public_key)
        assert not report.ok, f"a change at byte {offset} went unnoticed"
        assert report.problems


def test_a_changed_byte_is_named_at_the_record_it_hits(two_plans) -> None:
    plane, keys, tmp = two_plans
    path = _bundle(plane, keys, tmp / "p1.bundle", plan="P-1")
    data = path.read_bytes()
    lines = data.split(b"\n")
    starts = [0]
    for line in lines[:-1]:
        starts.append(starts[-1] + len(line) + 1)
    events = json.loads(lines[0])["events"]
    target = tmp / "changed.bundle"

    def change(line: int, needle: bytes) -> set[str]:
        offset = starts[line] + lines[line].index(needle) + len(needle)
        target.write_bytes(_flip(data, offset))
        report = verify_bundle(target, public_key=keys.public_key)
        assert not report.ok
        return _kinds(report)

    assert "header" in change(0, b'"size":') or "checkpoint" in change(0, b'"size":')
    assert "checkpoint_signature" in change(1, b"\\n\\n\xe2\x80\x94 ")
    assert "leaves" in change(2, b'"leaves":"')
    assert "keys" in change(3, b'"public_key":"')
    # an event's payload: named with its position
    n = next(i for i in range(4, 4 + events) if b'"plan.decision_recorded"' in lines[i])
    target.write_bytes(_flip(data, starts[n] + lines[n].index(b'"payload":{') + 12))
    report = verify_bundle(target, public_key=keys.public_key)
    position = json.loads(lines[n])["position"]
    assert any(
        p.position == position and p.kind in ("event_changed", "event_malformed")
        for p in report.problems
    ), report.problems
    assert "blob_changed" in change(4 + events, b'"data":"') or "blob" in change(
        4 + events, b'"data":"'
    )
    target.write_bytes(data[:-1])  # the last newline cut off
    assert "truncated" in _kinds(verify_bundle(target))
    target.write_bytes(b"\n".join(lines[:5] + lines[6:]))  # one event removed
    assert "record_count" in _kinds(verify_bundle(target))


# -- blobs the events reference ------------------------------------------------------------


def test_a_bundle_exported_after_a_blob_was_deleted_fails_with_blob_missing(
    two_plans,
    db_url: str,
) -> None:
    plane, keys, tmp = two_plans
    passed = passing_result(plane.store)
    digest = passed.payload.raw_output_sha256
    delete_blob(db_url, digest)
    for plan in (None, "P-1"):
        path = _bundle(plane, keys, tmp / f"{plan}.bundle", plan=plan)
        bundle = load_bundle(path, public_key=keys.public_key)
        report = bundle.report
        assert not report.ok and report.signature_ok  # authentic, and incomplete
        assert [(p.position, p.kind) for p in report.problems] == [
            (passed.position, "blob_missing")
        ], report.problems
        detail = report.problems[0].detail
        assert "raw_output_sha256" in detail and digest in detail
        assert bundle.get_blob(digest) is None

    runner = CliRunner()
    out = str(tmp / "cli.bundle")
    made = runner.invoke(
        cli,
        [
            "export",
            "--bundle",
            out,
            "--plan",
            "P-1",
            "--key",
            str(tmp / "plane.key"),
            "--origin",
            ORIGIN,
            "--db",
            db_url,
        ],
    )
    assert made.exit_code == 0, made.output
    nowhere = f"sqlite:///{tmp / 'absent.db'}"
    text = runner.invoke(cli, ["verify", "--bundle", out, "--db", nowhere])
    assert text.exit_code == 1, text.output
    [line] = [ln for ln in text.output.splitlines() if "blob_missing" in ln]
    assert line.strip().startswith(f"position {passed.position}: blob_missing: ")
    assert "raw_output_sha256" in line and digest in line
    as_json = runner.invoke(cli, ["verify", "--bundle", out, "--json", "--db", nowhere])
    assert as_json.exit_code == 1, as_json.output
    report = json.loads(as_json.output)
    assert report["ok"] is False
    assert [(p["position"], p["kind"]) for p in report["problems"]] == [
        (passed.position, "blob_missing")
    ]
    assert not (tmp / "absent.db").exists()


def test_a_blob_record_cut_from_a_bundle_is_missing_at_the_events_naming_it(
    two_plans,
) -> None:
    plane, keys, tmp = two_plans
    passed = passing_result(plane.store)  # the one event naming its raw output
    digest = passed.payload.raw_output_sha256
    lines = _bundle(plane, keys, tmp / "p1.bundle", plan="P-1").read_bytes().split(b"\n")
    header = json.loads(lines[0])
    [cut] = [
        i
        for i, line in enumerate(lines)
        if digest.encode() in line and line.startswith(b'{"data":')
    ]
    header["blobs"] -= 1  # the header is not signed: the count can be made to agree
    changed = [canonical_json(header), *lines[1:cut], *lines[cut + 1 :]]
    target = tmp / "cut.bundle"
    target.write_bytes(b"\n".join(changed))
    report = verify_bundle(target, public_key=keys.public_key)
    assert [(p.position, p.kind) for p in report.problems] == [(passed.position, "blob_missing")], (
        report.problems
    )


# -- the command line, with no database ---------------------------------------------------


def test_cli_export_verify_audit_replay_offline(two_plans, db_url: str) -> None:
    plane, _keys, tmp = two_plans
    key = str(tmp / "plane.key")
    kept = run_cli("checkpoint", "--key", key, "--origin", ORIGIN, "--db", db_url)
    assert kept.returncode == 0, kept.stderr
    (tmp / "kept.txt").write_text(kept.stdout)
    create_plan(plane, "P-3", project="web", resources=[str(tmp)], config={})
    bundle = str(tmp / "p1.bundle")
    made = run_cli(
        "export",
        "--bundle",
        bundle,
        "--plan",
        "P-1",
        "--key",
        key,
        "--origin",
        ORIGIN,
        "--json",
        "--db",
        db_url,
    )
    assert made.returncode == 0, made.stderr
    summary = json.loads(made.stdout)
    assert summary["plan"] == "P-1" and summary["size"] == plane.store.head().size

    nowhere = f"sqlite:///{tmp / 'absent.db'}"  # no database: nothing is opened or made
    pub = str(tmp / "plane.key.pub")
    verified = run_cli(
        "verify",
        "--bundle",
        bundle,
        "--checkpoint",
        str(tmp / "kept.txt"),
        "--public-key",
        pub,
        "--json",
        "--db",
        nowhere,
    )
    assert verified.returncode == 0, verified.stdout + verified.stderr
    report = json.loads(verified.stdout)
    assert report["ok"] and report["kept"]["consistent"] and report["key_source"] == "given"
    text = run_cli("verify", "--bundle", bundle, "--db", nowhere)
    assert text.returncode == 0 and text.stdout.startswith("ok: bundle verified"), text.stdout

    audited = run_cli("audit", "--bundle", bundle, "--plan", "P-1", "--json", "--db", nowhere)
    assert audited.returncode == 0, audited.stdout + audited.stderr
    assert json.loads(audited.stdout) == msgspec.to_builtins(audit(plane.store, plan="P-1"))
    replayed = run_cli("replay", "P-1", "--bundle", bundle, "--json", "--db", nowhere)
    assert replayed.returncode == 0, replayed.stderr
    assert json.loads(replayed.stdout)["steps"] == msgspec.to_builtins(
        replay_plan(plane.store, "P-1")
    )
    assert not (tmp / "absent.db").exists()

    # one changed byte: verify, audit and replay all give the verdict (exit 1)
    data = bytearray(Path(bundle).read_bytes())
    data[len(data) // 2] ^= 0x01
    Path(bundle).write_bytes(bytes(data))
    for args in (["verify"], ["audit"], ["replay", "P-1"]):
        result = run_cli(*args, "--bundle", bundle, "--db", nowhere)
        assert result.returncode == 1, (args, result.stdout, result.stderr)
        assert "FAILED" in result.stdout and "Traceback" not in result.stderr


def test_cli_refusals(two_plans, db_url: str) -> None:
    _plane, _keys, tmp = two_plans
    key = str(tmp / "plane.key")
    out = str(tmp / "b.bundle")
    assert_refused(
        run_cli("export", "--bundle", out, "--format", "jsonl", "--key", key, "--db", db_url),
        "--bundle takes only",
        "--format",
    )
    assert_refused(
        run_cli("export", "--bundle", out, "--plan", "nope", "--key", key, "--db", db_url),
        "unknown plan 'nope'",
    )
    assert not Path(out).exists()
    assert_refused(
        run_cli("export", "--format", "jsonl", "--out", out, "--key", key, "--db", db_url),
        "--key, --origin and --witness apply only to --bundle and --tiles",
    )
    assert_refused(
        run_cli("verify", "--bundle", str(tmp / "missing.bundle")),
        "missing.bundle",
        "cannot read (no such file)",
    )
    assert_refused(
        run_cli("verify", "--bundle", out, "--against", "1:" + "0" * 64),
        "--against does not apply to --bundle",
    )
    load_private_key(key)  # the key files exist and load
    load_public_key(f"{key}.pub")
