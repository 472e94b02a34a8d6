"""The evidence report as one self-contained HTML page (``evidence report``): every
value escaped and made inert, no fetch allowed by its Content-Security-Policy. What it
shows is ``report.gather_report``'s; this module only renders it, one function per
section.
"""

from __future__ import annotations

import html
from typing import Any

import ledger
from commands.text import inert
from projections.outcomes import RULES_VERSION

from .report import PlanReport, ResultRow

__all__ = ["render_html"]

CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;color:#1d232b;
 background:#f6f7f9;margin:0;padding:24px 32px}
h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:28px 0 8px;
 border-bottom:2px solid #d0d6de;padding-bottom:4px}
h3{font-size:14px;margin:14px 0 6px}
table{border-collapse:collapse;width:100%;background:#fff;margin:4px 0 8px}
th,td{border:1px solid #d8dde3;padding:4px 8px;text-align:left;vertical-align:top}
th{background:#e9edf2;font-weight:600}
code{font-family:ui-monospace,Menlo,Consolas,monospace;font-size:12.5px;
 overflow-wrap:anywhere}
.nw{white-space:nowrap}
dl{display:grid;grid-template-columns:max-content 1fr;gap:2px 16px;background:#fff;
 padding:10px 14px;border:1px solid #d8dde3;margin:8px 0}
dt{font-weight:600}dd{margin:0}
.badge{display:inline-block;padding:1px 8px;border-radius:10px;font-weight:600;
 font-size:12.5px}
.ok{background:#d5f2dc;color:#11612a}.bad{background:#fbd9d7;color:#8c1d18}
.warn{background:#fdf0c8;color:#6d5200}.muted{background:#e6e9ed;color:#444d58}
tr.fail td{background:#fff4f3}
.err{display:block;color:#8c1d18}
pre.tail{margin:4px 0 0;padding:4px 6px;background:#f3f4f6;border:1px solid #d8dde3;
 font:12px/1.35 ui-monospace,Menlo,Consolas,monospace;white-space:pre-wrap;
 overflow-wrap:anywhere;max-height:20em;overflow:auto}
.none{color:#6b7480;font-style:italic}
footer{margin-top:32px;color:#6b7480;font-size:12px}
"""

_OK = {"pass", "verified", "ok", "applied", "consumed", "landlock"}
_BAD = {
    "fail",
    "blocker",
    "failed",
    "internal_error",
    "validator_error",
    "environment_error",
    "FAILED",
}
_WARN = {
    "escalate",
    "pending",
    "minted",
    "superseded",
    "revise",
    "abandon",
    "applied (unvalidated)",
    "vacuous",
    "unconfined",
}


def _e(value: Any, *, multiline: bool = False) -> str:
    """Every value goes through here: nothing from the log reaches the page unescaped,
    and no control character either (a bell, an escape sequence, a bidi override are
    written as visible escapes, ``\x07``, exactly as the terminal shows them: ``inert``).
    With ``multiline`` newlines stay (for a ``<pre>``)."""
    text = "-" if value is None else inert(value, multiline=multiline)
    return html.escape(text, quote=True)


def _why(x: ResultRow) -> str:
    """A result's message, and for a failure its error and output tails (``<pre>``)."""
    parts = [_e(x.message)] if x.message is not None or x.error is None else []
    if x.error:
        parts.append(f'<span class="err">{_e(x.error)}</span>')
    for name, tail in (("stderr", x.stderr_tail), ("stdout", x.stdout_tail)):
        if tail:
            parts.append(
                f'<pre class="tail" title="{name}">{_e(name, multiline=True)}:\n'
                f"{_e(tail, multiline=True)}</pre>"
            )
    return "".join(parts)


def _yes_no(value: bool | None) -> str | None:
    return None if value is None else "yes" if value else "no"


def _badge(value: Any) -> str:
    text = "-" if value is None else str(value)
    if text in _OK:
        kind = "ok"
    elif text in _BAD or text.startswith(("no verdict", "broken:")):
        kind = "bad"
    else:
        kind = "warn" if text in _WARN else "muted"
    return f'<span class="badge {kind}">{_e(text)}</span>'


def _table(
    headers: list[str], rows: list[list[str]], *, empty: str, row_classes: list[str] | None = None
) -> str:
    """``rows`` hold already-rendered (escaped) cells."""
    if not rows:
        return f'<p class="none">{_e(empty)}</p>'
    head = "".join(f"<th>{_e(h)}</th>" for h in headers)
    body = []
    for i, row in enumerate(rows):
        cls = f' class="{row_classes[i]}"' if row_classes and row_classes[i] else ""
        body.append(f"<tr{cls}>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def _code(value: Any) -> str:
    return f"<code>{_e(value)}</code>"


def _nw(value: Any, *, code: bool = False) -> str:
    """A cell that must not wrap (times, event types)."""
    inner = _code(value) if code else _e(value)
    return f'<span class="nw">{inner}</span>'


def _dl(items: list[tuple[str, str]]) -> str:
    return "<dl>" + "".join(f"<dt>{_e(k)}</dt><dd>{v}</dd>" for k, v in items) + "</dl>"


def _section(ident: str, title: str, body: str) -> str:
    return f'<section id="{ident}"><h2>{_e(title)}</h2>{body}</section>'


def _terminal(r: PlanReport) -> str:
    if not r.terminal:
        return _e("not terminal")
    if r.terminal.endswith("(unvalidated)"):
        return (
            _badge(r.terminal)
            + " "
            + _e(
                "Apply after a run in which no required validation ran (require_validation: false)"
            )
        )
    return _badge(r.terminal)


def _confinement(r: PlanReport) -> str:
    c = r.confinement
    if c is None:
        return _e(None)
    badge = _badge("unconfined" if c.policy == "none" or c.unconfined else "landlock")
    return f"{badge} {_e(c.text())}"


def render_html(report: PlanReport) -> str:
    """The report as one self-contained HTML page."""
    r = report
    body = "".join(
        [
            f"<h1>Evidence report: plan {_e(r.plan_id)}</h1>",
            _section("plan", "Plan", _plan(r)),
            _section("timeline", "Timeline", _timeline(r)),
            _section("gates", "Gate checks", _gates(r)),
            _section("validations", "Validation results", _results(r)),
            _section("decisions", "Decisions", _decisions(r)),
            _section("token", "Token", _tokens(r)),
            _section("outcome", "Outcome classification", _outcome(r)),
            _section("verification", "Verification", _verification(r)),
            f"<footer>Generated {_e(r.generated_at)} by evidence {_e(ledger.__version__)} "
            f"from {_e(r.source or 'the ledger')} at tree size {_e(r.size)}.</footer>",
        ]
    )
    # The CSP forbids every fetch: the page must stand alone, offline, as it is.
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta http-equiv="Content-Security-Policy" content="default-src \'none\'; '
        "style-src 'unsafe-inline'\">"
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>Evidence report: {_e(r.plan_id)}</title><style>{CSS}</style></head>"
        f"<body>{body}</body></html>\n"
    )


def _plan(r: PlanReport) -> str:
    """The plan: what it is and where it stands, its binding set, what Apply wrote."""
    verified = r.verification.ok and r.audit.ok
    header = _dl(
        [
            ("plan", _code(r.plan_id)),
            ("project", _e(r.project)),
            ("resources", ", ".join(_code(x) for x in r.resources) or _e(None)),
            ("phase", _e(r.phase)),
            ("revision / attempt", f"{_e(r.revision)} / {_e(r.attempt)}"),
            ("strict mode", _e(_yes_no(r.strict_mode))),
            ("outcome", _badge(r.outcome)),
            ("terminal state", _terminal(r)),
            ("confinement", _confinement(r)),
            (
                "log",
                f"{_e(r.source or 'ledger')} as of position {_e(r.size)}, root {_code(r.root)}",
            ),
            ("verification", _badge("verified" if verified else "FAILED")),
        ]
    )
    header += "<h3>Binding set (pinned at Execute)</h3>" + _table(
        ["validation", "version", "mode", "scope", "resource", "attachment"],
        [
            [
                _e(b.validation),
                _e(b.version),
                _e(b.mode),
                _e(b.scope),
                _code(b.resource),
                _code(b.attachment_id),
            ]
            for b in r.binding
        ],
        empty="no validation pinned",
    )
    return (
        header
        + "<h3>Files written by Apply</h3>"
        + _table(
            ["resource", "path", "sha256"],
            [[_code(f.resource), _code(f.path), _code(f.sha256)] for f in r.applied_files],
            empty="none",
        )
    )


def _timeline(r: PlanReport) -> str:
    return _table(
        ["pos", "time", "actor", "event", "phase", "summary"],
        [
            [
                _e(t.position),
                _nw(t.recorded_at),
                _e(t.actor),
                _nw(t.type, code=True),
                _e(t.phase),
                _e(t.summary),
            ]
            for t in r.timeline
        ],
        empty="no events",
    )


def _gates(r: PlanReport) -> str:
    """Every gate check, a failed one marked, then every deviation."""
    gate_rows, gate_classes = [], []
    for g in r.gates:
        subject = f"tool {g.tool}" + (f" v{g.tool_version}" if g.tool_version else "")
        if g.step:
            subject += f", step {g.step}"
        gate_rows.append(
            [
                _e(g.position),
                _e(g.gate),
                _e(subject),
                _badge(g.verdict),
                _e(f"{g.attempt} / {g.iteration}"),
                _e(_yes_no(g.strict_mode)),
                _e(len(g.deviations)),
            ]
        )
        gate_classes.append("fail" if g.verdict == "fail" else "")
    gates = _table(
        ["pos", "gate", "subject", "verdict", "attempt / iteration", "strict", "deviations"],
        gate_rows,
        empty="no gate checks",
        row_classes=gate_classes,
    )
    deviations = [
        [_e(g.position), _code(d.pointer), _code(d.kind), _e(d.message)]
        for g in r.gates
        for d in g.deviations
    ]
    return (
        gates
        + "<h3>Deviations</h3>"
        + _table(["gate check", "pointer", "kind", "message"], deviations, empty="no deviations")
    )


def _results(r: PlanReport) -> str:
    return _table(
        [
            "pos",
            "validation",
            "mode",
            "verdict",
            "message / why",
            "duration",
            "run / attempt",
            "confinement",
        ],
        [
            [
                _e(x.position),
                _e(x.validation),
                _e(x.mode),
                _badge(x.verdict),
                _why(x),
                _nw(f"{x.duration_ms} ms"),
                f"{_code(x.run_id[-6:])} / {_e(x.attempt)}",
                _badge(x.confinement) if x.confinement else _e(None),
            ]
            for run in r.runs
            for x in run.results
        ],
        empty="no validation results",
        row_classes=["fail" if x.verdict != "pass" else "" for run in r.runs for x in run.results],
    )


def _decisions(r: PlanReport) -> str:
    return _table(
        [
            "decision",
            "escalated",
            "options",
            "approver",
            "choice",
            "guidance / reason",
            "signed at",
            "signature",
        ],
        [
            [
                _code(d.decision_id),
                f"{_e(d.escalated_at)}: {_e(d.escalation_reason)}",
                _e(", ".join(d.options)),
                _e(d.approver),
                _badge(d.choice),
                _e(" / ".join(x for x in (d.guidance, d.reason) if x) or None),
                _nw(d.signed_at),
                _badge(d.signature),
            ]
            for d in r.decisions
        ],
        empty="no escalations or decisions",
    )


def _tokens(r: PlanReport) -> str:
    return _table(
        ["token", "status", "attempt", "run", "minted at", "issued", "expires", "consumed at"],
        [
            [
                _code(t.token_id),
                _badge(t.status),
                _e(t.attempt),
                _code(t.run_id),
                _e(t.minted_at),
                _nw(t.issued_at),
                _nw(t.expires_at),
                _e(t.consumed_at),
            ]
            for t in r.tokens
        ],
        empty="no token minted",
    )


def _outcome(r: PlanReport) -> str:
    """The outcome, each run's recorded and re-derived classification, the halts."""
    outcome = _dl(
        [
            ("outcome", _badge(r.outcome)),
            (
                "last run's outcome",
                _badge(r.last_outcome)
                + (_e(" — no required validation ran") if r.unvalidated else ""),
            ),
            ("terminal state", _terminal(r)),
        ]
    )
    outcome += "<h3>Runs</h3>" + _table(
        [
            "run",
            "pos",
            "attempt / revision",
            "attachments",
            "recorded outcome",
            f"re-derived (rules v{RULES_VERSION})",
        ],
        [
            [
                _code(x.run_id),
                _e(x.position),
                _e(f"{x.attempt} / {x.revision}"),
                _e(x.resolved),
                (
                    _badge(x.outcome)
                    + _e(f" (rules v{x.rules_version})")
                    + (" " + _badge("vacuous") if x.vacuous else "")
                )
                if x.outcome
                else _e("open"),
                _badge(x.rederived),
            ]
            for x in r.runs
        ],
        empty="no validation runs",
    )
    return (
        outcome
        + "<h3>Halts</h3>"
        + _table(
            ["pos", "canonical", "raw", "terminal", "reason"],
            [
                [
                    _e(h.position),
                    _badge(h.halt_type),
                    _code(h.raw_halt_type),
                    _e(_yes_no(h.terminal)),
                    _e(h.reason),
                ]
                for h in r.halts
            ],
            empty="no halts",
        )
    )


def _verification(r: PlanReport) -> str:
    """The log's verification and the plan's audit, with what either found."""
    v, a = r.verification, r.audit
    verify_line = (
        f"{_badge('verified')} {_e(v.checked_events)} events and "
        f"{_e(v.checked_blobs)} blobs verified"
        if v.ok
        else f"{_badge('FAILED')} {_e(len(v.problems))} problem(s)"
    )
    audit_line = (
        f"{_badge('ok')} audited as of position {_e(a.size)}, no violation"
        if a.ok
        else f"{_badge('FAILED')} {_e(len(a.violations))} violation(s)"
    )
    verification = _dl(
        [
            ("log (verify)", verify_line),
            ("tree head", f"{_e(v.size)} : {_code(v.root)}"),
            ("invariants (audit --plan)", audit_line),
            ("checks run", _e(", ".join(f"{k} {n}" for k, n in a.checked.items()) or None)),
        ]
    )
    if v.problems:
        verification += "<h3>Verification problems</h3>" + _table(
            ["position", "kind", "detail"],
            [
                [_e(p.position if p.position is not None else "head"), _code(p.kind), _e(p.detail)]
                for p in v.problems
            ],
            empty="",
        )
    if a.violations:
        verification += "<h3>Audit violations</h3>" + _table(
            ["position", "invariant", "detail"],
            [
                [_e(p.position if p.position is not None else "log"), _code(p.kind), _e(p.detail)]
                for p in a.violations
            ],
            empty="",
        )
    return verification
