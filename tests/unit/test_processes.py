"""A worker started by a test or benchmark dies with the process that started it."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

PARENT = textwrap.dedent(
    """
    import os, subprocess, sys
    from tests.support.processes import terminate_with_parent
    child = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(600)"],
        start_new_session=True,
        preexec_fn=terminate_with_parent if sys.argv[1] == "guarded" else None,
    )
    print(child.pid, flush=True)
    os._exit(0)  # the parent dies without stopping its child
    """
)


def run_parent(mode: str) -> tuple[int, bool]:
    """The child's pid, and whether it was gone once the parent had exited. The child holds
    the parent's stdout: reading it to the end returns only when the child has exited too."""
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT, mode], stdout=subprocess.PIPE, text=True
    )
    try:
        out, _ = parent.communicate(timeout=20)
        return int(out.split()[0]), True
    except subprocess.TimeoutExpired:
        parent.kill()
        return -1, False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux")
def test_child_is_terminated_when_its_parent_dies() -> None:
    pid, gone = run_parent("guarded")
    assert gone, "the child outlived its parent"
    assert pid > 0
