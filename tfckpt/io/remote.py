"""Concurrent transfers of one object: parallel range reads, and S3 multipart uploads with
several parts in flight.

Reading or writing a checkpoint on an object store one request at a time leaves the
link idle for a round trip per request; this module keeps several requests of one
stream in flight, through the file system's own asynchronous client and its event
loop, bounded so that memory stays within the reads' and writes' own sizes:

- :class:`ConcurrentReader` (any asynchronous fsspec file system: s3fs, gcsfs, ...)
  splits each positioned read into ranges of at least :data:`MIN_PART` bytes, all
  requested at once (``max_concurrency`` of them at most, as the file system's own
  transfers): on S3 each streamed straight into its place in the caller's buffer,
  elsewhere fetched with fsspec's ``cat_ranges`` and copied there.
  The engine reads a chunk ahead of the cast in a thread of its own (see
  :mod:`tfckpt.rewrite.pipeline`), so the ranges of the next chunk are in flight while
  this one is cast; the bytes in flight are those of the one chunk being read, sized
  from the chunk budget. Each byte is fetched once, only those asked for.
- :class:`MultipartUpload` (s3fs) copies what is written into parts of
  :data:`PART_BYTES` and uploads each as it fills, :data:`PARTS_IN_FLIGHT` at most at
  once, while the writer goes on: a writer waits only when that many are under way.
  Each part is a file object to the client, which streams it to the socket in small
  pieces: handed over as bytes, a part would be copied whole on its way out (aiohttp
  slices it, joins it to the request's headers, and the transport keeps what the socket
  has not taken), three copies of every part in flight, more than the parts themselves.
  The object appears when the upload is completed at :meth:`~MultipartUpload.close`,
  or never: a failed or discarded upload is aborted, so nothing of it is stored, as
  with the single-stream writer before (the commit of :mod:`tfckpt.io.commit` is
  unchanged). An object smaller than one part is stored with one request.

Requests go through the client's own retries (:func:`tfckpt.io.storage.remote_options`);
what still fails leaves as a :class:`~tfckpt.errors.CheckpointError` naming the object,
as every remote call of :mod:`tfckpt.io.storage` does.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import io
from collections import deque
from typing import Any

from tfckpt.errors import CheckpointError, CheckpointWriteError

MIN_PART = 1 << 20  # the smallest range read on its own: smaller ones cost a request each
STREAM_PIECE = 1 << 18  # bytes of a response taken at a time, straight into their place
PART_BYTES = 5 << 20  # S3's smallest part (all parts but the last)
GROW_EVERY = 1000  # parts: S3 takes 10 000 at most, so parts grow (see part_bytes)
PARTS_IN_FLIGHT = 3  # parts uploading at once, at most (and never more than max_concurrency)


def concurrency(fs) -> int:
    """How many requests of one stream may be in flight: the file system's own
    ``max_concurrency`` (s3fs: 10 by default), else its ``batch_size``, else 4."""
    n = getattr(fs, "max_concurrency", None) or getattr(fs, "batch_size", None) or 4
    return max(1, int(n))


def concurrent_reads(fs) -> bool:
    """Whether ``fs`` takes several range reads at once (an asynchronous file system)."""
    return bool(getattr(fs, "async_impl", False)) and getattr(fs, "loop", None) is not None


def multipart_uploads(fs) -> bool:
    """Whether ``fs`` is an S3 client whose multipart calls this module can make."""
    return concurrent_reads(fs) and hasattr(fs, "_call_s3") and hasattr(fs, "split_path")


def part_bytes(done: int) -> int:
    """The size of the next part after ``done`` parts: :data:`PART_BYTES`, one more
    :data:`PART_BYTES` every :data:`GROW_EVERY` parts, so the 10 000 parts S3 allows hold
    268 GiB (memory grows with the object only past 5 GiB)."""
    return PART_BYTES * (1 + done // GROW_EVERY)


def split(offset: int, n: int, parts: int) -> list[tuple[int, int]]:
    """``[offset, offset + n)`` as at most ``parts`` ranges of at least :data:`MIN_PART`
    bytes (one range if ``n`` is smaller), consecutive and of near-equal sizes."""
    k = max(1, min(parts, n // MIN_PART))
    size = -(-n // k)
    return [(s, min(s + size, offset + n)) for s in range(offset, offset + n, size)]


class ConcurrentReader:
    """Positioned reads of one object, each as several range requests at once.

    ``store`` is the :class:`~tfckpt.io.storage.RemoteStorage` (for its error
    translation), ``size`` the object's size, looked up once.
    """

    def __init__(self, store, path: str, size: int):
        self.path = path
        self.size = size
        self._store = store
        self._key = store._strip(path)
        self._parts = concurrency(store.fs)

    def readinto(self, buf: memoryview, offset: int) -> int:
        n = min(len(buf), max(self.size - offset, 0))
        if n == 0:
            return 0
        ranges = split(offset, n, self._parts)
        what = f"reading bytes [{offset}, {offset + n})"
        fs = self._store.fs
        if multipart_uploads(fs):  # S3: each range streamed into its place in ``buf``
            from fsspec.asyn import sync

            view = memoryview(buf)[:n]
            self._store.call(what, self.path, sync, fs.loop, self._fetch, view, offset, ranges)
            return n
        if len(ranges) == 1:
            pieces = [
                self._store.call(
                    what, self.path, fs.cat_file, self._key, start=offset, end=offset + n
                )
            ]
        else:
            pieces = self._store.call(
                what,
                self.path,
                fs.cat_ranges,
                [self._key] * len(ranges),
                [s for s, _ in ranges],
                [e for _, e in ranges],
                batch_size=self._parts,
                on_error="raise",
            )
        for (start, end), data in zip(ranges, pieces):
            self._check_length(start, end, len(data))
            buf[start - offset : end - offset] = data
            del data
        return n

    def _check_length(self, start: int, end: int, got) -> None:
        if got != end - start:  # a server that ignores Range sends the whole object
            raise CheckpointError(
                f"reading bytes [{start}, {end}) returned {got} bytes instead of {end - start}",
                path=self.path,
            )

    async def _fetch(self, view: memoryview, offset: int, ranges: list[tuple[int, int]]) -> None:
        """Every range at once, each written into ``view`` as its bytes arrive (no copy of
        a whole range is held); all have ended when this returns, failed or not, so no
        request writes into ``view`` afterwards."""
        results = await asyncio.gather(
            *(self._fetch_range(view[s - offset : e - offset], s, e) for s, e in ranges),
            return_exceptions=True,
        )
        for r in results:
            if isinstance(r, BaseException):
                raise r

    async def _fetch_range(self, view: memoryview, start: int, end: int) -> None:
        fs = self._store.fs
        bucket, key, version = fs.split_path(self._key)
        resp = await fs._call_s3(
            "get_object",
            Bucket=bucket,
            Key=key,
            Range=f"bytes={start}-{end - 1}",
            **({"VersionId": version} if version else {}),
        )
        body = resp["Body"]
        try:
            self._check_length(start, end, resp.get("ContentLength"))
            got = 0
            while got < len(view):
                k = await body.readinto(view[got : got + STREAM_PIECE])
                if k == 0:
                    break
                got += k
            self._check_length(start, end, got)
        finally:
            body.close()

    def close(self) -> None:
        pass


class MultipartUpload:
    """A streaming upload of one S3 object, parts uploaded concurrently behind the writer.

    Writes are copied into a part (:func:`part_bytes`); a full part goes to the file
    system's event loop as an ``upload_part`` request while the next fills, with
    :data:`PARTS_IN_FLIGHT` at most under way (the writer waits for the oldest beyond
    that). Part buffers (``io.BytesIO``, which the client reads as a stream) are reused
    once their request is done, so memory stays at ``(PARTS_IN_FLIGHT + 1) *
    PART_BYTES`` (for objects up to 5 GiB), with no copy of a part. Errors are
    :class:`CheckpointWriteError`; :meth:`discard` (and any failure) aborts the upload,
    so the object never appears.
    """

    def __init__(self, store, path: str):
        self.path = path
        self._store = store
        self._fs = store.fs
        self._bucket, self._key, _ = self._fs.split_path(store._strip(path))
        self._in_flight_max = max(1, min(PARTS_IN_FLIGHT, concurrency(self._fs)))
        self._size = PART_BYTES  # of the part being filled
        self._buf = io.BytesIO()
        self._fill = 0
        self._free: list[tuple[int, io.BytesIO]] = []
        self._in_flight: deque[tuple[int, int, io.BytesIO, concurrent.futures.Future]] = deque()
        self._parts: list[dict[str, Any]] = []
        self._upload_id: str | None = None
        self._done = False

    # -- the requests

    def _call(self, what: str, method: str, **kwargs):
        """One request on the file system's loop, waited for here."""
        from fsspec.asyn import sync

        return self._store.call(
            what,
            self.path,
            sync,
            self._fs.loop,
            self._fs._call_s3,
            method,
            Bucket=self._bucket,
            Key=self._key,
            error=CheckpointWriteError,
            **kwargs,
        )

    def _submit(self) -> None:
        """Send the part being filled (its first ``_fill`` bytes)."""
        if self._upload_id is None:
            self._upload_id = self._call("starting the upload", "create_multipart_upload")[
                "UploadId"
            ]
        body = self._buf
        body.truncate(self._fill)  # a reused buffer may hold more (only the last part)
        body.seek(0)
        number = len(self._parts) + len(self._in_flight) + 1
        coro = self._fs._call_s3(
            "upload_part",
            Bucket=self._bucket,
            Key=self._key,
            PartNumber=number,
            UploadId=self._upload_id,
            Body=body,
        )
        future = asyncio.run_coroutine_threadsafe(coro, self._fs.loop)
        self._in_flight.append((number, self._size, body, future))

    def _wait_oldest(self) -> None:
        number, size, body, future = self._in_flight.popleft()
        out = self._store.call(
            f"writing part {number}", self.path, future.result, error=CheckpointWriteError
        )
        self._parts.append({"PartNumber": number, "ETag": out["ETag"]})
        body.seek(0)
        self._free.append((size, body))

    # -- the file interface of a writer

    def write(self, data) -> int:
        view = memoryview(data).cast("B")
        total = len(view)
        try:
            while len(view):
                k = min(len(view), self._size - self._fill)
                self._buf.write(view[:k])
                self._fill += k
                view = view[k:]
                if self._fill == self._size:
                    self._ship()
        except BaseException:
            self.discard()
            raise
        return total

    def _ship(self) -> None:
        """Send the full part; take a free buffer, waiting for the oldest part if none."""
        while len(self._in_flight) >= self._in_flight_max:
            self._wait_oldest()
        self._submit()
        size = part_bytes(len(self._parts) + len(self._in_flight))
        free = [b for n, b in self._free if n == size]
        self._free = [(size, b) for b in free[1:]]  # smaller ones, outgrown, are dropped
        self._buf = free[0] if free else io.BytesIO()
        self._size = size
        self._fill = 0

    def flush(self) -> None:
        pass  # parts go out as they fill; the object exists only once closed

    def close(self) -> None:
        """Store the object: one request if it is smaller than a part, else the last part
        and the completion of the upload once every part is in."""
        if self._done:
            return
        try:
            if self._upload_id is None:
                self._buf.truncate(self._fill)
                self._buf.seek(0)
                self._call("writing", "put_object", Body=self._buf)
            else:
                if self._fill:
                    self._submit()
                while self._in_flight:
                    self._wait_oldest()
                self._call(
                    "completing the upload",
                    "complete_multipart_upload",
                    UploadId=self._upload_id,
                    MultipartUpload={"Parts": self._parts},
                )
        except BaseException:
            self.discard()
            raise
        self._done = True
        self._release()
        self._fs.invalidate_cache(self._store._strip(self.path))

    def discard(self) -> None:
        """Drop what was written: stop the parts under way and abort the upload."""
        if self._done:
            return
        self._done = True
        for _, _, _, future in self._in_flight:
            future.cancel()
        if self._upload_id is not None:
            try:
                self._call(
                    "aborting the upload", "abort_multipart_upload", UploadId=self._upload_id
                )
            except Exception:
                pass  # best effort: an unfinished upload stores nothing either way
        self._release()

    def _release(self) -> None:
        self._in_flight.clear()
        self._free.clear()
        self._buf = io.BytesIO()
