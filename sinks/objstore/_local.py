"""The local-filesystem backend: one file per object, compare-and-swap across processes.

Layout under the root directory: the object for key ``a/b/c`` is the file ``a/b/c``,
holding exactly the object's bytes (so other tools, Spark included, read it as is).
Names starting with ``.`` are ours: ``.<name>.<random>.tmp`` files are writes in
progress (or left by a crash), ``.locks/`` holds the lock files. Key segments never
start with ``.`` (``_keys.check_key``), so neither is ever listed.

Concurrency: every write of a key (put, put_if_absent, put_if_match, delete) checks and
renames while holding the key's lock stripe: a thread lock (threads of one process)
plus ``flock`` on ``.locks/<stripe>`` (other processes). Readers take no lock: a
rename is atomic, so a reader opens either the old file or the new one.

Etags are content hashes (BLAKE2b, 128 bits), computed on every read. Writing the same
bytes again keeps the etag, as S3 does for single-part uploads.
"""

from __future__ import annotations

import builtins
import contextlib
import errno
import fcntl
import hashlib
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

from sinks.objstore._errors import NotFound, ObjectStoreError, PreconditionFailed, StoreUnavailable
from sinks.objstore._keys import check_key, check_prefix

__all__ = ["LocalStore", "local_etag"]

_LOCK_DIR = ".locks"
_TEMP_SUFFIX = ".tmp"
_TRANSIENT_ERRNOS = frozenset({errno.EAGAIN, errno.EINTR, errno.EBUSY, errno.ETIMEDOUT})

StepHook = Callable[[str, str, str], None]
"""``on_step(op, key, step)``: called at each durability step of a write (a test raises
``Crash`` from it to stop the write there, as a process crash would)."""


def local_etag(data: bytes) -> str:
    """The etag the local store gives ``data``: a BLAKE2b-128 hex digest."""
    return hashlib.blake2b(data, digest_size=16).hexdigest()


