"""Where the plane meets the operating system: subprocesses for tools and validations
(``process``), the plan's sandbox (``sandbox``), and the structured result a validation
returns (``results``). Knows nothing of plans' state or of the log's handlers."""
