"""Mutation testing of the security-critical checks: each mutant in ``mutants.toml`` must
be killed by a quick test (docs/testing.md "Mutation testing").

    python -m tests.mutation.run                  # every mutant, its score
    python -m tests.mutation.run --jobs 2         # two at a time (two cores)
    python -m tests.mutation.run --only ID ...    # some (an ID ending in / is a group)
    python -m tests.mutation.run --list           # the list: what each breaks, what kills it
    python -m tests.mutation.run --only ID --tests tests/ledger/test_x.py -k name
                                                  # does this test kill it? (a new test)
    python -m tests.mutation.run --changed main   # only the mutants of files changed
                                                  # since a revision (git diff REV)

A mutant is one reviewed change that removes or weakens one check: the exact original
snippet (it must occur exactly once in its file, or the mutant is *stale* and the run
fails: update the list with the code), its replacement, and the quick tests that must
kill it. The working tree is never touched: the repository is copied once into a
temporary directory (one copy per job), each mutant is applied there, its tests run
there (``PYTHONPATH`` points at the copy; subprocesses inherit it) and the file is put
back before the next mutant. SQLite only (``EVIDENCE_TEST_POSTGRES_URL`` is unset, and
``-m "not slow and not postgres"``) unless the mutant says ``postgres = true``;
hypothesis runs derandomized (the ``ci`` profile).

First the targeted tests run once on the unmutated copy (a baseline): a mutant "killed"
by a test that fails anyway would prove nothing. Then each mutant: killed (a test
failed), survived (every targeted test passed) or, for a mutant listed ``equivalent``,
the same but expected to survive. The score is killed / not equivalent. Exit status 0
when every mutant that is not equivalent is killed and every equivalent one survives;
1 otherwise (a survivor, a stale or malformed list, an equivalent mutant that was
killed: its note is wrong); 2 when the baseline fails.

``--changed REV`` keeps only the mutants whose ``file`` differs between the revision REV
and the tree mutated (``git diff --name-only REV`` there: committed or not, and files not
yet added), with ``--only`` as well if given; none is a run of nothing that succeeds. A
test edited alone selects nothing: run its mutants with ``--only``.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import tomllib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LIST = Path(__file__).with_name("mutants.toml")
# What a copy holds: the code, the tests, and what the tests read.
COPIED = ("ledger", "projections", "commands", "tests", "examples", "docs")
COPIED_FILES = ("pyproject.toml", "README.md", "Dockerfile")
IGNORED = shutil.ignore_patterns("__pycache__", "*.pyc", ".pytest_cache", ".hypothesis")
KEYS = {"id", "file", "why", "original", "replacement", "tests", "k", "equivalent", "postgres"}
TIMEOUT_S = 900


@dataclass(frozen=True)
class Mutant:
    id: str
    file: str
    why: str  # the check the mutant removes, and what its absence would let through
    original: str
    replacement: str
    tests: tuple[str, ...]  # test files (or node ids) that must kill it
    k: str | None = None  # pytest -k expression narrowing them
    equivalent: str | None = None  # why no test can kill it (it survives, as expected)
    postgres: bool = False


@dataclass
class Outcome:
    mutant: Mutant
    status: str  # killed | survived | timeout | error
    seconds: float
    by: str = ""  # the first failing test, or what went wrong

    @property
    def expected(self) -> bool:
        if self.mutant.equivalent is not None:
            return self.status == "survived"
        return self.status in ("killed", "timeout")


def load(path: Path = LIST) -> list[Mutant]:
    """The mutants of the list; ``ValueError`` for a malformed one."""
    with path.open("rb") as f:
        raw = tomllib.load(f)
    mutants: list[Mutant] = []
    for entry in raw.get("mutant", []):
        unknown = set(entry) - KEYS
        missing = {"id", "file", "why", "original", "replacement", "tests"} - set(entry)
        if unknown or missing:
            raise ValueError(f"mutant {entry.get('id')!r}: unknown {unknown}, missing {missing}")
        mutants.append(Mutant(**{**entry, "tests": tuple(entry["tests"])}))
    ids = [m.id for m in mutants]
    duplicates = sorted({i for i in ids if ids.count(i) > 1})
    if duplicates:
        raise ValueError(f"duplicate mutant ids: {duplicates}")
    return mutants


def problems(mutants: list[Mutant], root: Path = ROOT) -> list[str]:
    """Why a mutant cannot be applied to the tree at ``root`` (stale: its snippet moved)."""
    found: list[str] = []
    for m in mutants:
        path = root / m.file
        if not path.is_file():
            found.append(f"{m.id}: no file {m.file}")
            continue
        count = path.read_text().count(m.original)
        if count != 1:
            found.append(
                f"{m.id}: stale, its original snippet occurs {count} times in {m.file} "
                "(update tests/mutation/mutants.toml with the code)"
            )
        if m.original == m.replacement:
            found.append(f"{m.id}: the replacement is the original")
        for target in m.tests:
            if not (root / target.split("::")[0]).exists():
                found.append(f"{m.id}: no test {target}")
    return found


def changed_files(root: Path, rev: str) -> set[str]:
    """The files of the tree at ``root`` that differ from revision ``rev`` (committed
    since, or not committed; new files not yet added too), relative to ``root``;
    ``ValueError`` when git cannot say."""
    found: set[str] = set()
    for command in (
        ["git", "diff", "--name-only", "--relative", rev, "--"],
        ["git", "ls-files", "--others", "--exclude-standard"],
    ):
        try:
            done = subprocess.run(command, cwd=root, capture_output=True, text=True, timeout=60)
        except OSError as exc:
            raise ValueError(f"cannot run git: {exc}") from None
        if done.returncode != 0:
            raise ValueError(f"{' '.join(command[:2])} {rev} in {root}: {done.stderr.strip()}")
        found.update(line for line in done.stdout.splitlines() if line)
    return found


def select(mutants: list[Mutant], only: list[str]) -> list[Mutant]:
    """The mutants named by ``only`` (an id, or a group ending in ``/``); all without."""

    def named(m: Mutant, o: str) -> bool:
        return m.id == o or (o.endswith("/") and m.id.startswith(o))

    if not only:
        return mutants
    unknown = [o for o in only if not any(named(m, o) for m in mutants)]
    if unknown:
        raise SystemExit(f"error: no mutant {', '.join(unknown)} (see --list)")
    return [m for m in mutants if any(named(m, o) for o in only)]


# -- the copies -------------------------------------------------------------------------------


def copy_tree(into: Path, root: Path = ROOT) -> Path:
    into.mkdir(parents=True)
    for name in COPIED:
        if (root / name).exists():
            shutil.copytree(root / name, into / name, ignore=IGNORED, symlinks=True)
    for name in COPIED_FILES:
        shutil.copy2(root / name, into / name)
    return into


def pytest_argv(targets: list[str], k: str | None, postgres: bool) -> list[str]:
    marker = "not slow" if postgres else "not slow and not postgres"
    argv = [sys.executable, "-m", "pytest", *targets, "-m", marker, "-q", "-x"]
    argv += ["-p", "no:cacheprovider", "--hypothesis-profile=ci", "-o", "addopts=-rfE"]
    if k:
        argv += ["-k", k]
    return argv


def run_pytest(tree: Path, argv: list[str], postgres: bool) -> tuple[int | None, str]:
    """pytest's exit status in the copy (None: timed out) and its output."""
    env = {k: v for k, v in os.environ.items() if k not in ("CI", "EVIDENCE_DB", "PYTHONPATH")}
    if not postgres:
        env.pop("EVIDENCE_TEST_POSTGRES_URL", None)
    env["PYTHONPATH"] = str(tree)
    env["EVIDENCE_TEST_GIT_ROOT"] = str(ROOT)  # the copy has no history; tests that read it
    try:
        done = subprocess.run(
            argv, cwd=tree, env=env, capture_output=True, text=True, timeout=TIMEOUT_S
        )
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else exc.stdout or ""
        return None, out
    return done.returncode, done.stdout + done.stderr


