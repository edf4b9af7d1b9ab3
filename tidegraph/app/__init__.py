"""The application layer (docs/architecture.md "Architecture": layers): the ``tidegraph`` command,
the demo
and the local Kafka/Neo4j services. Everything below it is importable without it."""
