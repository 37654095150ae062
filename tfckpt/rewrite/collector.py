"""Python's cycle collector, paused while tfckpt builds records by the hundred thousand.

A plan of 200 000 tensors, its tasks, its index entries and a dump's records are
long-lived objects without reference cycles. The collector cannot know that: each of
its full passes scans every object made so far, and they come more often as objects
accumulate, so planning such a conversion spent about 40% of its time in the
collector. ``plan`` and ``execute`` pause it for their duration, as does a command of
the command line; it resumes as it was afterwards. Arrays and buffers never depend
on it (reference counting frees them), and a cycle made meanwhile is collected once
it runs again.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


@contextlib.contextmanager
def paused() -> Iterator[None]:
    """Pause the cycle collector (process-wide) inside the block; usable as a decorator."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
