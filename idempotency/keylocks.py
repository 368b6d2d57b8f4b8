"""Key locks on SQLite, which has no advisory locks.

On SQLite a second request with a key in flight would wait for the first one's
`BEGIN IMMEDIATE` (one writer at a time) and then replay it: never a second execution,
but not the contract's `409` either, and a `Prefer: wait` would mean nothing. So an
atomic request on SQLite first takes its key's lock here, without waiting, as
PostgreSQL's `pg_try_advisory_xact_lock` does, and holds it until its transaction
has ended:

- between processes (gunicorn's workers), a POSIX byte-range lock of one byte of a
  lock file beside the database, at an offset hashed from scope and key; the kernel
  lets go of it when the process dies, as PostgreSQL does of a dead session's locks;
- between the threads of one process, which POSIX locks do not tell apart (they
  belong to the process), a set of the keys this process holds.

The lock file is opened once per process and never closed: closing any descriptor
of a file drops every POSIX lock the process holds on it.
"""

import fcntl
import hashlib
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

# Offsets below 2**62: any 64-bit off_t holds them.
_OFFSETS = 2**62


class _Process:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.held: set[int] = set()
        self.files: dict[str, int] = {}


_process = _Process()


def _forked() -> None:
    """In a forked child: none of its parent's locks are its own (POSIX locks are
    not inherited), and the thread that may have held `_process.lock` at the fork
    does not exist here. A fresh start; the parent's descriptors stay open, as
    closing one would be harmless here but is never needed."""
    global _process
    _process = _Process()


os.register_at_fork(after_in_child=_forked)


def lock_file(database: str) -> str | None:
    """The lock file of a SQLite database file; None for an in-memory one (this
    process is then the only one that can reach it).

    Django opens SQLite with `uri=True`, so a `file:` name (`file:/data/db.sqlite3`,
    which `DATABASE_URL=sqlite:///file:/data/db.sqlite3` gives) is a file that every
    process shares too, unless it asks for memory (`mode=memory`, as Django's test
    database in memory does, `vfs=memdb`, or the path `:memory:`).
    """
    if database.startswith("file:"):
        uri = urlsplit(database)
        query = parse_qs(uri.query)
        database = unquote(uri.path)
        if query.get("mode") == ["memory"] or query.get("vfs") == ["memdb"]:
            return None
    if not database or database == ":memory:":
        return None
    return f"{database}.keylocks"


def _offset(scope: str, key: str) -> int:
    digest = hashlib.sha256(f"{scope}\x00{key}".encode()).digest()
    return int.from_bytes(digest[:8], "big") % _OFFSETS


def _descriptor(path: str) -> int:
    """This process's descriptor of `path` (called under `_process.lock`)."""
    fd = _process.files.get(path)
    if fd is None:
        Path(path).touch(exist_ok=True)
        fd = _process.files[path] = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    return fd


def try_acquire(path: str | None, scope: str, key: str) -> bool:
    """Take the key's lock if nobody holds it; False at once if somebody does."""
    offset = _offset(scope, key)
    with _process.lock:
        if offset in _process.held:
            return False
        if path is not None:
            # Opened first, outside the `except`: a file we may not open (EACCES)
            # says nothing about the key, and must not read as "held" for ever.
            fd = _descriptor(path)
            try:
                fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, offset)
            except (BlockingIOError, PermissionError):  # EAGAIN or EACCES: held
                return False
        _process.held.add(offset)
        return True


def release(path: str | None, scope: str, key: str) -> None:
    offset = _offset(scope, key)
    with _process.lock:
        if offset not in _process.held:
            return
        _process.held.discard(offset)
        if path is not None:
            fcntl.lockf(_descriptor(path), fcntl.LOCK_UN, 1, offset)


@contextmanager
def held(path: str | None, scope: str, key: str) -> Iterator[bool]:
    """Hold the key's lock for the block if it is free; yield whether it was."""
    if not try_acquire(path, scope, key):
        yield False
        return
    try:
        yield True
    finally:
        release(path, scope, key)


def wait_until_free(path: str | None, scope: str, key: str, seconds: float) -> None:
    """Return once nobody holds the key's lock, or `seconds` have passed."""
    deadline = time.monotonic() + seconds
    while True:
        if try_acquire(path, scope, key):
            release(path, scope, key)
            return
        left = deadline - time.monotonic()
        if left <= 0:
            return
        time.sleep(min(0.01, left))
