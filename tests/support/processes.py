"""Child processes of tests and benchmarks that never outlive the process that started them.

Workers are started in a session of their own (so that a Ctrl-C meant for the test runner does
not reach them mid-test), which also means nothing stops them when the runner itself is killed
(a CI timeout, a ``timeout`` wrapper): they would keep running and reconnecting to brokers that
are gone. On Linux, ``PR_SET_PDEATHSIG`` has the kernel send them SIGTERM when their parent
exits, however it exits.
"""

from __future__ import annotations

import ctypes
import signal
import sys

_PR_SET_PDEATHSIG = 1


def terminate_with_parent() -> None:
    """A ``preexec_fn``: the child gets SIGTERM when its parent dies (Linux; elsewhere a no-op)."""
    if not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
