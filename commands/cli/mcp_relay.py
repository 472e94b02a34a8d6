"""What the MCP gate proxy carries besides tool calls (docs/agents.md, "What the proxy
carries"): the upstream's resources, prompts, completions and logging, forwarded as the
upstream declares them; and what the upstream says to the agent's client while a call
runs — log and progress notifications, sampling and elicitation requests — relayed to
the agent and kept for the call's record (``tool.called``'s ``exchange``).

- Only what the upstream declares is offered: the agent sees the upstream's
  capabilities (resources, subscriptions, prompts, completions, logging), no more.
- A resource read and a prompt fetch are recorded by the plane (``Fetched``) before the
  agent gets the answer.
- A sampling or elicitation request is relayed only within a tool call, on that call's
  stream, and only when the agent's client declared the capability; otherwise it is
  refused and the refusal is recorded: the call's answer, made without what the server
  asked for, is the tool's failure, never a normal pass.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

import mcp_types as types
from mcp import ClientSession
from mcp.client.session import ClientRequestContext, IncomingMessage
from mcp.server.session import ServerSession
from mcp.shared.dispatcher import ProgressFnT
from mcp.shared.exceptions import MCPError
from mcp.shared.message import ServerMessageMetadata
from pydantic import BaseModel

from commands.runner.said import Said

R = TypeVar("R", bound=BaseModel)
# A resource read or a prompt fetch, recorded before its answer reaches the agent:
# (what: "resource" | "prompt", its URI or name, the answer as JSON).
Fetched = Callable[[str, str, dict[str, Any]], Awaitable[None]]


def _json(model: BaseModel) -> dict[str, Any]:
    return model.model_dump(by_alias=True, mode="json", exclude_none=True)


@dataclass
class CallExchange:
    """One forwarded call's back channel: the agent's session and request it rides on,
    and what the upstream said to the agent's client meanwhile, in order."""

    session: ServerSession
    request_id: types.RequestId | None
    messages: Said = field(default_factory=Said)  # within its budget (commands.runner.said)

    @property
    def related(self) -> ServerMessageMetadata:
        return ServerMessageMetadata(related_request_id=self.request_id)


class Relay:
    """The upstream's messages to the agent's client, and the calls they belong to.

    The upstream speaks to one client (the proxy) over one connection, so a message it
    sends while calls run names no call: it is taken as the latest call's (an agent
    CLI makes one call at a time; docs/agents.md says so)."""

    def __init__(self) -> None:
        self.agent: ServerSession | None = None  # the agent's session, once it asked
        self._calls: list[CallExchange] = []

    def seen(self, ctx: Any) -> None:
        """Remember the agent's session (a request's ``ctx``) for what is not a call's."""
        self.agent = ctx.session

    @contextlib.contextmanager
    def call(self, ctx: Any) -> Iterator[CallExchange]:
        """The back channel of the tool call ``ctx`` is serving, while it runs."""
        self.seen(ctx)
        exchange = CallExchange(ctx.session, ctx.request_id)
        self._calls.append(exchange)
        try:
            yield exchange
        finally:
            self._calls.remove(exchange)

    def _current(self) -> CallExchange | None:
        return self._calls[-1] if self._calls else None

    # -- notifications --------------------------------------------------------------------

    async def on_log(self, params: types.LoggingMessageNotificationParams) -> None:
        """A log message: relayed (on the call's stream while one runs) and kept."""
        call = self._current()
        notification = types.LoggingMessageNotification(params=params)
        if call is not None:
            if call.messages.keep({"kind": "log", "params": _json(params)}):
                await call.session.send_notification(notification, call.request_id)
        elif self.agent is not None:
            await self.agent.send_notification(notification)

    def progress_of(self, call: CallExchange) -> ProgressFnT:
        """The progress callback of a forwarded call whose client asked for progress."""

        async def relay(progress: float, total: float | None, message: str | None) -> None:
            params = {"progress": progress, "total": total, "message": message}
            kept = {k: v for k, v in params.items() if v is not None}
            if call.messages.keep({"kind": "progress", "params": kept}):
                await call.session.report_progress(progress, total, message)

        return relay

    async def on_notification(self, message: IncomingMessage) -> None:
        """Resource and prompt changes, passed on to the agent as they come."""
        if self.agent is None or isinstance(message, Exception):
            return
        if isinstance(
            message,
            types.ResourceUpdatedNotification
            | types.ResourceListChangedNotification
            | types.PromptListChangedNotification,
        ):
            with contextlib.suppress(Exception):  # the agent went away: nothing to tell
                await self.agent.send_notification(message)

    # -- the upstream's requests ----------------------------------------------------------

    async def on_sampling(
        self, context: ClientRequestContext, params: types.CreateMessageRequestParams
    ) -> types.CreateMessageResult | types.ErrorData:
        offered = types.ClientCapabilities(sampling=types.SamplingCapability())
        request = types.CreateMessageRequest(params=params)
        return await self._relay("sampling", request, types.CreateMessageResult, offered)

    async def on_elicitation(
        self, context: ClientRequestContext, params: types.ElicitRequestParams
    ) -> types.ElicitResult | types.ErrorData:
        offered = types.ClientCapabilities(elicitation=types.ElicitationCapability())
        request = types.ElicitRequest(params=params)
        return await self._relay("elicitation", request, types.ElicitResult, offered)

    async def _relay(
        self,
        kind: str,
        request: types.CreateMessageRequest | types.ElicitRequest,
        result_type: type[R],
        offered: types.ClientCapabilities,
    ) -> R | types.ErrorData:
        """Ask the agent's client on the call's stream; keep the request and its answer."""
        call = self._current()
        asked = _json(request.params)
        if call is None:
            return types.ErrorData(
                code=types.INVALID_REQUEST,
                message=f"{kind} is relayed only during a tool call (where it is recorded)",
            )
        if not call.session.check_client_capability(offered):
            refusal = types.ErrorData(
                code=types.INVALID_REQUEST,
                message=f"the agent's client does not offer {kind}; the gate records the "
                "call as the tool's failure",
            )
            call.messages.append(
                {"kind": kind, "request": asked, "refused": True, "error": _json(refusal)}
            )
            return refusal
        try:
            answer = await call.session.send_request(request, result_type, metadata=call.related)
        except MCPError as exc:
            call.messages.append({"kind": kind, "request": asked, "error": _json(exc.error)})
            return exc.error
        call.messages.append({"kind": kind, "request": asked, "answer": _json(answer)})
        return answer


