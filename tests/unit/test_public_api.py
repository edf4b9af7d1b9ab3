"""The public API is one import (issue 32 item 5): ``from tidegraph import Memory`` and the rest,
with ``import tidegraph`` loading nothing else; a read-only memory loads no LLM client, no
mapping and no pipeline."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import orjson


def in_fresh_python(code: str, *args: str) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return dict(orjson.loads(done.stdout.strip().splitlines()[-1]))


def test_import_tidegraph_loads_nothing_else_and_names_the_public_api():
    found = in_fresh_python(
        "import sys, orjson, tidegraph\n"
        "loaded = sorted(m for m in sys.modules if m.startswith('tidegraph.'))\n"
        "from tidegraph import Memory, SearchRequest, Episode, AddResult\n"
        "print(orjson.dumps({'loaded': loaded, 'all': tidegraph.__all__,\n"
        "                   'memory': Memory.__module__}).decode())"
    )
    assert found["loaded"] == []
    assert {"Memory", "SearchRequest", "SearchResults", "AddResult"} <= set(found["all"])
    # the stores are not public: Memory reads and writes them
    assert not {"GraphStore", "open_store"} & set(found["all"])
    assert found["memory"] == "tidegraph.app.memory"


def test_a_read_only_memory_opens_no_llm_no_mapping_and_no_pipeline(tmp_path: Path):
    opening = f"""
import asyncio, sys, orjson
from tidegraph import Memory, NoStore, SearchRequest, Settings

settings = Settings(data_dir={str(tmp_path)!r}, embedder="hashing",
                    llm_base_url="http://127.0.0.1:9/v1")

async def main():
    if sys.argv[-1] == "write":
        memory = await Memory.open(settings.model_copy(update={{"llm_base_url": None}}))
        await memory.add_episode(group_id="g", content="Dana called about the renewal")
    else:
        memory = await Memory.open(settings, read_only=True)
        found = await memory.search(SearchRequest(query="renewal", group_ids=["g"]))
        assert found.episodes, found
        await memory.facts("g")
    await memory.close()

try:
    asyncio.run(main())
    result = "opened"
except NoStore:
    result = "no store"
loaded = [m for m in sys.modules if m.startswith(("tidegraph.llm", "tidegraph.processors.mapping",
                                                   "tidegraph.pipelines", "openai"))]
print(orjson.dumps({{"result": result, "loaded": loaded}}).decode())
"""
    before = in_fresh_python(opening, "read")
    assert before == {"result": "no store", "loaded": []}
    assert list(tmp_path.iterdir()) == []  # a read-only open creates nothing
    assert in_fresh_python(opening, "write")["loaded"]  # the write side loads them...
    assert in_fresh_python(opening, "read") == {"result": "opened", "loaded": []}  # ...not this


def test_the_makefile_install_hides_setuptools_editable_note():
    """The note setuptools prints on every editable install (a box before the demo) is
    filtered by the install's PYTHONWARNINGS, which really silences that warning."""
    makefile = (Path(__file__).resolve().parents[2] / "Makefile").read_text()
    line = next(x for x in makefile.splitlines() if "pip install --quiet -e" in x)
    value = line.split('PYTHONWARNINGS="')[1].split('"')[0]
    note = "Editable installation.\\n!!\\n\\n***\\nPlease be careful with folders\\n***\\n!!"
    shown = subprocess.run(
        [sys.executable, "-c", f"import warnings; warnings.warn({note!r})"],
        capture_output=True, text=True, env={"PYTHONWARNINGS": value}, check=True,
    )  # fmt: skip
    assert shown.stderr == ""
    unfiltered = subprocess.run(
        [sys.executable, "-c", f"import warnings; warnings.warn({note!r})"],
        capture_output=True, text=True, env={}, check=True,
    )  # fmt: skip
    assert "Editable installation" in unfiltered.stderr
