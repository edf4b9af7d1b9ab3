"""Topics: their names (``names``), the records on them and their orjson serde (``records``),
their creation with checks (``admin``), and the wiring table of the stage chain (``chain``): which
stage reads and writes which topic. docs/streaming.md "Streaming topology" has the table of topics.
"""
