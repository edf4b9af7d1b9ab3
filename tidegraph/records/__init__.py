"""The records every layer shares (docs/architecture.md "Architecture": layers). Plain data and the
rules that
belong to it, no I/O, importing nothing of tidegraph's but each other:

- ``ids``: deterministic uuids, normal forms of names, relation types and labels;
- ``times``: aware-UTC time values;
- ``errors``: failures that belong to a record, each with its dead-letter reason;
- ``episode``: the input envelope and its validation (``parse_episode``);
- ``stages``: what flows between the stages (extraction, resolution, stamping, write);
- ``graph``: the graph's records as the store reads and writes them;
- ``asof``: which facts are valid at T as believed at K.
"""