class LocalStore:
    """Objects as files under ``root``, with a compare-and-swap that holds across processes.

    ``fsync=False`` skips the fsync calls: writes stay atomic for readers and other
    processes but may be lost (whole) in a power failure or kernel crash. For tests
    and scratch data only.

    ``on_step(op, key, step)`` is a testing aid called between the durability steps of
    a write, with ``step`` one of ``"temp-written"``, ``"locked"``, ``"renamed"``,
    ``"synced"``. A ``BaseException`` raised from it (``Crash``) skips all clean-up,
    leaving the directory exactly as a crash at that point would.

    Limits: a key cannot also be a "directory" of other keys (``a`` and ``a/b`` cannot
    both exist; the second write fails with ``ObjectStoreError``); a key segment may
    be at most 217 bytes (the temporary name adds 38 to the filesystem's 255). Locks
    use ``flock``: use a local filesystem, not NFS.
    """

    def __init__(self, root: str | os.PathLike[str], *, create: bool = True, fsync: bool = True,
                 lock_stripes: int = 64, on_step: StepHook | None = None) -> None:
        if lock_stripes < 1:
            raise ValueError(f"lock_stripes must be at least 1, got {lock_stripes}")
        self._root = Path(root).absolute()
        self._fsync = fsync
        self._on_step = on_step
        self._stripes = lock_stripes
        self._thread_locks = [threading.Lock() for _ in range(lock_stripes)]
        with self._os_errors("open", None):
            if create:
                self._root.mkdir(parents=True, exist_ok=True)
            if not self._root.is_dir():
                what = "is not a directory" if self._root.exists() else "does not exist"
                raise ObjectStoreError(f"{self.describe()} {what}")
            (self._root / _LOCK_DIR).mkdir(exist_ok=True)

    @property
    def root(self) -> Path:
        return self._root

    def describe(self) -> str:
        return f"file://{self._root}"

    # Reads: no lock, the rename makes every version appear whole.

    def get(self, key: str) -> tuple[bytes, str]:
        path = self._path(check_key(key))
        with self._os_errors("get", key):
            try:
                data = path.read_bytes()
            except (FileNotFoundError, NotADirectoryError, IsADirectoryError) as exc:
                raise NotFound(f"no object {key!r} in {self.describe()}", key=key) from exc
        return data, local_etag(data)

    def head(self, key: str) -> str | None:
        try:
            return self.get(key)[1]
        except NotFound:
            return None

    def list(self, prefix: str) -> list[str]:
        check_prefix(prefix)
        directory = prefix.rpartition("/")[0]
        if any(segment.startswith(".") for segment in directory.split("/")):
            return []  # no key has such a segment; do not wander into .locks/
        start = self._root / directory if directory else self._root
        keys: list[str] = []
        with self._os_errors("list", None):
            self._walk(start, directory, prefix, keys)
        keys.sort()  # str order is code-point order, which is UTF-8 byte order
        return keys

    # Writes.

    def put(self, key: str, data: bytes) -> str:
        return self._write("put", key, data, lambda path: None)

    def put_if_absent(self, key: str, data: bytes) -> str:
        def absent(path: Path) -> None:
            if os.path.lexists(path):
                raise PreconditionFailed(
                    f"put_if_absent {key!r} in {self.describe()}: the key already exists; "
                    "nothing was written", key=key)
        return self._write("put_if_absent", key, data, absent)

    def put_if_match(self, key: str, data: bytes, etag: str) -> str:
        def matches(path: Path) -> None:
            try:
                current = local_etag(path.read_bytes())
            except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
                raise PreconditionFailed(
                    f"put_if_match {key!r} in {self.describe()}: the key does not exist; "
                    "nothing was written", key=key) from None
            if current != etag:
                raise PreconditionFailed(
                    f"put_if_match {key!r} in {self.describe()}: etag is {current}, not "
                    f"{etag}; nothing was written (re-read and retry)", key=key)
        return self._write("put_if_match", key, data, matches)

    def delete(self, key: str) -> None:
        """Remove the object, if any.

        # Step 1. Take the key's lock stripe, unlink the file (absent is fine).
        # Step 2. Release the lock, fsync the directory so the removal is durable.
        Directories left empty stay (a concurrent writer may be about to use them).
        """
        path = self._path(check_key(key))
        with self._os_errors("delete", key):
            with self._locked(key):  # Step 1.
                try:
                    path.unlink()
                except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
                    return
            self._sync_dir(path.parent)  # Step 2.

    def remove_stale_temp_files(self, max_age_seconds: float = 3600.0,
                                now: float | None = None) -> builtins.list[Path]:
        """Delete temporary files older than ``max_age_seconds`` (left by crashed writers).

        ``now`` is a ``time.time()`` value (injected by tests). Returns what was removed.
        Never touches objects; a write still in progress is younger than any sane age.
        """
        now = time.time() if now is None else now
        removed: builtins.list[Path] = []
        with self._os_errors("remove_stale_temp_files", None):
            for dirpath, dirnames, filenames in os.walk(self._root):
                dirnames[:] = [d for d in dirnames if d != _LOCK_DIR]
                for name in filenames:
                    if not (name.startswith(".") and name.endswith(_TEMP_SUFFIX)):
                        continue
                    path = Path(dirpath) / name
                    with contextlib.suppress(FileNotFoundError):
                        if now - path.stat().st_mtime >= max_age_seconds:
                            path.unlink()
                            removed.append(path)
        return removed

    # Internals.

    def _write(self, op: str, key: str, data: bytes, check: Callable[[Path], None]) -> str:
        """Write ``data`` at ``key`` if ``check`` passes; crash-safe and atomic.

        # Step 1. Write the bytes to a new temporary file beside the target; fsync it.
        # Step 2. Take the key's lock stripe (threads, then other processes).
        # Step 3. Check the condition (raises PreconditionFailed: nothing written).
        # Step 4. Rename the temporary file over the target: the new object appears
        #         whole, atomically, to every reader.
        # Step 5. Release the lock; fsync the directory so the rename survives a crash.
        A crash before Step 4 leaves the old object (and a stray temp file); after it,
        the new one.
        """
        path = self._path(check_key(key))
        if not isinstance(data, bytes | bytearray | memoryview):
            raise TypeError(f"object data must be bytes, not {type(data).__name__}")
        data = bytes(data)
        etag = local_etag(data)
        temp = path.parent / f".{path.name}.{uuid.uuid4().hex}{_TEMP_SUFFIX}"
        with self._os_errors(op, key):
            try:
                self._make_parents(path.parent)
                with open(temp, "xb") as handle:  # Step 1.
                    handle.write(data)
                    handle.flush()
                    if self._fsync:
                        os.fsync(handle.fileno())
                self._step(op, key, "temp-written")
                with self._locked(key):  # Step 2.
                    self._step(op, key, "locked")
                    if path.is_dir():
                        raise ObjectStoreError(
                            f"{op} {key!r} in {self.describe()}: {path} is a directory of "
                            "other keys; the local store cannot hold both", key=key)
                    check(path)  # Step 3.
                    os.replace(temp, path)  # Step 4.
                    self._step(op, key, "renamed")
            except Exception:
                # Not BaseException: a simulated crash must leave the temp file behind.
                with contextlib.suppress(OSError):
                    temp.unlink()
                raise
        try:
            self._sync_dir(path.parent)  # Step 5.
        except OSError as exc:
            raise ObjectStoreError(
                f"{op} {key!r} in {self.describe()}: the new object is in place but "
                f"syncing its directory failed ({exc}), so it may not survive a crash; "
                "check the disk, then re-read the key", key=key) from exc
        self._step(op, key, "synced")
        return etag

    def _path(self, key: str) -> Path:
        return self._root.joinpath(*key.split("/"))

    def _step(self, op: str, key: str, step: str) -> None:
        if self._on_step is not None:
            self._on_step(op, key, step)

    @contextlib.contextmanager
    def _locked(self, key: str) -> Iterator[None]:
        stripe = hashlib.blake2b(key.encode(), digest_size=4).digest()
        index = int.from_bytes(stripe, "big") % self._stripes
        with self._thread_locks[index]:
            # Opened per use, so a forked child never shares the lock's open file
            # description (and so its flock) with its parent.
            lock_path = self._root / _LOCK_DIR / f"{index:04x}"
            fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                yield
            finally:
                os.close(fd)  # releases the flock

    def _make_parents(self, directory: Path) -> None:
        """Create ``directory`` and missing parents, fsyncing each new entry's parent."""
        if directory.is_dir():
            return
        missing: list[Path] = []
        probe = directory
        while not probe.is_dir() and probe != self._root:
            missing.append(probe)
            probe = probe.parent
        for new_dir in reversed(missing):
            try:
                new_dir.mkdir()
            except FileExistsError:
                if not new_dir.is_dir():
                    raise ObjectStoreError(
                        f"{new_dir} is an object, so it cannot also hold other keys in "
                        f"{self.describe()}") from None
                continue
            self._sync_dir(new_dir.parent)

    def _sync_dir(self, directory: Path) -> None:
        if not self._fsync:
            return
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def _walk(self, directory: Path, rel: str, prefix: str, out: builtins.list[str]) -> None:
        try:
            entries = list(os.scandir(directory))
        except (FileNotFoundError, NotADirectoryError):
            return
        for entry in entries:
            if entry.name.startswith("."):
                continue  # temp files, lock files: never objects
            key = f"{rel}/{entry.name}" if rel else entry.name
            if entry.is_dir(follow_symlinks=False):
                # Descend only where keys below could still start with the prefix.
                if key.startswith(prefix) or prefix.startswith(key + "/"):
                    self._walk(Path(entry.path), key, prefix, out)
            elif entry.is_file(follow_symlinks=False) and key.startswith(prefix):
                out.append(key)

    @contextlib.contextmanager
    def _os_errors(self, op: str, key: str | None) -> Iterator[None]:
        """The one place ``OSError`` becomes an ``ObjectStoreError``."""
        try:
            yield
        except ObjectStoreError:
            raise
        except OSError as exc:
            what = f"{op} {key!r}" if key is not None else op
            if exc.errno in _TRANSIENT_ERRNOS:
                raise StoreUnavailable(
                    f"{what} in {self.describe()} failed transiently ({exc}); nothing "
                    "changed, retry", key=key) from exc
            raise ObjectStoreError(
                f"{what} in {self.describe()} failed: {exc}. Objects already written "
                "are intact; fix the cause (permissions, space) and retry", key=key) from exc
