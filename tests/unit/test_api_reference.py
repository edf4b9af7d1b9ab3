"""The HTTP API reference (docs/serving.md) is the served one (issue 31): it is written from
the app's OpenAPI schema (``python -m tidegraph.app.serving.reference --write``), and this test
fails when the page's copy differs from what the schema says now."""

from __future__ import annotations

from tidegraph.app.serving.reference import END, PAGE, START, markdown, openapi


def test_the_documented_reference_is_the_one_the_schema_writes():
    page = PAGE.read_text()
    written = page[page.index(START) : page.index(END) + len(END) + 1]
    assert written == markdown(openapi()), (
        "docs/serving.md's HTTP reference differs from the server's schema: run "
        "python -m tidegraph.app.serving.reference --write"
    )


def test_every_route_and_field_is_in_the_reference():
    schema = openapi()
    reference = markdown(schema)
    for path, methods in schema["paths"].items():
        for method, operation in methods.items():
            assert f"### `{method.upper()} {path}`" in reference
            for parameter in operation.get("parameters", []):
                assert f"`{parameter['name']}`" in reference
    for name in ("group_ids", "episodes", "max_chars", "wait_for", "episode_id", "problems"):
        assert f"`{name}`" in reference
