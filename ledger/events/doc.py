"""Render the event catalog as Markdown: ``python -m ledger.events.doc > docs/events.md``.

The catalog is the single source: a test fails when docs/events.md drifts from it.
"""

from __future__ import annotations

import inspect
import types
import typing
from typing import Any

import msgspec

from . import ALL_EVENT_TYPES, EventPayload

_HEADER = """\
# Event catalog

Generated from `ledger/events/` by `python -m ledger.events.doc > docs/events.md`;
a test fails if this file drifts from the code.

Every registration, gate check, tool call, validation result, decision, token and halt
is one of the events below. What they mean together — a plan's lifecycle, the six
outcomes, gates, the binding set — is explained in [concepts.md](concepts.md).

## The envelope

Every event is one row of the `events` table. The store assigns everything but the
payload, the actor, the delta and the optional ids.

| field | meaning |
| --- | --- |
| `position` | global position: dense 1, 2, 3 … with no hole, equal to commit order |
| `event_id` | ULID, unique in the log (a duplicate is an error, never dropped) |
| `stream` | the stream the event belongs to (templates below) |
| `stream_version` | 1, 2, 3 … within the stream, unique with it |
| `type` | the dotted type name (the payload's `type` tag) |
| `schema_version` | the payload's schema version when written; older ones are upcast on read |
| `recorded_at` | RFC 3339 UTC with microseconds, e.g. `2026-11-29T20:07:13.123456Z` |
| `actor` | who caused it (`system`, an agent, an approver) |
| `correlation_id`, `causation_id` | optional ULIDs: the request, and the causing event |
| `payload` | the RFC 8785 canonical JSON of the payload (fields below) |
| `delta` | RFC 6902 JSON Patch taking the stream's state document from before to after |
| `leaf_hash` | `SHA256(0x00 ‖ leaf_bytes)`, the RFC 9162 leaf hash |
| `chain_hash` | `SHA256(chain_hash[i-1] ‖ leaf_hash[i])`, with 32 zero bytes before position 1 |

`leaf_bytes` is the RFC 8785 canonical JSON of the object with the members `actor`,
`causation_id`, `correlation_id`, `delta`, `event_id`, `payload`, `position`,
`recorded_at`, `schema_version`, `stream`, `stream_version`, `type` (payload and delta
as JSON values, not strings). The ledger head keeps the RFC 9162 Merkle tree over the
leaf hashes. Integers in payloads must lie within +-(2^53 - 1); NaN and infinities are
refused (they have no RFC 8785 form).

## Streams

| stream | holds |
| --- | --- |
| `tool:{name}` | registrations of a tool or validation (one namespace), one version per change |
| `skill:{name}` | definitions of a skill |
| `attachment:{attachment_id}` | one attachment: created, then possibly detached |
| `approver:{name}` | an approver's (or operator's) public keys, added and revoked |
| `credential:{credential_id}` | one agent credential: issued, then possibly revoked |
| `plan:{plan_id}` | one plan: phases, gates, calls, runs, decisions, tokens, halts |
| `review:{task_id}` | one advisory review |
| `ledger` | the ledger's identification by the plane key (`ledger.identified`) |

## Signed messages

A signature is Ed25519 (RFC 8032) over a message that names what it is for, so one made
for one use never verifies for another. Every event a key signs *where it stands* —
policy (`signed`: an operator's `PolicySignature`), a key's endorsement by the plane key
(`approver_key.added`'s `endorsement`), the ledger's identification — binds its place:

```
message = "evidence-ledger/v2/" DOMAIN "/" TYPE "\n" JCS({
    "ledger": LEDGER_ID, "record": RECORD, "stream": STREAM,
    "type": TYPE, "version": STREAM_VERSION })
```

`JCS` is the RFC 8785 canonical JSON (UTF-8, members in key order, no whitespace);
`TYPE` is the event's type (so each type has its own domain); `LEDGER_ID`, `STREAM` and
`STREAM_VERSION` are where the signer meant the event to stand — the event states them
(`place`: `{ledger, stream, version}`) and a verifier checks both the signature over
them and that they are where the event actually stands. What each signs:

| signed by | `DOMAIN` | `RECORD` |
| --- | --- | --- |
| an operator (policy) | `policy` | the payload's JSON (with its `type`) without `signed` |
| plane key: an operator's key | `operator` | `{"fingerprint", "name", "public_key"}` |
| plane key: an approver's key | `approver` | the same (of `approver_key.added`) |
| plane key: the ledger | `ledger` | `{"ledger_id", "position"}` of `ledger.identified` |

`LEDGER_ID` is the `ledger_id` of the ledger's first `ledger.identified` whose plane
signature verifies where it stands (its `position` is the event's own); the plane appends
it before its first signature on a ledger, so an event signed for another ledger (one
that shares the operator's key, even the plane's) names another id and is not policy
here. A copy into another stream or version, or a second copy anywhere, no longer
stands where it was signed; `evidence audit` reports it as `replayed_signature`.

Signatures that bind no place (the first format) cover
`"evidence-ledger/v1/" DOMAIN "\n" JCS(RECORD)`: human decisions (`decision`: bound
instead to their escalation's leaf hash, which names its position, stream and event id),
apply tokens (`token`: bound to their plan, attempt, results and trees, and minted once
per plan), hosted reviews' reports (`review`: bound to the chain of their stream's
events); and policy and endorsements written by the first release, before the ledger was
identified: such a signature counts only where it first stands — at a position before the
ledger's `ledger.identified`, and only the first time it appears in the log.

## Blob references

Large bytes (checked tool parameters and outputs, schemas, raw validation outputs, fix
diffs, reports) live in the `blobs` table, keyed by their SHA-256 hex digest, and are
stored in the same transaction as the event that names them. A type's **blob
references** (`BLOB_FIELDS` in the code) are the payload fields holding such a digest;
when one is not null the blob must be there: `evidence verify` reports `blob_missing` at
the event's position otherwise, and a bundle carries exactly these blobs. Any other
`*_sha256` field is a digest of something not kept as a blob: a token, a review request,
attachment arguments, and a registration's schema digests (the schema a gate checked
against is kept, named by that check's `schema_sha256`).

## Optional fields added later

A field whose default reads **absent** is left out of the payload unless it is set (it
is never written as `null`): payloads written before the field existed, and new ones
that do not set it, have the same bytes. So far these record outputs over their cap
(`max_output_bytes`): a tool's or validation's stdout and stderr are each kept up to the
cap and read to the end; a stream that went over it is recorded as a `Truncation` (the
bytes kept, the full size and the full output's SHA-256), and kept bytes are never
parsed: the output gate judges a truncated stdout not JSON (`checked_truncated`), and a
validation whose result it carried has no verdict (`malformed`, or `crash` when a signal
ended it). `tool.called`'s `unregistered` (`true` or absent) marks the call of a tool
the registry does not know, let through by an agent hook with `--unknown-tools record`
(docs/agents.md): its `tool_version` is `null`, its executor `recorded`, and no gate
judged it. A registration's `mcp_command` / `mcp_url` say how the plane launches or
reaches a tool's MCP server to call it itself (executor `mcp`); without either, an MCP
tool's calls can only be recorded.
`tool.called`'s and `validation.result_recorded`'s `confinement` says how the program
ran: `landlock` (confined by the kernel: docs/architecture.md, "What the kernel
enforces") or `unconfined` (its plan opted out with `global_config.confinement: none`;
`audit` lists such plans); absent on calls the plane ran no program for (executor
`recorded`, an MCP server it only reaches at `mcp_url`) and on events written before
the field. `global_config.confinement` itself is absent unless the plan sets it
(absent means `landlock`).

## Types
"""