def forwarding(
    upstream: ClientSession,
    declared: types.ServerCapabilities,
    relay: Relay,
    fetched: Fetched,
) -> dict[str, Any]:
    """The agent-side server's handlers for what the upstream declares, besides tools
    (``Server(**forwarding(...))``): each forwards the request as it came."""

    def forward(request_type: Any, result_type: type[R]) -> Callable[[Any, Any], Awaitable[R]]:
        async def handler(ctx: Any, params: Any) -> R:
            relay.seen(ctx)
            return await upstream.send_request(request_type(params=params), result_type)

        return handler

    async def read_resource(
        ctx: Any, params: types.ReadResourceRequestParams
    ) -> types.ReadResourceResult:
        relay.seen(ctx)
        request = types.ReadResourceRequest(params=params)
        result = await upstream.send_request(request, types.ReadResourceResult)
        await fetched("resource", params.uri, _json(result))
        return result

    async def get_prompt(ctx: Any, params: types.GetPromptRequestParams) -> types.GetPromptResult:
        relay.seen(ctx)
        request = types.GetPromptRequest(params=params)
        result = await upstream.send_request(request, types.GetPromptResult)
        await fetched("prompt", params.name, _json(result))
        return result

    handlers: dict[str, Any] = {}
    if declared.resources is not None:
        handlers["on_list_resources"] = forward(
            types.ListResourcesRequest, types.ListResourcesResult
        )
        handlers["on_list_resource_templates"] = forward(
            types.ListResourceTemplatesRequest, types.ListResourceTemplatesResult
        )
        handlers["on_read_resource"] = read_resource
        if declared.resources.subscribe:
            handlers["on_subscribe_resource"] = forward(types.SubscribeRequest, types.EmptyResult)
            handlers["on_unsubscribe_resource"] = forward(
                types.UnsubscribeRequest, types.EmptyResult
            )
    if declared.prompts is not None:
        handlers["on_list_prompts"] = forward(types.ListPromptsRequest, types.ListPromptsResult)
        handlers["on_get_prompt"] = get_prompt
    if declared.completions is not None:
        handlers["on_completion"] = forward(types.CompleteRequest, types.CompleteResult)
    if declared.logging is not None:
        handlers["on_set_logging_level"] = forward(types.SetLevelRequest, types.EmptyResult)
    return handlers


def notification_options(declared: types.ServerCapabilities) -> Any:
    """The agent-side server says what the upstream says about changing lists."""
    from mcp.server.lowlevel.server import NotificationOptions

    return NotificationOptions(
        prompts_changed=bool(declared.prompts and declared.prompts.list_changed),
        resources_changed=bool(declared.resources and declared.resources.list_changed),
        tools_changed=bool(declared.tools and declared.tools.list_changed),
    )
