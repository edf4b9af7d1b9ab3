"""A separate virtual environment with graphiti-core 0.31.2 for the side-by-side benchmark.

    python -m benchmarks.graphiti_env            # create or check; prints the interpreter path
    python -m benchmarks.graphiti_env --profiler # also install pyinstrument and py-spy

graphiti-core 0.31.2 declares ``certifi>=2026.10.19``, newer than any certifi on PyPI, so pip
cannot resolve it. The environment is built in three steps: download the graphiti-core wheel
alone, read its ``Requires-Dist`` (extras left out) and install those requirements with the
certifi pin relaxed, plus ``httpx``, which graphiti imports without declaring it, and the neo4j
driver's Rust codec (``neo4j-rust-ext``, which tidegraph installs too); then install
graphiti-core itself with ``--no-deps``. A marker file records what was installed, so a second
call returns at once. The folder is ``.bench-venvs/graphiti/`` in the repository (gitignored),
or ``$TIDEGRAPH_GRAPHITI_VENV``. Graphiti's telemetry is switched off
(``GRAPHITI_TELEMETRY_ENABLED=false``) in every process this module starts.
"""

from __future__ import annotations

import argparse
import fcntl
import os
import re
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import orjson

REPO = Path(__file__).resolve().parents[1]
GRAPHITI_VERSION = "0.31.2"
EXTRA_REQUIREMENTS = (
    "httpx>=0.27",  # imported by graphiti_core, not declared
    # The neo4j driver's Rust codec, as tidegraph installs it: both sides of the comparison
    # encode and decode Bolt with the same code (it is a drop-in any Graphiti user can add).
    "neo4j-rust-ext>=6.4,<7",
)
RELAXED = {"certifi": "certifi"}  # declared >=2026.10.19, newer than the registry holds
PROFILERS = ("pyinstrument>=5,<6", "py-spy>=0.4,<0.5")
MARKER = ".tidegraph-graphiti.json"


def venv_dir() -> Path:
    return Path(os.environ.get("TIDEGRAPH_GRAPHITI_VENV") or REPO / ".bench-venvs" / "graphiti")


def venv_python(root: Path | None = None) -> Path:
    return (root or venv_dir()) / "bin" / "python"


def graphiti_env() -> dict[str, str]:
    """The environment for processes of the Graphiti venv (telemetry off)."""
    env = dict(os.environ)
    env["GRAPHITI_TELEMETRY_ENABLED"] = "false"
    env["POSTHOG_DISABLED"] = "1"
    env.pop("PYTHONPATH", None)
    return env


def _run(cmd: list[str | Path], quiet: bool) -> None:
    out = subprocess.DEVNULL if quiet else None
    result = subprocess.run([str(c) for c in cmd], env=graphiti_env(), stdout=out, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"command failed ({result.returncode}): {' '.join(map(str, cmd))}")


def parse_requires(metadata: str) -> list[str]:
    """The wheel's unconditional ``Requires-Dist`` lines (no extras), pins relaxed."""
    requirements = []
    for line in metadata.splitlines():
        if not line.startswith("Requires-Dist:"):
            continue
        spec = line.split(":", 1)[1].strip()
        if ";" in spec and "extra ==" in spec.split(";", 1)[1]:
            continue
        name = re.split(r"[<>=!~;\[ ]", spec, maxsplit=1)[0].lower()
        requirements.append(RELAXED.get(name, spec))
    return requirements


def _wheel_requirements(python: Path, quiet: bool) -> list[str]:
    with tempfile.TemporaryDirectory(prefix="graphiti-wheel-") as tmp:
        _run(
            [python, "-m", "pip", "download", "--no-deps", "--quiet", "-d", tmp,
             f"graphiti-core=={GRAPHITI_VERSION}"],
            quiet,
        )  # fmt: skip
        wheel = next(Path(tmp).glob("graphiti_core-*.whl"))
        with zipfile.ZipFile(wheel) as archive:
            name = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
            metadata = archive.read(name).decode()
    return parse_requires(metadata)


def _ready(root: Path, want_profiler: bool) -> bool:
    marker = root / MARKER
    if not (marker.exists() and venv_python(root).exists()):
        return False
    state = orjson.loads(marker.read_bytes())
    if not _installed(state):
        return False
    return state.get("profiler", False) or not want_profiler


def _installed(state: dict[str, object]) -> bool:
    return state.get("graphiti_core") == GRAPHITI_VERSION and state.get("extras") == list(
        EXTRA_REQUIREMENTS
    )


@contextmanager
def _locked(root: Path) -> Iterator[None]:
    root.parent.mkdir(parents=True, exist_ok=True)
    with open(root.parent / f".{root.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def ensure(*, profiler: bool = False, quiet: bool = True) -> Path:
    """Create (or reuse) the Graphiti venv; returns its interpreter."""
    root = venv_dir()
    if _ready(root, profiler):
        return venv_python(root)
    with _locked(root):
        if _ready(root, profiler):
            return venv_python(root)
        python = venv_python(root)
        state = orjson.loads((root / MARKER).read_bytes()) if (root / MARKER).exists() else {}
        if not _installed(state):
            if not python.exists():
                _run([sys.executable, "-m", "venv", root], quiet)
            requirements = [*_wheel_requirements(python, quiet), *EXTRA_REQUIREMENTS]
            _run([python, "-m", "pip", "install", "--quiet", *requirements], quiet)
            _run(
                [python, "-m", "pip", "install", "--quiet", "--no-deps",
                 f"graphiti-core=={GRAPHITI_VERSION}"],
                quiet,
            )  # fmt: skip
            _run([python, "-c", "import graphiti_core.graphiti, httpx"], quiet)
            state = {
                "graphiti_core": GRAPHITI_VERSION,
                "extras": list(EXTRA_REQUIREMENTS),
                "requirements": requirements,
            }
        if profiler and not state.get("profiler"):
            _run([python, "-m", "pip", "install", "--quiet", *PROFILERS], quiet)
            state["profiler"] = True
        (root / MARKER).write_bytes(orjson.dumps(state, option=orjson.OPT_INDENT_2))
    return python


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--profiler", action="store_true", help="also install pyinstrument and py-spy"
    )
    parser.add_argument("--verbose", action="store_true", help="show pip's output")
    args = parser.parse_args(argv)
    print(ensure(profiler=args.profiler, quiet=not args.verbose))


if __name__ == "__main__":
    main()
