"""What every command shares: the ``--db`` option (before or after the command), opening
the store, JSON and table output, and the exit-status convention.

Exit status: 0 success; 1 a verdict (verify found a problem, a gate deviation, a halt);
2 a refused command (bad input, or a step the state does not allow) — with one line
``error: ...`` on stderr and nothing appended.
"""

from __future__ import annotations

import contextlib
import functools
import shutil
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

import click

import ledger

from .terminal import inert, json_inert, no_color

if TYPE_CHECKING:  # imported where used: `evidence --version` and `--help` need neither
    from rich.console import Console

    from commands.plane.core import Plane

EXIT_OK, EXIT_VERDICT, EXIT_REFUSED = 0, 1, 2

F = TypeVar("F", bound=Callable[..., Any])

DB_HELP = "Database URL (default: $EVIDENCE_DB, else sqlite:///evidence.db)."


def db_option(fn: F) -> F:
    """Accept ``--db`` after the command too: ``evidence events --db URL``."""

    @click.option("--db", "db_url", default=None, metavar="URL", help=DB_HELP)
    @functools.wraps(fn)
    def wrapper(*args: Any, db_url: str | None, **kwargs: Any) -> Any:
        if db_url is not None:
            click.get_current_context().find_root().meta["evidence.db"] = db_url
        return fn(*args, **kwargs)

    return wrapper  # type: ignore[return-value]


def workdir_option(fn: F) -> F:
    """``--workdir DIR``: where plans' sandboxes live (default: the ledger's state
    directory, ``$EVIDENCE_STATE_DIR`` or ``<db>.state``). Give every command working on
    a plan the same one."""

    @click.option(
        "--workdir",
        type=click.Path(file_okay=False, path_type=Path),
        default=None,
        help="Where plans' sandboxes live (default: "
        "$EVIDENCE_STATE_DIR, else DB.state next to a SQLite file).",
    )
    @functools.wraps(fn)
    def wrapper(*args: Any, workdir: Path | None, **kwargs: Any) -> Any:
        if workdir is not None:
            click.get_current_context().find_root().meta["evidence.workdir"] = workdir
        return fn(*args, **kwargs)

    return wrapper  # type: ignore[return-value]


def db_url() -> str:
    return click.get_current_context().find_root().meta.get("evidence.db") or ledger.default_url()


def open_store(*, create: bool = False) -> ledger.Store:
    """Open the ledger named by ``--db``; read-only commands never create a file."""
    if create:
        note_fresh_ledger(db_url())
    store = ledger.open(db_url(), create=create)
    click.get_current_context().call_on_close(store.close)
    note_single_user_layout()
    return store


def note_single_user_layout() -> None:
    """One line on stderr, once per command, when the ledger is in the developer's
    single-user layout (``signing.single_user_layout``): what it does not protect."""
    import getpass

    from commands.rules.signing import SINGLE_USER_DOC, single_user_layout

    meta = click.get_current_context().find_root().meta
    key = None if meta.get("evidence.layout-noted") else single_user_layout(db_url())
    if key is None:
        return
    meta["evidence.layout-noted"] = True
    user = getpass.getuser()
    click.echo(
        f"note: single-user layout: the plane key {key} and the operator key beside it "
        f"are {user}'s, so anything running as {user}, an agent too, can sign as the "
        f"plane and the operator; keep an agent to another user, or deploy with "
        f"EVIDENCE_PLANE_KEY ({SINGLE_USER_DOC})",
        err=True,
    )


def open_plane(
    *, create: bool = False, layout_note: bool = True, inline_read_models: bool = True
) -> Plane:
    """The store with its read models (opening them may rebuild or catch them up), and
    the developer layout's note on stderr unless ``layout_note`` is false (a hook: its
    stderr is what the agent is told).

    One rule for a missing ledger: only a command that starts something (``init``,
    ``run``, ``demo``, registering, defining, creating a plan, adding a key, starting a
    review) passes ``create=True``; every other refuses with the store's one line
    (``no ledger at …: run `evidence init` first``) and creates nothing.

    ``inline_read_models=False``: a long-lived writer (the MCP proxy) that leaves the read
    models to whoever reads them next (every listing catches them up first), as the
    service's planes do, so a gated call does not pay for them."""
    from commands.plane.core import Plane

    from .progress import progress_bar

    if create:
        note_fresh_ledger(db_url())
    # Opening catches the read models up (or rebuilds a changed one): a bar on a
    # terminal when that takes more than a second (the first open of a large ledger).
    with progress_bar("read models") as progress:
        plane = Plane.open(
            db_url(),
            create=create,
            workdir=click.get_current_context().find_root().meta.get("evidence.workdir"),
            progress=progress,
            inline_read_models=inline_read_models,
        )
    click.get_current_context().call_on_close(plane.close)
    if layout_note:
        note_single_user_layout()
    return plane


# -- a refused command leaves no ledger behind ---------------------------------------------

