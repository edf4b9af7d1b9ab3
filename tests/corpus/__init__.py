"""Test corpora: inputs that the end-to-end tests send through the worker and ``ingest``."""
