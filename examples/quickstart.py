"""A plan from start to Apply through the plane's Python API, then the log it left.

Run it from an empty directory (it writes its project there, and the ledger at
$EVIDENCE_DB, else ./evidence.db; each run makes a new plan and a new project):

    python examples/quickstart.py
    evidence plan history PLAN_ID && evidence verify && evidence audit

What happens, in the words of docs/concepts.md:

1. The registry: a tool that writes a greeting file (its parameters and its output
   declared as JSON Schemas) and a *required validation* that passes only when the
   greeting is spelled right.
2. The validation is *attached* to the project directory, so it gates every plan that
   works on it.
3. A plan is created (phase Strategize), records its strategy and enters Execute: its
   *binding set* (the validations that will judge it) is pinned, and the project is
   copied into the plan's sandbox, where all work happens until Apply.
4. The agent calls the tool with a parameter the schema does not declare: the *input
   gate* records the deviation and the call is never made.
5. The validation runs and fails: the outcome is ``blocker`` (a verdict about the
   work). The agent calls the tool correctly — it passes both gates and writes in the
   sandbox — and records the fix.
6. The validation runs again and passes: the plane mints a single-use *token*.
7. Apply consumes the token and writes the sandbox's changes into the real project.
8. The plan's events are read back, and the whole log is verified (hash chain and
   Merkle tree) and audited (every verdict re-derived from what was recorded).

The plan-file way to do the same is ``evidence run`` (docs/plan-files.md).
"""

from __future__ import annotations

import sys
from pathlib import Path

from commands.auditor.audit import audit
from commands.plane import (
    Plane,
    apply_plan,
    attach,
    call_tool,
    create_plan,
    enter_execute,
    record_fix,
    record_strategy,
    register_tool,
    register_validation,
    validate_plan,
)
from ledger.verify import verify_store

# The tool: writes its `text` parameter to greeting.txt in its working directory (the
# plan's sandbox) and reports how many characters it wrote.
WRITE_GREETING = """\
import json, sys
text = sys.argv[1]
with open("greeting.txt", "w") as f:
    f.write(text + "\\n")
print(json.dumps({"written": len(text)}))
"""

# The validation: a program that prints the structured return {passed, message?}.
CHECK_GREETING = """\
import json
text = open("greeting.txt").read().strip()
ok = text == "hello"
message = "greeting is right" if ok else f"{text!r} is misspelled"
print(json.dumps({"passed": ok, "message": message}))
"""


def main() -> None:
    with Plane.open() as plane:  # EVIDENCE_DB, else sqlite:///evidence.db
        plan_id = f"quickstart-{plane.store.head().size + 1}"
        programs = Path.cwd() / "quickstart-programs"  # the same for every run
        programs.mkdir(exist_ok=True)
        (programs / "write_greeting.py").write_text(WRITE_GREETING)
        (programs / "check_greeting.py").write_text(CHECK_GREETING)
        project = Path.cwd() / plan_id  # a fresh project for each run
        project.mkdir()
        (project / "greeting.txt").write_text("helo\n")

        # 1. The registry (registering an unchanged tool again appends nothing).
        register_tool(
            plane,
            {
                "name": "write-greeting",
                "command": [sys.executable, str(programs / "write_greeting.py"), "{text}"],
                "input_schema": {
                    "type": "object",
                    "properties": {"text": {"type": "string"}},
                    "required": ["text"],
                },
                "output_schema": {
                    "type": "object",
                    "properties": {"written": {"type": "integer"}},
                    "required": ["written"],
                },
                "writes": True,
            },
        )
        register_validation(
            plane,
            {
                "name": "greeting-spelled-right",
                "mode": "required",
                "command": [sys.executable, str(programs / "check_greeting.py")],
            },
        )
        # 2. Attached directly to the project directory.
        attach(plane, "greeting-spelled-right", resource=str(project))

        # 3. Strategize -> Execute: the binding set is pinned, the sandbox made.
        create_plan(plane, plan_id, project="quickstart", resources=[str(project)])
        record_strategy(plane, plan_id, "spell the greeting right")
        enter_execute(plane, plan_id)

        # 4. An invented parameter: the input gate fails and nothing runs.
        bad = call_tool(plane, plan_id, "write-greeting", {"text": "hello", "force": True})
        for d in bad.input_gate.check.deviations:
            print(f"input gate: {d.kind} at {d.pointer!r}; the call was not made")

        # 5. The validation fails; the agent fixes the work in the sandbox.
        first = validate_plan(plane, plan_id)
        print(f"validation: {first.outcome} ({first.reason})")
        fixed = call_tool(plane, plan_id, "write-greeting", {"text": "hello"})
        print(f"tool call: {'passed both gates' if fixed.ok else 'failed a gate'}")
        record_fix(plane, plan_id, "wrote the greeting with write-greeting")

        # 6. Re-validation passes and mints the token.
        second = validate_plan(plane, plan_id)
        print(f"validation: {second.outcome}; token minted: {second.token is not None}")
        assert second.token is not None

        # 7. Apply: the real file changes only now.
        apply_plan(plane, plan_id, second.token)
        greeting = (project / "greeting.txt").read_text()
        print(f"applied: the real greeting.txt now says {greeting!r}")

        # 8. The log itself: the plan's events, then verify and audit.
        for event in plane.store.read_stream(f"plan:{plan_id}"):
            print(f"{event.position:>5}  {event.type}")
        report = verify_store(plane.store)
        print(f"verify: {'ok' if report.ok else 'FAILED'}, tree head {report.size}:{report.root}")
        print(f"audit: {'ok' if audit(plane.store).ok else 'FAILED'}")
        print(f"ledger: {plane.store.url}; plan {plan_id}")


if __name__ == "__main__":
    main()