def _doc(cls: type) -> str:
    return " ".join(inspect.cleandoc(cls.__doc__ or "").split())


def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if tp is Any:
        return "JSON"
    if tp is type(None):
        return "null"
    if origin is typing.Annotated:
        base, *metas = args
        limits = [
            f"{label} {getattr(m, attr)}"
            for m in metas
            for attr, label in (
                ("ge", ">="),
                ("le", "<="),
                ("gt", ">"),
                ("lt", "<"),
                ("min_length", "min length"),
                ("max_length", "max length"),
            )
            if getattr(m, attr, None) is not None
        ]
        return f"{_type_name(base)} ({', '.join(limits)})" if limits else _type_name(base)
    if origin is typing.Literal:
        return " \\| ".join(f'"{a}"' for a in args)
    if origin in (typing.Union, types.UnionType):
        # UNSET is no JSON value: such a field is left out (its default reads "absent").
        return " \\| ".join(_type_name(a) for a in args if a is not msgspec.UnsetType)
    if origin is list:
        return f"list[{_type_name(args[0])}]"
    if origin is dict:
        return f"dict[{_type_name(args[0])}, {_type_name(args[1])}]"
    return getattr(tp, "__name__", str(tp))


def _default(field: msgspec.structs.FieldInfo) -> str:
    if field.required:
        return "required"
    if field.default_factory is not msgspec.NODEFAULT:
        value = field.default_factory()
    else:
        value = field.default
    if value is msgspec.UNSET:
        return "absent"
    if isinstance(value, msgspec.Struct):
        return "defaults"
    return f"`{msgspec.json.encode(value).decode()}`"


def _nested(tp: Any, seen: dict[str, type]) -> None:
    """Collect the value Structs (not events) a field type mentions, at any depth."""
    if isinstance(tp, type) and issubclass(tp, msgspec.Struct):
        if not issubclass(tp, EventPayload):
            seen.setdefault(tp.__name__, tp)
        return
    for arg in typing.get_args(tp):
        _nested(arg, seen)


def _fields_table(cls: type[msgspec.Struct], skip: tuple[str, ...] = ()) -> list[str]:
    lines = ["| field | type | default |", "| --- | --- | --- |"]
    for field in msgspec.structs.fields(cls):
        if field.name in skip:
            continue
        lines.append(f"| `{field.name}` | {_type_name(field.type)} | {_default(field)} |")
    return lines


def render() -> str:
    out = [_HEADER]
    nested: dict[str, type] = {}
    for cls in ALL_EVENT_TYPES:
        out.append(f"### `{cls.type_name()}` (v{cls.SCHEMA_VERSION})\n")
        out.append(f"{_doc(cls)}\n")
        out.append(f"- stream: `{cls.STREAM}`")
        out.append(f"- delta: {cls.DELTA}")
        if cls.BLOB_FIELDS:
            out.append("- blob references: " + ", ".join(f"`{f}`" for f in cls.BLOB_FIELDS))
        out.append("")
        out.extend(_fields_table(cls))
        out.append("")
        for field in msgspec.structs.fields(cls):
            _nested(field.type, nested)
    out.append("## Value types used in payloads\n")
    for name, cls in sorted(nested.items()):
        out.append(f"### `{name}`\n")
        doc = _doc(cls)
        if doc:
            out.append(f"{doc}\n")
        out.extend(_fields_table(cls))
        out.append("")
    return "\n".join(out).rstrip() + "\n"


if __name__ == "__main__":
    print(render(), end="")
