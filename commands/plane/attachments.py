"""Attachment handlers: attach a validation to a resource at a scope, detach it, and
resolve which attachments apply (the attachment resolution projection)."""

from __future__ import annotations

from collections.abc import Mapping
from hashlib import sha256
from typing import Any

from ulid import ULID

from commands.names import check_identifier, check_resource
from commands.schemas.checker import check
from ledger.canonical import CanonicalizationError, canonical_json
from ledger.events import AttachmentCreated, AttachmentDetached, ResolvedAttachment
from projections.documents import fold_plan
from projections.resolution import resolve
from projections.states import AttachmentState

from .core import CommandRefused, Plane, StreamState


class ArgumentsRejected(CommandRefused):
    """The attachment's arguments deviate from the validation's input schema."""

    def __init__(self, validation: str, deviations: list[Any]) -> None:
        self.deviations = deviations
        listed = "; ".join(
            f"{d.pointer or '/'}: {d.kind} (expected {d.expected}, got {d.actual_type})"
            for d in deviations
        )
        super().__init__(f"--args do not match {validation}'s input schema: {listed}")


def attach(
    plane: Plane,
    validation: str,
    *,
    resource: str,
    project: str | None = None,
    plan: str | None = None,
    args: Mapping[str, Any] | None = None,
    actor: str = "system",
) -> AttachmentState:
    """Attach ``validation`` to ``resource``: directly, for a project, or for a plan.
    Returns the new attachment's document (its ``attachment_id`` is a fresh ULID)."""
    resource = check_resource(resource)
    if project is not None and plan is not None:
        raise CommandRefused("an attachment has one scope: give --project or --plan, not both")
    if project is not None:
        check_identifier(project, "project")
    log = plane.log()
    if plan is not None and not log.state(f"plan:{plan}").exists:
        raise CommandRefused(f"unknown plan {plan!r}")
    tool = log.tool(validation)
    if tool is None:
        raise CommandRefused(f"unknown validation {validation!r}")
    if tool.kind != "validation":
        raise CommandRefused(
            f"{validation!r} is a tool, not a validation: only validations can be attached"
        )
    arguments = dict(args or {})
    schema = tool.spec.input_schema
    if schema is None:
        if arguments:
            raise CommandRefused(f"{validation!r} declares no input_schema: it takes no --args")
    else:
        deviations = check(schema, arguments)
        if deviations:
            raise ArgumentsRejected(validation, deviations)
    try:
        args_sha256 = sha256(canonical_json(arguments)).hexdigest()
    except CanonicalizationError as exc:
        raise CommandRefused(f"--args: {exc}") from None
    attachment_id = str(ULID())
    created = AttachmentCreated(
        attachment_id=attachment_id,
        validation=validation,
        validation_version=tool.version,
        resource=resource,
        scope="plan" if plan else "project" if project else "direct",
        project=project,
        plan=plan,
        args=arguments,
        args_sha256=args_sha256,
    )
    plane.run(f"attachment:{attachment_id}", lambda _state: [created], actor=actor)
    return get_attachment(plane, attachment_id)


def detach(
    plane: Plane, attachment_id: str, *, reason: str = "", actor: str = "system"
) -> AttachmentState:
    def decide(state: StreamState) -> list[AttachmentDetached]:
        if not state.exists:
            raise CommandRefused(f"unknown attachment {attachment_id!r}")
        doc = state.of(AttachmentState)
        if doc is not None and doc.status == "detached":
            raise CommandRefused(f"attachment {attachment_id} is already detached")
        return [AttachmentDetached(attachment_id=attachment_id, reason=reason)]

    plane.run(f"attachment:{attachment_id}", decide, actor=actor)
    return get_attachment(plane, attachment_id)


def get_attachment(plane: Plane, attachment_id: str) -> AttachmentState:
    found = plane.projections.document("attachments", attachment_id)
    if found is None or found[0] is None:
        raise CommandRefused(f"unknown attachment {attachment_id!r}")
    return found[0]


def resolve_attachments(
    plane: Plane,
    *,
    resource: str,
    project: str | None = None,
    plan: str | None = None,
    as_of: int | None = None,
) -> list[ResolvedAttachment]:
    """The attachments that apply to work on ``resource`` (as of a position, if given).

    With a plan and no project, the plan's own project is used: the set a validation run
    of that plan resolves.
    """
    resource = check_resource(resource)
    engine = plane.projections
    engine.catch_up()
    if plan is not None and project is None:
        plan_doc = (
            engine.fold_as_of("plans", as_of).get(plan)
            if as_of is not None
            else (engine.document("plans", plan) or (None,))[0]
        )
        if plan_doc is None:
            raise CommandRefused(
                f"unknown plan {plan!r}" + (f" as of position {as_of}" if as_of is not None else "")
            )
        project = plan_doc.project
    if as_of is not None:
        head = plane.store.head().size
        if not 0 <= as_of <= head:
            raise CommandRefused(f"--as-of {as_of} is outside the log (0..{head})")
        attachments = list(engine.fold_as_of("attachments", as_of).values())
        tools = {name: d for name, d in engine.fold_as_of("tools", as_of).items() if d is not None}
    else:
        attachments = engine.documents("attachments", lambda t: t.c.resource == resource)
        tools = {d.name: d for d in engine.documents("tools", lambda t: t.c.kind == "validation")}
    return resolve(
        [a for a in attachments if a is not None],
        tools,
        resource=resource,
        project=project,
        plan=plan,
    )


def pinned_binding(
    plane: Plane, plan: str, *, as_of: int | None = None
) -> list[ResolvedAttachment] | None:
    """The plan's binding set as pinned at Execute (as of a position, if given), folded
    from its stream; None before it first entered Execute."""
    doc = fold_plan.fold_all(
        e.payload for e in plane.store.read_stream(f"plan:{plan}", as_of=as_of)
    )
    if doc is None or (not doc.binding and doc.attempt == 0):
        return None
    return list(doc.binding)