# The files a command that may create a SQLite ledger would make, and which of them did
# not exist before it ran (one entry per fresh ledger; reset by ``main`` per command).
_FRESH: list[tuple[str, list[Path]]] = []


def note_fresh_ledger(url: str) -> None:
    """Before a command creates the ledger at ``url``: if it is a SQLite file that does not
    exist yet, note it and the files that come with it (its WAL and journal, its state
    directory, the plane and operator keys beside it) that do not exist either, so that a
    refusal removes them (``discard_fresh_ledgers``). PostgreSQL is a server's database,
    never removed."""
    import os

    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    from commands.rules.signing import operator_key_path, plane_key_path
    from commands.runner.sandbox import state_dir

    try:
        parsed = make_url(url)
        if parsed.get_backend_name() != "sqlite" or parsed.database in (None, "", ":memory:"):
            return
        path = Path(os.path.abspath(parsed.database))
        if os.path.lexists(path) or any(url == known for known, _ in _FRESH):
            return
        keys = [plane_key_path(url), operator_key_path(url)]
    except (ledger.LedgerError, ValueError, ArgumentError):
        return
    candidates = [
        path,
        *(path.with_name(path.name + suffix) for suffix in ("-wal", "-shm", "-journal")),
        state_dir(url),
        *keys,
        *(key.with_name(key.name + ".pub") for key in keys),
    ]
    _FRESH.append((url, [c for c in candidates if not os.path.lexists(c)]))


def reset_fresh_ledgers() -> None:
    _FRESH.clear()


def discard_fresh_ledgers() -> None:
    """After a refusal: remove each ledger this command created, with the files that came
    with it, if it holds no event (a refusal appends nothing; a command refused after it
    appended keeps its ledger, which is evidence)."""
    import os

    while _FRESH:
        url, made = _FRESH.pop()
        try:
            with ledger.open(url, create=False) as store:
                if store.head().size:
                    continue
        except Exception:  # no ledger (never made), or not one to touch
            if not os.path.lexists(made[0]):
                continue
            return
        for path in made:
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path, ignore_errors=True)
            elif os.path.lexists(path):
                with contextlib.suppress(OSError):
                    os.unlink(path)


def server_options(fn: F) -> F:
    """``--server URL`` and ``--operator-key PATH``: an operator's command through the
    evidence service, signed here (``operator_remote``): no database, no plane key."""
    fn = click.option(
        "--operator-key",
        "operator_key",
        metavar="PATH",
        default=None,
        help="With --server: the operator key that signs here (default $EVIDENCE_OPERATOR_KEY).",
    )(fn)
    return click.option(
        "--server",
        "server",
        metavar="URL",
        default=None,
        help="Act through the evidence service at URL (unix:PATH or https://…), the "
        "events signed here with the operator key: no database, no plane key needed.",
    )(fn)


def json_option(fn: F) -> F:
    return click.option(
        "--json", "as_json", is_flag=True, help="Print one JSON document (see docs/cli.md)."
    )(fn)


FORMATS = ("table", "json", "jsonl", "csv")


def format_option(
    formats: Sequence[str] = FORMATS, *, json_means: str = "json"
) -> Callable[[F], F]:
    """``--format table|json|jsonl|csv`` of a listing command, and ``--json`` as the
    alias it always was (``--format json``; for ``tail``, whose output is a stream,
    ``--format jsonl``). The command receives ``fmt``."""

    def decorate(fn: F) -> F:
        @click.option(
            "--format",
            "fmt",
            type=click.Choice(formats),
            default=None,
            help="table (default), "
            + ", ".join(f for f in formats if f != "table")
            + " (docs/cli.md, Output formats).",
        )
        @click.option("--json", "as_json", is_flag=True, help=f"The same as --format {json_means}.")
        @functools.wraps(fn)
        def wrapper(*args: Any, fmt: str | None, as_json: bool, **kwargs: Any) -> Any:
            if as_json:
                if fmt not in (None, json_means):
                    fail(f"--json means --format {json_means}: give one of them, not both")
                fmt = json_means
            return fn(*args, fmt=fmt or "table", **kwargs)

        return wrapper  # type: ignore[return-value]

    return decorate


def emit_json(document: Any) -> None:
    import msgspec

    sys.stdout.buffer.write(terminal_safe_json(msgspec.json.encode(document) + b"\n"))
    sys.stdout.flush()


def emit_jsonl(rows: Iterable[Any]) -> None:
    """One JSON document a line (JSON Lines)."""
    import msgspec

    encode = msgspec.json.encode
    sys.stdout.buffer.write(terminal_safe_json(b"".join(encode(row) + b"\n" for row in rows)))
    sys.stdout.flush()


def terminal_safe_json(data: bytes) -> bytes:
    """JSON for standard output: on a terminal the characters a terminal would act on
    (a bidi override, DEL, a C1 control) as JSON ``\\u`` escapes — the same values;
    piped, the bytes as encoded."""
    return json_inert(data) if sys.stdout.isatty() else data


