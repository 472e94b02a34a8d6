"""The plane and its tools, in rooms with one-way doors (docs/architecture.md):

``cli`` (click verbs) -> ``auditor`` (audit, replay, report, history, analytics) ->
``plane`` (the handlers and their Python API) -> ``runner`` (subprocesses, sandbox) ->
``schemas`` (the JSON Schema engine of the gates); ``errors`` and ``names`` are shared
by all of them. A room imports only the rooms after it.
"""