_SUMMARY = re.compile(r"^=+ short test summary info =+$")
_SUMMARY_ITEM = re.compile(r"^(?:FAILED|ERROR) (.+?)(?: - .*)?$")


def first_failure(output: str) -> str:
    """The first failing test (or the file that failed to collect), from the short
    summary pytest prints last (``-rfE``): only there, since a captured log line or a
    test's own output can start with ``ERROR`` or ``FAILED`` too. Without a summary (a
    timeout, a crash), the last line of the output."""
    lines = output.splitlines()
    starts = [i for i, line in enumerate(lines) if _SUMMARY.match(line)]
    if starts:
        for line in lines[starts[-1] + 1 :]:
            item = _SUMMARY_ITEM.match(line)
            if item:
                return item.group(1)
    shown = [line for line in lines if line.strip()]
    return shown[-1] if shown else ""


_bump = iter(range(1, 1_000_000))
_bump_lock = threading.Lock()


def run_mutant(tree: Path, m: Mutant) -> Outcome:
    """Apply ``m`` in ``tree``, run its tests, put the file back (whatever happens)."""
    path = tree / m.file
    text = path.read_text()
    stat = path.stat()
    with _bump_lock:
        bump = next(_bump)
    started = time.monotonic()
    try:
        path.write_text(text.replace(m.original, m.replacement, 1))
        # A distinct modification time: the bytecode cached for the original (or for
        # another mutant of the same size) is never taken for this one.
        os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + bump * 2_000_000_000))
        code, output = run_pytest(tree, pytest_argv(list(m.tests), m.k, m.postgres), m.postgres)
    finally:
        path.write_text(text)
        os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    seconds = time.monotonic() - started
    if code is None:
        return Outcome(m, "timeout", seconds, f"no result within {TIMEOUT_S} s")
    if code == 0:
        return Outcome(m, "survived", seconds)
    if code in (1, 2):  # a test failed, or collection failed (an import broke)
        return Outcome(m, "killed", seconds, first_failure(output))
    return Outcome(m, "error", seconds, f"pytest exit status {code}: {first_failure(output)}")


