"""``evidence attach``, ``evidence detach`` and ``evidence resolve``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click
import msgspec

from .common import (
    db_option,
    emit_json,
    emit_listing,
    fail,
    format_option,
    json_option,
    open_plane,
    print_table,
    server_options,
)
from .inputs import json_or_file, whole
from .terminal import inert

if TYPE_CHECKING:
    from ledger.events import ResolvedAttachment


@click.command()
@click.argument("validation")
@click.option("--resource", required=True, help="The resource the validation gates.")
@click.option("--project", help="Only when the resource is used through this project.")
@click.option("--plan", help="Only for this plan.")
@click.option(
    "--args",
    "args",
    metavar="JSON|@file",
    help="Arguments, checked against the validation's input schema.",
)
@db_option
@server_options
@json_option
def attach(
    validation: str,
    resource: str,
    project: str | None,
    plan: str | None,
    args: str | None,
    server: str | None,
    operator_key: str | None,
    as_json: bool,
) -> None:
    """Attach VALIDATION to a resource; print the attachment's ULID.

    Without a scope option the attachment always applies; --project only when the
    resource is used through that project, --plan only for that plan. --args are checked
    against the validation's input schema.

    \b
    Examples:
      evidence attach tests-pass --resource ./src
      evidence attach lint --resource ./src --plan P-1 --args '{"path": "src"}'
    """
    from commands.plane.attachments import attach as attach_validation
    from projections.states import to_json

    if project and plan:
        fail("give --project or --plan, not both (an attachment has one scope)")
    raw = json_or_file(args, "--args") if args is not None else {}
    if not isinstance(raw, dict):
        fail("--args must be a JSON object")
    if server is not None:
        scope = {"project": project} if project else {"plan": plan} if plan else {}
        wanted = {"validation": validation, "resource": resource, "args": raw, **scope}
        doc = _attach_remotely(server, operator_key, wanted)
    else:
        doc = attach_validation(
            open_plane(), validation, resource=resource, project=project, plan=plan, args=raw
        )
    if as_json:
        emit_json({"attachment": to_json(doc)})
    else:
        click.echo(doc.attachment_id)


def _attach_remotely(server: str, operator_key: str | None, wanted: dict[str, Any]) -> Any:
    """The attachment made through the service, signed here: its document."""
    from ledger.events import AttachmentCreated
    from projections.documents import fold

    from .operator_remote import act, expecting, remote

    validation = wanted["validation"]
    expect = expecting(AttachmentCreated, f"an attachment of {validation!r}", validation=validation)
    answer = act(remote(server, operator_key), "attachment.attach", wanted, expect)
    created = msgspec.convert(answer["prepared"][0]["payload"], AttachmentCreated)
    return fold(f"attachment:{created.attachment_id}", None, created)


def _detach_remotely(
    server: str, operator_key: str | None, attachment_id: str, reason: str
) -> None:
    """The detachment through the service, signed here (that attachment's only)."""
    from ledger.events import AttachmentDetached

    from .operator_remote import act, expecting, remote

    what = f"the detachment of {attachment_id}"
    expect = expecting(AttachmentDetached, what, attachment_id=attachment_id)
    args = {"attachment_id": attachment_id, "reason": reason}
    act(remote(server, operator_key), "attachment.detach", args, expect)


@click.command()
@click.argument("attachment_id")
@click.option("--reason", default="", help="Why (recorded).")
@db_option
@server_options
@json_option
def detach(
    attachment_id: str, reason: str, server: str | None, operator_key: str | None, as_json: bool
) -> None:
    """Detach an attachment.

    Resolution as of earlier positions still sees it; plans that pinned it keep it.

    \b
    Examples:
      evidence detach 01M8N0Q6Z4RVC5J9W3X2B7TQ1D
      evidence detach 01M8N0Q6Z4RVC5J9W3X2B7TQ1D --reason "replaced by lint-v2"
    """
    from commands.plane.attachments import detach as detach_attachment
    from projections.states import to_json

    if server is not None:
        _detach_remotely(server, operator_key, attachment_id, reason)
        shown: dict[str, object] = {"attachment_id": attachment_id, "status": "detached"}
    else:
        shown = to_json(detach_attachment(open_plane(), attachment_id, reason=reason))
    if as_json:
        emit_json({"attachment": shown})
    else:
        click.echo(f"detached {inert(attachment_id)}")


@click.command()
@click.option("--resource", required=True, help="The resource the work is on.")
@click.option("--project", help="The project the resource is used through.")
@click.option("--plan", help="The plan (its project is used when --project is absent).")
@click.option("--as-of", "as_of", type=whole(0), help="As of this position.")
@db_option
@format_option()
def resolve(
    resource: str, project: str | None, plan: str | None, as_of: int | None, fmt: str
) -> None:
    """Which validations apply to work on a resource.

    The union of the direct, project and plan attachments; of the same validation with
    the same args, the most specific scope wins. With --plan, also the plan's binding
    set, pinned when it entered Execute: that set, not today's resolution, is what its
    validations run. --format jsonl and csv print both sets, each row naming its set.

    \b
    Examples:
      evidence resolve --resource ./src --project api
      evidence resolve --resource ./src --plan P-1 --format csv
    """
    from commands.plane.attachments import pinned_binding, resolve_attachments
    from projections.states import to_json

    plane = open_plane()
    rows = resolve_attachments(plane, resource=resource, project=project, plan=plan, as_of=as_of)
    pinned = pinned_binding(plane, plan, as_of=as_of) if plan is not None else None

    def table() -> None:
        print_table(["attachment", "scope", "validation", "version", "mode", "args"], _rows(rows))
        if pinned is not None:
            click.echo(f"\nplan {inert(plan)}'s binding set, pinned at Execute ({len(pinned)}):")
            print_table(
                ["attachment", "scope", "validation", "version", "mode", "args"], _rows(pinned)
            )

    listed = [{"set": "resolved", **to_json(r)} for r in rows] + [
        {"set": "pinned", **to_json(r)} for r in pinned or []
    ]
    emit_listing(fmt, {"attachments": rows, "pinned": pinned}, listed, table)


def _rows(rows: list[ResolvedAttachment]) -> list[list[str]]:
    import msgspec

    return [
        [
            r.attachment_id,
            r.scope,
            r.validation,
            str(r.validation_version),
            r.mode,
            msgspec.json.encode(r.args).decode(),
        ]
        for r in rows
    ]
