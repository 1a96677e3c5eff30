"""Shared fixtures: the local service on a free loopback port, and a clean environment."""

from __future__ import annotations

import os
import signal

import pytest

from batchsum.local import LocalService
from tests.support import BASIC_KEY, EXPIRED_KEY, KEY, RedisServer, free_port

# A suite started as a background job of a script (`.ci/run &`) inherits SIGINT ignored, and Python
# then installs no handler of its own: the tests that interrupt a run (and the processes they start,
# which inherit it through exec) need SIGINT as an interactive session has it.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

# What the fast lane (`pytest -m "not slow"`, README.md) leaves out: a test marked ``slow`` starts a
# process (batchsum's command, voila, a kernel) or waits on the wall clock; the heavy, Spark and Ray
# tests are slow by their own marker.
SLOW_BY_MARKER = ("heavy", "spark", "ray")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if any(item.get_closest_marker(name) for name in SLOW_BY_MARKER):
            item.add_marker(pytest.mark.slow)


@pytest.fixture(autouse=True)
def clean_environ(monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory) -> None:
    """No test sees the developer's BATCHSUM_* settings or proxies, or their cache folder (the
    machine-wide rate budget lives there): each test gets a cache folder of its own."""
    for name in list(os.environ):
        if name.startswith("BATCHSUM_") or name.lower().endswith("_proxy"):
            monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("cache")))


@pytest.fixture(scope="session")
def service():
    """One local service for the session, no rate limit, shared by its tests through ``svc``."""
    with LocalService([KEY, f"{BASIC_KEY}:basic", f"{EXPIRED_KEY}:expired"]) as running:
        yield running


@pytest.fixture
def svc(service: LocalService):
    """The session's local service as it was made, whatever the tests before left in it (a limit, a
    key's window made at that limit, a plan, faults holding requests, counts): reset before each test,
    and after it (what it held goes on)."""
    service.state.reset()
    yield service
    service.state.reset()


@pytest.fixture
def env(svc: LocalService, monkeypatch: pytest.MonkeyPatch) -> LocalService:
    """The session's service, with its key and address in the environment (as a CLI user sets them)."""
    monkeypatch.setenv("BATCHSUM_API_KEY", KEY)
    monkeypatch.setenv("BATCHSUM_BASE_URL", svc.url)
    return svc


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory: pytest.TempPathFactory):
    """A real redis-server (Debian's package) on a free loopback port, for the session."""
    server = RedisServer(tmp_path_factory.mktemp("redis")).start()
    try:
        yield server.url
    finally:
        server.stop()


@pytest.fixture(scope="session")
def s3_server():
    """An S3-compatible server (moto's standalone server) on a free loopback port."""
    moto_server = pytest.importorskip("moto.server")
    port = free_port()
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    yield f"http://127.0.0.1:{port}"
    server.stop()


@pytest.fixture
def s3(s3_server, monkeypatch):
    """Credentials and endpoint where users set them: the environment (as boto3 and pyarrow read it);
    the buckets "data" and "secretdata"."""
    for name, value in {
        "AWS_ENDPOINT_URL": s3_server,
        "AWS_ACCESS_KEY_ID": "test",
        "AWS_SECRET_ACCESS_KEY": "test",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_EC2_METADATA_DISABLED": "true",
    }.items():
        monkeypatch.setenv(name, value)
    from pyarrow import fs

    filesystem = fs.S3FileSystem(endpoint_override=s3_server, allow_bucket_creation=True)
    for bucket in ("data", "secretdata"):
        filesystem.create_dir(bucket)
    return filesystem