def baseline(tree: Path, mutants: list[Mutant]) -> tuple[bool, str]:
    """The targeted tests pass on the unmutated copy (each backend set once)."""
    for postgres in (False, True):
        targets = sorted({t for m in mutants if m.postgres == postgres for t in m.tests})
        if not targets:
            continue
        code, output = run_pytest(tree, pytest_argv(targets, None, postgres), postgres)
        if code != 0:
            return False, output
    return True, ""


# -- reporting --------------------------------------------------------------------------------


def show(o: Outcome) -> str:
    status = o.status.upper()
    if o.mutant.equivalent is not None:
        status = "EQUIVALENT" if o.status == "survived" else f"EQUIV-{status}"
    by = f"  {o.by}" if o.by else ""
    return f"{status:<18} {o.mutant.id:<48} {o.seconds:6.1f} s{by}"


def summary(outcomes: list[Outcome], stale: int = 0) -> tuple[str, bool]:
    real = [o for o in outcomes if o.mutant.equivalent is None]
    killed = [o for o in real if o.expected]
    survivors = [o for o in real if not o.expected]
    wrong = [o for o in outcomes if o.mutant.equivalent is not None and not o.expected]
    score = 100.0 * len(killed) / len(real) if real else 100.0
    lines = [
        "",
        f"mutants: {len(outcomes)} ({len(real)} to kill, {len(outcomes) - len(real)} equivalent)",
        f"score: {len(killed)}/{len(real)} killed ({score:.1f}%)",
    ]
    if survivors:
        lines.append("SURVIVED (a check no quick test notices missing):")
        lines += [f"  {o.mutant.id}: {o.mutant.why}" for o in survivors]
    if wrong:
        lines.append("listed equivalent, yet killed (correct the list):")
        lines += [f"  {o.mutant.id}: killed by {o.by}" for o in wrong]
    ok = not survivors and not wrong and not stale
    return "\n".join(lines), ok


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.mutation.run", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--only", action="append", default=[], metavar="ID")
    parser.add_argument(
        "--changed",
        metavar="REV",
        help="only the mutants whose file changed since git revision REV (git diff REV)",
    )
    parser.add_argument("--list", action="store_true", help="list the mutants and exit")
    parser.add_argument("--jobs", type=int, default=1, help="mutants run at once (default 1)")
    parser.add_argument(
        "--tests",
        action="append",
        default=[],
        metavar="PATH",
        help="run these tests instead of each mutant's own (with -k: narrowed)",
    )
    parser.add_argument("-k", dest="k", default=None, help="with --tests: a pytest -k expression")
    parser.add_argument("--no-baseline", action="store_true", help="skip the unmutated run")
    parser.add_argument("--keep", action="store_true", help="keep the copies (debugging)")
    parser.add_argument(
        "--root",
        type=Path,
        default=ROOT,
        help="the tree to copy and mutate (default: this working tree; e.g. an export of a "
        "commit: `git archive HEAD | tar -x -C DIR`)",
    )
    args = parser.parse_args(argv)

    root = args.root.resolve()
    try:
        mutants = select(load(), args.only)
        if args.changed is not None:
            changed = changed_files(root, args.changed)
            mutants = [m for m in mutants if m.file in changed]
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if args.changed is not None and not mutants:
        print(f"no mutant's file changed since {args.changed}")
        return 0
    if args.tests:
        mutants = [
            dataclasses.replace(m, tests=tuple(args.tests), k=args.k, equivalent=None)
            for m in mutants
        ]
    if args.list:
        for m in mutants:
            tests = " ".join(m.tests) + (f" -k {m.k!r}" if m.k else "")
            note = f"  [equivalent: {m.equivalent}]" if m.equivalent else ""
            print(f"{m.id}\n    {m.file}: {m.why}\n    killed by: {tests}{note}")
        print(f"{len(mutants)} mutants")
        return 0
    stale = problems(mutants, root)
    for problem in stale:
        print(f"error: {problem}", file=sys.stderr)
    mutants = [m for m in mutants if not any(p.startswith(f"{m.id}:") for p in stale)]
    jobs = max(1, min(args.jobs, len(mutants) or 1))

    scratch = Path(tempfile.mkdtemp(prefix="evidence-mutants-"))
    try:
        trees = [copy_tree(scratch / f"tree{i}", root) for i in range(jobs)]
        print(f"{len(mutants)} mutants of {root}, {jobs} at a time, in {scratch}", flush=True)
        if not args.no_baseline:
            ok, output = baseline(trees[0], mutants)
            if not ok:
                print(output[-6000:])
                print("error: the targeted tests fail without any mutant", file=sys.stderr)
                return 2
            print("baseline: the targeted tests pass unmutated", flush=True)
        free = list(trees)
        lock = threading.Lock()

        def one(m: Mutant) -> Outcome:
            with lock:
                tree = free.pop()
            try:
                outcome = run_mutant(tree, m)
            finally:
                with lock:
                    free.append(tree)
            print(show(outcome), flush=True)
            return outcome

        with ThreadPoolExecutor(max_workers=jobs) as pool:
            outcomes = list(pool.map(one, mutants))
    finally:
        if args.keep:
            print(f"kept {scratch}")
        else:
            shutil.rmtree(scratch, ignore_errors=True)
    text, ok = summary(outcomes, len(stale))
    print(text)
    errors = [o for o in outcomes if o.status == "error"]
    for o in errors:
        print(f"error: {o.mutant.id}: {o.by}", file=sys.stderr)
    return 0 if ok and not errors else 1


if __name__ == "__main__":
    sys.exit(main())
