"""The application layer (README "Architecture": layers): the ``tidegraph`` command, the demo
and the local Kafka/Neo4j services. Everything below it is importable without it."""
