"""What ``settlement serve --embedded`` starts beside the server on a development machine: the
provider simulator, one feed observer process per feed, and the secrets it keeps under the
data directory. Needs the ``devstack`` extra (imported inside the functions)."""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from service.config import ConfigError, Settings

__all__ = ["embedded_provider", "local_admin_key", "local_secret", "observer_process"]

# How long the provider simulator may take to answer its health check (a loaded CI machine).
PROVIDER_START_TIMEOUT = 30.0


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

    proc = subprocess.Popen(
        [sys.executable, "-m", "service.cli", "observer", "run", "--feed", feed],
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

    if path.exists():
        return path.read_text().strip()
    value = secrets.token_hex(32)
    path.touch(mode=0o600)
    path.write_text(value + "\n")
    return value


def local_admin_key(data_dir: Path) -> str:
    """The embedded development server's admin key: made once, kept beside its data."""
    from service.store.principals import new_key

    path = data_dir.resolve() / "admin.key"
    if path.exists():
        return path.read_text().strip()
    key = new_key()
    path.touch(mode=0o600)
    path.write_text(key + "\n")
    return key
