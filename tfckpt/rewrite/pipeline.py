"""The streaming pipeline of a shard task: read ahead, cast, write behind.

Three stages overlap: a thread reads (and checks the source's CRC) ahead of the
consumer, the consumer casts, another thread writes (and computes the output's
CRC) behind it. numpy, crc32c and file I/O release the GIL, so both cores stay
busy. Chunk buffers come from rings sized from the queue depths below, so the
pipeline allocates no fresh pages per chunk; the memory budget covers them all.

Also here: the set of shard tasks whose run has failed, which the tasks of this
process poll to stop early.
"""

from __future__ import annotations

import queue
import sys
import threading
from collections.abc import Iterator

import numpy as np

PREFETCH_DEPTH = 1  # chunks read and queued ahead of the consumer
WRITE_BEHIND_DEPTH = 1  # chunks queued for the writing thread


def chunks_in_flight(*, read: bool, write: bool) -> int:
    """How many chunks of one stream are alive at once, so how many buffers a ring needs.

    The consumer holds one. With ``read``, the chunk comes through the read-ahead:
    one more is being read and ``PREFETCH_DEPTH`` wait for the consumer. With
    ``write``, the consumer hands it to the write-behind: ``WRITE_BEHIND_DEPTH``
    wait there and one is being written. A buffer is reused only after every
    stage is done with it.
    """
    n = 1
    if read:
        n += 1 + PREFETCH_DEPTH
    if write:
        n += WRITE_BEHIND_DEPTH + 1
    return n


# Read chunks written as they are (no cast) live through every stage; cast results
# start at the consumer.
READ_RING = chunks_in_flight(read=True, write=True)
CAST_RING = chunks_in_flight(read=False, write=True)


def read_ring() -> BufferRing:
    """The ring that a task's reads go into: each read buffer passes every stage."""
    return BufferRing(READ_RING)


def cast_ring() -> BufferRing:
    """The ring that a task's cast results go into: they start at the consumer."""
    return BufferRing(CAST_RING)


class BufferRing:
    """At most ``count`` byte buffers, each handed out again once no stage holds it.

    Calling the ring returns ``nbytes`` of a buffer (a uint8 array) of which no view is
    alive: a free one that is large enough, else a free one grown, else a new one while
    fewer than ``count`` exist. So buffers are made as the stages fill, never more than
    ``count`` (a cast frees its read buffer at the consumer, and its rings stay
    smaller than a copy's). A ring too small for the stages it feeds refuses when all
    its buffers are in use (RuntimeError): it fails the run, never corrupts output.

    >>> ring = BufferRing(READ_RING)
    >>> buf = ring(1 << 20)
    """

    def __init__(self, count: int):
        if count < 1:
            raise ValueError("a ring needs at least one buffer")
        self.count = count
        self._buffers: list[np.ndarray] = []

    def __call__(self, nbytes: int) -> np.ndarray:
        bufs = self._buffers
        # Views keep their buffer referenced: the list and the call's argument are the
        # only references of a buffer that no stage holds.
        free = [i for i in range(len(bufs)) if sys.getrefcount(bufs[i]) <= 2]
        fits = [i for i in free if len(bufs[i]) >= nbytes]
        if fits:
            i = fits[0]
        elif free or len(bufs) < self.count:
            i = free[0] if free else len(bufs)
            bufs[i : i + 1] = [np.empty(nbytes, dtype=np.uint8)]
        else:
            raise RuntimeError(
                f"a buffer of a ring of {self.count} is still in use when handed out "
                "again: the ring is smaller than the pipeline's stages need"
            )
        return bufs[i][:nbytes]


# How often a pipeline thread looks again at a hand-over (whether the other side is
# still there), so no hand-over waits without a timeout.
_POLL = 0.05


