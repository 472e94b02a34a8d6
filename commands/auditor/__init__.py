"""The auditor's tools: re-derive every verdict from recorded inputs (``audit``,
``replay``), a plan's history, the run report, and the analytics export. They read the
log and call the plane's pure checks; they append nothing (``tail --consumer`` stores
the consumer's position, which is bookkeeping, not the log)."""
