"""SQLite's key locks (`idempotency.keylocks`): between the threads of a process and
between processes, and let go of when the process holding one dies."""

import os
import signal
import subprocess
import sys
import time

import pytest

from idempotency import keylocks
from tests.conftest import run_in_threads

HOLD = """
import sys, time
from idempotency import keylocks
assert keylocks.try_acquire(*sys.argv[1:4])
print("held", flush=True)
time.sleep(60)
"""


def test_one_holder_among_threads(tmp_path):
    path = str(tmp_path / "db.keylocks")
    got = run_in_threads(8, lambda _: keylocks.try_acquire(path, "user:1", "k"))
    assert got.count(True) == 1
    assert keylocks.try_acquire(path, "user:1", "other")  # another key is free
    assert keylocks.try_acquire(path, "user:2", "k")  # and another scope's
    for scope, key in (("user:1", "k"), ("user:1", "other"), ("user:2", "k")):
        keylocks.release(path, scope, key)
    with keylocks.held(path, "user:1", "k") as free:
        assert free
        with keylocks.held(path, "user:1", "k") as again:
            assert not again
    assert keylocks.try_acquire(path, "user:1", "k")
    keylocks.release(path, "user:1", "k")


def test_a_lock_held_by_another_process_until_it_dies(tmp_path):
    path = str(tmp_path / "db.keylocks")
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, path, "user:1", "k"],
        stdout=subprocess.PIPE,
        text=True,
        cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))),
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        assert not keylocks.try_acquire(path, "user:1", "k")
        started = time.monotonic()
        keylocks.wait_until_free(path, "user:1", "k", 0.3)
        assert 0.3 <= time.monotonic() - started < 1
        assert keylocks.try_acquire(path, "user:1", "other")
        keylocks.release(path, "user:1", "other")
        os.kill(holder.pid, signal.SIGKILL)  # the kernel lets go of its locks
        holder.wait(timeout=10)
        keylocks.wait_until_free(path, "user:1", "k", 5)
        assert keylocks.try_acquire(path, "user:1", "k")
        keylocks.release(path, "user:1", "k")
    finally:
        holder.kill()
        holder.wait(timeout=10)


@pytest.mark.django_db(transaction=True)
@pytest.mark.urls("tests.idempotency.urls")
def test_a_request_on_sqlite_is_409_while_another_process_holds_its_key(
    alice, key, settings
):
    from django.db import connection

    if connection.vendor != "sqlite":
        pytest.skip("SQLite's key locks")
    settings.REDIS_URL = ""
    path = keylocks.lock_file(str(connection.settings_dict["NAME"]))
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, path, f"user:{alice.user.pk}", key],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        busy = alice.post("/test/deposits", {"amount": 5}, key)
        assert busy.status_code == 409, busy.content
        assert alice.deposits() == 0
        holder.kill()
        holder.wait(timeout=10)
        done = alice.post("/test/deposits", {"amount": 5}, key)
        assert done.status_code == 201
        assert alice.deposits() == 1
    finally:
        holder.kill()
        holder.wait(timeout=10)


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("/data/db.sqlite3", "/data/db.sqlite3.keylocks"),
        ("db.sqlite3", "db.sqlite3.keylocks"),
        ("", None),
        (":memory:", None),
        # Django always opens SQLite with uri=True: a `file:` name is a file too
        # (DATABASE_URL=sqlite:///file:/data/db.sqlite3 gives one), and its
        # processes must exclude each other as well.
        ("file:/data/db.sqlite3", "/data/db.sqlite3.keylocks"),
        ("file:///data/db.sqlite3?cache=private", "/data/db.sqlite3.keylocks"),
        ("file://localhost/data/my%20db.sqlite3", "/data/my db.sqlite3.keylocks"),
        ("file:db.sqlite3?mode=rwc", "db.sqlite3.keylocks"),
        # In memory: only this process reaches it.
        ("file:memorydb_default?mode=memory&cache=shared", None),
        ("file::memory:?cache=shared", None),
        ("file:whatever?vfs=memdb", None),
    ],
)
def test_the_lock_file_of_each_name_form(name, expected):
    assert keylocks.lock_file(name) == expected


def test_a_lock_file_that_cannot_be_opened_is_an_error_not_a_key_in_flight(
    tmp_path, monkeypatch
):
    """A lock file this process may not open (made by another user, 0644) says
    nothing about the key: answering 409 would refuse every request for ever,
    with nothing logged, while nobody runs it."""
    path = str(tmp_path / "db.keylocks")

    def refused(*args, **kwargs):
        raise PermissionError(13, "Permission denied", path)

    monkeypatch.setattr(keylocks.os, "open", refused)
    with pytest.raises(PermissionError):
        keylocks.try_acquire(path, "user:1", "k")
    monkeypatch.undo()
    assert keylocks.try_acquire(path, "user:1", "k")  # nothing was left held
    keylocks.release(path, "user:1", "k")


def test_a_forked_child_holds_none_of_its_parents_keys(tmp_path):
    """POSIX locks are not inherited: a child forked while a thread of its parent
    held a key starts with no key held, and takes that key once the parent has
    let go of it (instead of answering 409 for it until some other key is used)."""
    path = str(tmp_path / "db.keylocks")
    for lock_path in (path, None):
        assert keylocks.try_acquire(lock_path, "user:1", "k")
        released_r, released_w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: reports through its exit status only
            try:
                os.close(released_w)
                os.read(released_r, 1)  # the parent has let go of the key
                os._exit(0 if keylocks.try_acquire(lock_path, "user:1", "k") else 1)
            except BaseException:
                os._exit(2)
        os.close(released_r)
        keylocks.release(lock_path, "user:1", "k")
        os.write(released_w, b"x")
        os.close(released_w)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0, lock_path