class Handover:
    """A bounded hand-over of items between two threads that a Ctrl-C cannot corrupt.

    ``queue.Queue`` guards its state with locks taken and released in Python code: a
    KeyboardInterrupt raised in the main thread between the two leaves a lock released
    under the thread on the other side, which then fails with "release unlocked lock".
    ``queue.SimpleQueue`` is written in C, each call whole or not at all; the bound is a
    second one holding the free places. An interrupt between the two calls loses a place,
    which matters to nobody: the pipeline is being taken down.
    """

    def __init__(self, depth: int):
        self._items: queue.SimpleQueue = queue.SimpleQueue()
        self._free: queue.SimpleQueue = queue.SimpleQueue()
        for _ in range(depth):
            self._free.put(None)

    def put(self, item, timeout: float) -> bool:
        """Queue ``item``, waiting at most ``timeout`` for a free place; False if none came."""
        try:
            self._free.get(timeout=timeout)
        except queue.Empty:
            return False
        self._items.put(item)
        return True

    def get(self, timeout: float):
        """The next item, waiting at most ``timeout`` (then ``queue.Empty``)."""
        item = self._items.get(timeout=timeout)
        self._free.put(None)
        return item


class WriteBehind:
    """Hands items to ``sink.write`` in a thread, ``WRITE_BEHIND_DEPTH`` items behind.

    One thread serves the whole block, however many items pass. Leaving the
    block with an exception drops what is still queued: only the write under way
    is waited for.

    >>> with stream, WriteBehind(stream) as writer:
    ...     for chunk in chunks:
    ...         writer.write(chunk)
    """

    def __init__(self, sink):
        self._sink = sink
        self._items = Handover(WRITE_BEHIND_DEPTH)
        self._error: BaseException | None = None
        self._cancelled = False
        # Set once no more items come. The end is also queued, to wake the thread at
        # once; but a Ctrl-C may have cost the hand-over its free place, and then the
        # thread finds the flag at its next look.
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        try:
            self._thread.start()
        except BaseException:  # a Ctrl-C before ``with`` holds the writer: no __exit__
            self._closed.set()
            raise

    def _run(self) -> None:
        while True:
            # Looked at before the hand-over: once closed, an empty hand-over stays empty.
            closed = self._closed.is_set()
            try:
                item = self._items.get(timeout=_POLL)
            except queue.Empty:
                if closed:
                    return
                continue
            if item is _END:
                return
            if self._error is None and not self._cancelled:
                try:
                    self._sink.write(item)
                except BaseException as e:  # raised in the producer's thread
                    self._error = e
            del item  # the buffer is free once written

    def write(self, data) -> None:
        if self._error is not None:
            raise self._error
        while not self._items.put(data, timeout=_POLL):
            if not self._thread.is_alive():
                return

    def __enter__(self) -> WriteBehind:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            self._cancelled = True
        self._closed.set()
        self._items.put(_END, timeout=_POLL)
        self._thread.join()
        if self._error is not None and exc_type is None:
            raise self._error


_END = object()


def prefetch(iterator: Iterator):
    """Run ``iterator`` ``PREFETCH_DEPTH`` items ahead in a background thread.

    The thread ends with the consumer: once it stops taking items (an exception,
    Ctrl-C, the generator closed), no hand-over blocks for good, so the clean-up's
    join returns after at most the item being read.

    >>> for chunk in prefetch(ckpt.iter_chunks("emb", 1 << 20)):
    ...     use(chunk)
    """
    items = Handover(PREFETCH_DEPTH)
    stop = threading.Event()
    done = object()

    def offer(item) -> bool:
        while not stop.is_set():
            if items.put(item, timeout=_POLL):
                return True
        return False

    def produce():
        try:
            for item in iterator:
                if not offer((item, None)):
                    return
            offer((done, None))
        except BaseException as e:  # handed to the consumer, raised there
            offer((done, e))

    worker = threading.Thread(target=produce, daemon=True)
    try:
        worker.start()
        while True:
            try:
                item, error = items.get(timeout=_POLL)
            except queue.Empty:
                continue
            if item is done:
                if error is not None:
                    raise error
                return
            yield item
    finally:
        stop.set()
        if worker.ident is not None:  # else a Ctrl-C came before it ran: it ends on ``stop``
            worker.join()


# Shard tasks (by path) whose run has failed: tasks running in this process's threads
# stop at their next chunk. Tasks in other processes do not see it and run to the end.
_CANCELLED: set[str] = set()


def cancel(paths) -> None:
    """Tell the tasks writing ``paths`` in this process to stop at their next chunk."""
    _CANCELLED.update(paths)


def uncancel(paths) -> None:
    """Forget ``paths`` once their tasks have stopped."""
    _CANCELLED.difference_update(paths)


def cancelled(path: str) -> bool:
    """Whether the run of the task writing ``path`` has failed elsewhere."""
    return path in _CANCELLED
