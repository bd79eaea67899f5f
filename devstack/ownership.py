"""Which process runs an embedded server on a data directory: the one holding its lock.

The owner takes an exclusive ``flock`` on a lock file in the data directory before it starts
the server and keeps it until the server is stopped. The kernel drops the lock when the
owner's process ends, however it ends (SIGKILL too), so:

* a server found running on the data directory while nobody holds the lock is a leftover of a
  dead owner, safe to stop;
* a held lock means a live owner, whose server another command uses instead of starting one
  (or stopping it).

The owner writes its pid and command line into the lock file when it takes the lock, and the
server's pid and port once the server answers (the password stays in the server's own
private file). The lock file is opened close-on-exec, so no child holds the lock after the
owner is gone.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from devstack.supervise import (
    HOST,
    POLL_INTERVAL,
    ChildServer,
    EmbeddedServiceError,
    require_main_thread,
)

__all__ = ["Holder", "OwnedServer", "OwnerLock", "ServerInUseError"]

log = logging.getLogger("settlement.embedded")


class ServerInUseError(EmbeddedServiceError):
    """Another live process runs the server, and we were to run it ourselves."""


@dataclass(frozen=True)
class Holder:
    """What the owner wrote into the lock file: itself, and its server once it answers."""

    owner: int
    command: str
    pid: int = 0  # the server's; 0 until it answers
    port: int = 0

    def __str__(self) -> str:
        return f"pid {self.owner}: {self.command}"


class OwnerLock:
    """The lock file ``path``: :meth:`acquire` to own the server, :meth:`holder` to learn
    who does."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        """Whether we hold the lock."""
        return self._fd is not None

    def acquire(self) -> bool:
        """Take the lock if no live process holds it (then True); never waits."""
        if self._fd is not None:
            return True
        try:
            self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        except OSError as exc:  # another user's data directory, most likely
            raise EmbeddedServiceError(f"cannot open the lock file {self.path}: {exc}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        self._write({"owner": os.getpid(), "command": _command_line()})
        return True

    def publish(self, *, pid: int, port: int) -> None:
        """Say where the server we own answers."""
        self._write({"owner": os.getpid(), "command": _command_line(), "pid": pid, "port": port})

    def holder(self) -> Holder | None:
        """Who holds the lock, as written; None if nothing (or half of it) is written yet."""
        try:
            record = json.loads(self.path.read_bytes())
            return Holder(
                owner=int(record["owner"]),
                command=str(record["command"]),
                pid=int(record.get("pid", 0)),
                port=int(record.get("port", 0)),
            )
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def release(self) -> None:
        """Give the lock up (emptying the file first); safe to call when not held."""
        fd, self._fd = self._fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, 0)
            os.close(fd)

    def _write(self, record: dict[str, object]) -> None:
        assert self._fd is not None
        data = json.dumps(record).encode()
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, data, 0)


def _command_line() -> str:
    """Our command line as a person would type it (``settlement serve --embedded``)."""
    args = list(sys.argv)
    if args and args[0].endswith(("cli.py", "__main__.py")):
        args[0] = "settlement"
    elif args:
        args[0] = Path(args[0]).name
    return " ".join(args)


class OwnedServer(ChildServer):
    """A :class:`ChildServer` on a data directory, owned by whoever holds its lock file.

    :meth:`start` starts it and owns it, or, when another live process owns it, uses that
    process's server (:meth:`stop` then leaves it running) or refuses (``share=False``).
    """

    # How long to wait for an owner that holds the lock to say where its server answers.
    _attach_timeout: ClassVar[float]

    def __init__(self, log_path: Path, lock_path: Path) -> None:
        super().__init__(log_path)
        self._lock = OwnerLock(lock_path)
        self._holder: Holder | None = None  # the owner whose server we use

    @property
    def url(self) -> str:
        raise NotImplementedError

    @property
    def port(self) -> int:
        return self._holder.port if self._holder is not None else super().port

    @property
    def pid(self) -> int:
        return self._holder.pid if self._holder is not None else super().pid

    @property
    def running(self) -> bool:
        """Started (ours, or another owner's in use) and not stopped."""
        return super().running or self._holder is not None

    @property
    def owned(self) -> bool:
        """Whether we run the server as our child (not another owner's in use)."""
        return self._proc is not None

    def start(self, *, share: bool = True) -> str:
        """Start the server and own it; or, when a live process owns it, use that one's
        (``share``) or refuse with :class:`ServerInUseError`. The URL."""
        if self.running:
            return self.url
        require_main_thread()
        deadline = time.monotonic() + self._attach_timeout
        while not self._lock.acquire():
            holder = self._lock.holder()
            if not share:
                raise ServerInUseError(
                    f"the embedded {self._name} under {self._lock.path.parent} is run by"
                    f" another process ({holder or 'starting'}); stop that one first, or use"
                    " another data directory"
                )
            if holder is not None and holder.port and self._use(holder):
                log.info(
                    "using the %s that %s runs at %s:%d (pid %d); it stays when we end",
                    self._name,
                    holder,
                    HOST,
                    holder.port,
                    holder.pid,
                )
                return self.url
            if time.monotonic() > deadline:
                raise EmbeddedServiceError(
                    f"the embedded {self._name} under {self._lock.path.parent} is run by"
                    f" another process ({holder or 'starting'}) that did not let us in within"
                    f" {self._attach_timeout}s"
                )
            time.sleep(POLL_INTERVAL)
        try:
            self._start_owned()
            self._lock.publish(pid=self.pid, port=self._port)
        except BaseException:
            self.stop()
            raise
        return self.url

    def stop(self) -> None:
        """Stop the server we own (safe to call twice); another owner's in use runs on."""
        self._holder = None
        try:
            super().stop()
        finally:
            self._lock.release()

    def _start_owned(self) -> None:
        """Start the server (we hold the lock); ``_proc`` and ``_port`` set once it answers."""
        raise NotImplementedError

    def _use(self, holder: Holder) -> bool:
        """Use the server ``holder`` runs if it answers us (then True)."""
        raise NotImplementedError
