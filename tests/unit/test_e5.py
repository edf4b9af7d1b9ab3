"""The e5-small-v2 embedder (the model fetched by ``make install``), its download's checks,
and the embedded store's refusal of vectors made by another model."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tidegraph.embed.cache import CachingEmbedder
from tidegraph.embed.e5 import (
    MODEL_FILE,
    PASSAGE_PREFIX,
    QUERY_PREFIX,
    E5Embedder,
    default_model_dir,
    fetch,
)
from tidegraph.embed.hashing import HashingEmbedder
from tidegraph.embed.minilm import ModelFilesError
from tidegraph.stores.errors import StoreSchemaError
from tidegraph.stores.sqlite.store import SqliteStore

TURN = "Caroline (Monday 8 May 2023): I went to an LGBTQ support group yesterday."
QUESTION = "When did Caroline go to the LGBTQ support group?"


@pytest.fixture(scope="module")
def e5() -> E5Embedder:
    if not (default_model_dir() / MODEL_FILE).is_file():
        pytest.fail("the e5-small-v2 model is not installed: run make install")
    return E5Embedder(threads=1)


async def test_stored_texts_and_questions_are_embedded_with_their_prefixes(e5: E5Embedder) -> None:
    [stored] = await e5.embed([TURN])
    asked = await e5.embed_query(QUESTION)
    assert stored == pytest.approx(e5.encode_sync([PASSAGE_PREFIX + TURN])[0])
    assert asked == pytest.approx(e5.encode_sync([QUERY_PREFIX + QUESTION])[0])
    assert asked != pytest.approx((await e5.embed([QUESTION]))[0])
    assert np.linalg.norm(asked) == pytest.approx(1.0)
    # the cache in front of an embedder hands questions to the model's query method
    assert await CachingEmbedder(e5).embed_query(QUESTION) == pytest.approx(asked)


async def test_a_question_is_nearer_its_answer_than_an_unrelated_turn(e5: E5Embedder) -> None:
    turn, other = await e5.embed([TURN, "Melanie (Friday 12 May 2023): I painted a sunrise."])
    asked = await e5.embed_query(QUESTION)
    assert float(np.dot(asked, turn)) > float(np.dot(asked, other))


def test_a_download_without_the_pinned_sha256_is_refused(tmp_path: Path) -> None:
    bogus = tmp_path / "bogus.jar"
    bogus.write_bytes(b"not the model")
    with pytest.raises(ModelFilesError, match="pinned sha256"):
        fetch(tmp_path / "model", url=bogus.as_uri())
    assert not (tmp_path / "model" / MODEL_FILE).exists()


def test_missing_model_files_say_how_to_fetch_them(tmp_path: Path) -> None:
    with pytest.raises(ModelFilesError, match="make install"):
        E5Embedder(model_dir=tmp_path).load()


async def test_the_embedded_store_refuses_another_models_vectors(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "graph")
    await store.setup(384, "all-MiniLM-L6-v2-int8")  # a new store records it
    await store.setup(384, "all-MiniLM-L6-v2-int8")
    with pytest.raises(StoreSchemaError, match="TIDEGRAPH_EMBEDDER") as refused:
        await store.setup(384, "e5-small-v2-int8")
    assert "all-MiniLM-L6-v2-int8" in str(refused.value)
    await store.close()
    reopened = SqliteStore(tmp_path / "graph")
    hashing = HashingEmbedder(dim=384)
    with pytest.raises(StoreSchemaError):
        await reopened.open_existing(hashing.dim, hashing.model_name)
    await reopened.close()


def test_the_cli_says_missing_model_files_and_a_refused_store_in_one_line(tmp_path: Path) -> None:
    from tidegraph.app.cli.errors import explain
    from tidegraph.settings import Settings

    settings = Settings(data_dir=tmp_path)
    with pytest.raises(ModelFilesError) as missing:
        E5Embedder(model_dir=tmp_path).load()
    assert explain(missing.value, settings) == str(missing.value)
    refused = StoreSchemaError(
        "the embedded store at x holds embeddings of a but the embedder is b"
    )
    assert explain(refused, settings).startswith("the store cannot be used as it is: ")