def csv_cell(value: Any) -> str:
    """A value as a CSV cell: text as it is, numbers as JSON writes them, true/false,
    null as an empty cell, lists and objects as compact JSON."""
    import msgspec

    if value is None:
        return ""
    if isinstance(value, str):
        return value
    return msgspec.json.encode(value).decode()


def emit_csv(rows: Sequence[Mapping[str, Any]]) -> None:
    """RFC 4180 CSV: a header of every key the rows have (in the order they first
    appear), then one line per row; a key a row lacks is an empty cell. No rows, no
    output (there is no header to give). Values are exact when piped: CSV is for
    programs, as JSON is."""
    import csv
    import io

    if not rows:
        return
    columns: dict[str, None] = {}
    for row in rows:
        columns.update(dict.fromkeys(row))
    # CSV has no escapes: on a terminal, cells are shown inert (as `ls` quotes names only
    # for a terminal) and lines end as a terminal's do; piped, all is exact RFC 4180.
    tty = sys.stdout.isatty()
    shown = inert if tty else str
    text = io.StringIO()
    writer = csv.writer(text, lineterminator="\n" if tty else "\r\n")
    writer.writerow([shown(c) for c in columns])
    writer.writerows([[shown(csv_cell(row.get(c))) for c in columns] for row in rows])
    sys.stdout.buffer.write(text.getvalue().encode("utf-8", "surrogateescape"))
    sys.stdout.flush()


def emit_listing(fmt: str, document: Any, rows: Sequence[Any], table: Callable[[], None]) -> None:
    """A listing in the format asked for: ``json`` the command's one document, ``jsonl``
    its rows one a line, ``csv`` the same rows as CSV, ``table`` what ``table`` prints.
    ``rows`` are the objects of the document's list (converted to JSON values here)."""
    if fmt == "json":
        emit_json(document)
        return
    if fmt in ("jsonl", "csv"):
        import msgspec

        plain = [msgspec.to_builtins(row) for row in rows]
        (emit_jsonl if fmt == "jsonl" else emit_csv)(plain)
        return
    table()


STDOUT = "-"


def refuse_stdout(value: object, option: str, why: str) -> None:
    """``-`` (standard output) where a file is required: refused, saying why."""
    if str(value) == STDOUT:
        fail(f"{option} -: {why}; give a file name")


def data_to_stdout(option: str) -> None:
    """``OPTION -`` writes a file's exact bytes to standard output: not to a terminal,
    which would act on whatever the agent's text holds (redirect or pipe it)."""
    if sys.stdout.isatty():
        fail(
            f"{option} -: standard output is a terminal; redirect it to a file or a pipe "
            "(the file is written byte for byte)"
        )


def console() -> Console:
    """Human output through rich: no markup, no emoji codes (what it prints may be the
    agent's text; pass that through ``inert`` too)."""
    from rich.console import Console

    return Console(
        soft_wrap=True,
        highlight=False,
        markup=False,
        emoji=False,
        color_system=None if no_color() else "auto",  # NO_COLOR: no style at all
    )


def print_table(columns: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    """Aligned columns, one line per row. On a terminal a line longer than the screen is
    cut with an ellipsis (the last column is the one that gives); piped output is whole.
    Every cell is shown ``inert``: control characters as visible escapes."""
    columns = [inert(c) for c in columns]
    rows = [[inert(c) for c in row] for row in rows]
    tty = sys.stdout.isatty()
    limit = shutil.get_terminal_size().columns if tty else None
    widths = [max([len(c), *(len(r[i]) for r in rows)]) for i, c in enumerate(columns[:-1])]

    def line(cells: Sequence[str]) -> str:
        text = "  ".join([*(c.ljust(w) for c, w in zip(cells, widths, strict=False)), cells[-1]])
        text = text.rstrip()
        if limit is not None and len(text) > limit:
            text = text[: limit - 1] + "…"
        return text

    header = line(columns)
    click.echo(click.style(header, bold=True) if tty and not no_color() else header)
    if rows:  # one write: a long table (`plan history` of a long plan) is not a call a line
        click.echo("\n".join(line(row) for row in rows))


def fail(message: str) -> NoReturn:
    """Refuse the command: one line on stderr, exit 2."""
    raise click.UsageError(inert(message))


def read_policy(path: Path, option: str) -> tuple[Any, str]:
    """The witness policy (C2SP tlog-policy) ``option`` names, and its text; refused
    (exit 2, one line) when the file is not one."""
    from ledger.checkpoints import CheckpointError
    from ledger.intake import read_text
    from ledger.tlog_policy import parse_policy

    text = read_text(path, "document", f"{option} {path}")
    try:
        return parse_policy(text), text
    except CheckpointError as exc:
        fail(f"{option} {inert(str(path))}: {exc}")
