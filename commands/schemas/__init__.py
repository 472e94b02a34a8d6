"""JSON Schema, the gates' engine: schemas normalised closed and prepared
(``prepare``), and values checked against them into deviations (``checker``)."""
