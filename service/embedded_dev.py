"""What ``--embedded`` starts on a development machine: PostgreSQL and Redis for the URLs not
set, and beside ``settlement serve`` the provider simulator, one feed observer process per
feed, and the secrets it keeps under the data directory. Needs the ``devstack`` extra
(imported inside the functions; :func:`require_devstack` says what is missing)."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from service.config import ConfigError, Settings

if TYPE_CHECKING:
    from devstack.ownership import OwnedServer

__all__ = [
    "embedded_provider",
    "endpoints",
    "local_admin_key",
    "local_secret",
    "observer_process",
    "require_devstack",
]

# the settlement command's log lines, wherever its commands start the servers
log = logging.getLogger("settlement.cli")

# The embedded servers and the provider simulator are not part of a production install.
DEVSTACK_INSTALL = "pip install 'settlement[devstack]'"

# How long the provider simulator may take to answer its health check (a loaded CI machine).
PROVIDER_START_TIMEOUT = 30.0


@contextlib.contextmanager
def endpoints(
    settings: Settings, embedded: bool, *, want_redis: bool, serve: bool = False
) -> Iterator[Settings]:
    """Yield settings whose URLs are set, starting embedded servers for the unset ones.

    A server another live command already runs on the data directory is used, not started,
    and left running. ``serve`` (``settlement serve``) runs its servers itself: another
    command's stops it with one line, and while it serves, a server of its own that dies
    makes it shut down (SIGTERM to itself) and exit non-zero with one line naming the server
    and its log.
    """
    need_pg = settings.database_url is None
    need_redis = want_redis and settings.redis_url is None
    if not (need_pg or need_redis):
        yield settings
        return
    if not embedded:
        missing = "SETTLEMENT_DATABASE_URL" if need_pg else "SETTLEMENT_REDIS_URL"
        raise ConfigError(f"{missing} is not set; set it, or pass --embedded")
    require_devstack("--embedded")
    from devstack import EmbeddedServiceError, EmbeddedServices
    from devstack.supervise import log_tail

    data_dir = Path(settings.data_dir).resolve()
    data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    started = time.monotonic()
    services = EmbeddedServices(
        data_dir, want_postgres=need_pg, want_redis=need_redis, durable=True, share=not serve
    )
    try:
        services.start()
    except EmbeddedServiceError as exc:
        sys.exit(f"settlement: {exc}")
    died: list[str] = []

    def on_exit(server: OwnedServer, code: int) -> None:
        died.append(
            f"the embedded {server.name} (pid {server.pid}) exited with code {code} while we"
            f" served; its log is {server.log_path}"
        )
        log.error(
            "embedded server died; shutting down",
            extra={
                "server": server.name,
                "pid": server.pid,
                "exit_code": code,
                "log": str(server.log_path),
                "log_tail": log_tail(server.log_path, 0),
            },
        )
        os.kill(os.getpid(), signal.SIGTERM)  # the web server shuts down as on any SIGTERM

    try:
        log.info(
            "embedded services ready",
            extra={"data_dir": str(data_dir), "seconds": round(time.monotonic() - started, 2)},
        )
        if serve:
            services.watch(on_exit)
        yield Settings.from_env(
            database_url=services.database_url if need_pg else settings.database_url,
            redis_url=services.redis_url if need_redis else settings.redis_url,
        )
    finally:
        services.stop()
        if died:
            # Whatever ended the block (the SIGTERM above, as an exception or a return of the
            # web server), the command's outcome is this failure.
            sys.exit(f"settlement: {died[0]}")


def require_devstack(what: str) -> None:
    """Stop with one line, not a traceback, when the devstack extra is not installed."""
    import importlib.util

    if importlib.util.find_spec("devstack") is None:
        missing = ["devstack"]
    else:
        from devstack import missing_extra

        missing = missing_extra()
    if missing:
        sys.exit(
            f"settlement: {what} needs the devstack extra, which is not installed"
            f" (missing: {', '.join(missing)}); run: {DEVSTACK_INSTALL}"
        )


@contextlib.contextmanager
def embedded_provider(settings: Settings, port: int) -> Iterator[tuple[str, str]]:
    """Run the provider simulator beside an embedded dev server; yields (url, secret)."""
    import subprocess

    import httpx

    from devstack import die_with_parent

    data_dir = Path(settings.data_dir).resolve()
    secret = settings.provider_secret or local_secret(data_dir / "provider.secret")
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "devstack.provider",
            "--port",
            str(port),
            "--db",
            str(data_dir / "provider.sqlite3"),
        ],
        env={**os.environ, "SETTLEMENT_PROVIDER_SECRET": secret},
        preexec_fn=die_with_parent(),
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + PROVIDER_START_TIMEOUT
        while True:
            if proc.poll() is not None:
                raise ConfigError(
                    f"the provider simulator exited ({proc.returncode}); is port {port} free?"
                )
            try:
                httpx.get(f"{url}/health", timeout=1.0)
                break
            except httpx.TransportError:
                if time.monotonic() > deadline:
                    raise ConfigError("the provider simulator did not start") from None
                time.sleep(0.1)
        print(f"provider simulator at {url}", flush=True)
        yield url, secret
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@contextlib.contextmanager
def observer_process(feed: str) -> Iterator[None]:
    """``settlement observer run --feed FEED`` beside the embedded dev server."""
    import subprocess

    from devstack import die_with_parent

    # the observer counts its own figures, as it does beside any server: not in the server's
    # metrics directory, where the scrapes would sum them as a worker's
    env = {k: v for k, v in os.environ.items() if k != "PROMETHEUS_MULTIPROC_DIR"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "service.cli", "observer", "run", "--feed", feed],
        env=env,
        preexec_fn=die_with_parent(),
        start_new_session=True,
    )
    print(f"feed observer for {feed} (pid {proc.pid})", flush=True)
    try:
        yield
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def local_secret(path: Path) -> str:
    """A development secret made once and kept beside the data (make run only)."""
    import secrets

    return _kept(path, lambda: secrets.token_hex(32))


def local_admin_key(data_dir: Path) -> Path:
    """Where the embedded development server's admin key is: made once, kept beside its data
    (the key is never printed; read it from the file)."""
    from service.store.principals import new_key

    path = data_dir.resolve() / "admin.key"
    _kept(path, new_key)
    return path


def _kept(path: Path, make: Callable[[], str]) -> str:
    """The secret in ``path``, made by ``make`` if the file is new; readable by us only."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except FileExistsError:
        if path.stat().st_mode & 0o077:
            path.chmod(0o600)  # made before secrets were kept private
        return path.read_text().strip()
    value = make()
    with os.fdopen(fd, "w") as file:
        file.write(value + "\n")
    return value
