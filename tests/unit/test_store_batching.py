"""Group commit (tidegraph.stores.neo4j.batching) and the embedding cache
(tidegraph.embed.cache)."""

from __future__ import annotations

import asyncio

import pytest

from tidegraph.embed.cache import CachingEmbedder
from tidegraph.embed.hashing import HashingEmbedder
from tidegraph.stores.neo4j.batching import GroupCommit


class Recorder:
    """A commit that records its batches; items named "bad" make a batch fail."""

    def __init__(self) -> None:
        self.batches: list[list[str]] = []

    async def commit(self, items: list[str]) -> list[str]:
        await asyncio.sleep(0.01)
        self.batches.append(list(items))
        if "bad" in items:
            raise ValueError("bad item")
        return [item.upper() for item in items]


async def test_concurrent_items_share_a_commit_in_order() -> None:
    recorder = Recorder()
    batcher: GroupCommit[str, str] = GroupCommit(recorder.commit, max_items=3)
    results = await asyncio.gather(*(batcher.submit(x) for x in "abcde"))
    assert results == list("ABCDE")
    assert recorder.batches == [["a", "b", "c"], ["d", "e"]]


async def test_a_failing_item_fails_alone() -> None:
    recorder = Recorder()
    batcher: GroupCommit[str, str] = GroupCommit(recorder.commit, max_items=8)
    results = await asyncio.gather(
        *(batcher.submit(x) for x in ["a", "b", "bad", "c"]), return_exceptions=True
    )
    assert results[:2] == ["A", "B"] and results[3] == "C"
    assert isinstance(results[2], ValueError)
    assert recorder.batches == [["a", "b", "bad", "c"], ["a"], ["b"], ["bad"], ["c"]]


async def test_transactions_overlap_across_keys_but_never_within_one() -> None:
    """Two transactions at once, never two holding items of one key, and each key's items
    committed in the order they were submitted."""
    running: list[list[str]] = []
    overlapped: list[tuple[str, ...]] = []
    committed: list[str] = []
    release = asyncio.Event()

    async def commit(items: list[str]) -> list[str]:
        running.append(items)
        if len(running) > 1:
            overlapped.append(tuple(sorted(i for batch in running for i in batch)))
            release.set()
        await release.wait()
        running.remove(items)
        committed.extend(items)
        return items

    batcher: GroupCommit[str, str] = GroupCommit(
        commit, max_items=8, key=lambda item: item[0], max_in_flight=2
    )
    first = asyncio.ensure_future(batcher.submit("a1"))
    await asyncio.sleep(0)  # a1's transaction is running
    rest = [batcher.submit(x) for x in ["a2", "b1", "a3", "b2"]]
    results = await asyncio.gather(first, *rest)
    assert results == ["a1", "a2", "b1", "a3", "b2"]
    # b's items ran beside a1; a2 and a3 waited for a1, then shared a transaction
    assert overlapped[0] == ("a1", "b1", "b2")
    assert [i for i in committed if i[0] == "a"] == ["a1", "a2", "a3"]
    assert [i for i in committed if i[0] == "b"] == ["b1", "b2"]


def counted_embedder() -> tuple[HashingEmbedder, list[list[str]]]:
    """A hashing embedder that records the texts of each call it is given."""
    calls: list[list[str]] = []
    inner = HashingEmbedder(dim=64)
    original = inner.embed

    async def counted(texts: list[str]) -> list[list[float]]:
        calls.append(list(texts))
        return await original(texts)

    inner.embed = counted  # type: ignore[method-assign]
    return inner, calls


async def test_caching_embedder_embeds_each_text_once() -> None:
    inner, calls = counted_embedder()
    original = HashingEmbedder(dim=64).embed
    cached = CachingEmbedder(inner, max_texts=2)
    first = await cached.embed(["x", "y", "x"])
    assert first == await original(["x", "y", "x"])
    assert await cached.embed(["y"]) == first[1:2]
    await cached.embed(["z"])  # evicts x (least recently used)
    await cached.embed(["x"])
    assert calls == [["x", "y"], ["z"], ["x"]]
    with pytest.raises(ValueError):
        CachingEmbedder(inner, max_texts=0)


async def test_caching_embedder_embeds_each_question_once_apart_from_stored_texts() -> None:
    inner, calls = counted_embedder()
    cached = CachingEmbedder(inner, max_texts=2)
    [stored] = await cached.embed(["which plan?"])
    asked = await cached.embed_query("which plan?")
    assert asked == stored  # the hashing embedder embeds both alike
    assert await cached.embed_query("which plan?") == asked
    assert calls == [["which plan?"], ["which plan?"]]  # once as stored, once as asked


async def test_warming_the_cache_embeds_the_missing_texts_in_one_call() -> None:
    inner, calls = counted_embedder()
    original = HashingEmbedder(dim=64).embed
    cached = CachingEmbedder(inner)
    await cached.embed(["a"])
    await cached.warm(["a", "b", "c", "b"])
    await cached.warm(["c"])
    assert await cached.embed(["b", "c", "a"]) == await original(["b", "c", "a"])
    assert calls == [["a"], ["b", "c"]]
