"""Shared fixtures: the local service on a free loopback port, and a clean environment."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time

import pytest

from batchsum.local import Faults, LocalService

KEY = "test-key-premium-0123456789"
BASIC_KEY = "test-key-basic-0123456789"
EXPIRED_KEY = "test-key-expired-0123456789"


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
    """One local service for the session, no rate limit; tests reset its faults and counts."""
    with LocalService([KEY, f"{BASIC_KEY}:basic", f"{EXPIRED_KEY}:expired"]) as running:
        yield running


@pytest.fixture
def svc(service: LocalService) -> LocalService:
    service.state.reset_stats()
    service.faults = Faults()
    service.state.rpm = 0
    yield service
    service.faults = Faults()


@pytest.fixture
def env(svc: LocalService, monkeypatch: pytest.MonkeyPatch) -> LocalService:
    """The session's service, with its key and address in the environment (as a CLI user sets them)."""
    monkeypatch.setenv("BATCHSUM_API_KEY", KEY)
    monkeypatch.setenv("BATCHSUM_BASE_URL", svc.url)
    return svc


def article(words: int, seed: int = 0) -> str:
    """A text of exactly ``words`` words in sentences of about twelve."""
    vocabulary = (
        "river council budget school market station harbour bridge museum garden library festival "
        "factory railway hospital stadium theatre college village airport"
    ).split()
    out = []
    for i in range(words):
        word = vocabulary[(i * 7 + seed * 13 + i // 12) % len(vocabulary)]
        out.append(word.capitalize() if i % 12 == 0 else word)
        if i == 0:
            out[0] = f"Case{seed}"  # every seed its own text
        if i % 12 == 11 or i == words - 1:
            out[-1] += "."
    return " ".join(out)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def need(what: str, install: str) -> None:
    """Skip for want of a real server, with what to install; CI sets BATCHSUM_TEST_SERVERS=required
    (read before ``clean_environ``) so that a missing server fails there instead of hiding."""
    message = f"needs {what}: {install}"
    if _SERVERS_REQUIRED:
        pytest.fail(message)
    pytest.skip(message)


_SERVERS_REQUIRED = os.environ.get("BATCHSUM_TEST_SERVERS") == "required"


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory: pytest.TempPathFactory):
    """A real redis-server (Debian's package) on a free loopback port, for the session."""
    exe = shutil.which("redis-server")
    if exe is None:
        need("a real redis-server", "apt-get install redis-server (Debian's package)")
    redis = pytest.importorskip("redis")
    port = free_port()
    folder = tmp_path_factory.mktemp("redis")
    process = subprocess.Popen(
        [exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", str(folder)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"redis://127.0.0.1:{port}/0"
    try:
        deadline = time.monotonic() + 15
        while True:
            try:
                redis.Redis.from_url(url).ping()
                break
            except redis.ConnectionError:
                if time.monotonic() > deadline or process.poll() is not None:
                    raise RuntimeError("redis-server did not start") from None
                time.sleep(0.05)
        yield url
    finally:
        process.terminate()
        process.wait(10)


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


def budget_ledger(budget: str, key: str, base_url: str):
    """``key``'s ledger on ``budget``: every process's starts of the last two minutes, by the tick."""
    import asyncio

    from batchsum import Client
    from batchsum.pacing.budget import open_budget

    with Client(api_key=key, base_url=base_url) as client:
        identity = client.identity

    async def read():
        opened = open_budget(budget, identity)
        try:
            return await opened.ledger(120)
        finally:
            await opened.aclose()

    return asyncio.run(read())


def ticks_before(now: float, seconds: float) -> list[float]:
    """Each tenth of a second in the ``seconds`` before ``now``: where a window may begin."""
    return [now - seconds + i / 10 for i in range(int(seconds * 10))]


def merged_report(path, parts: int, seconds: float = 60.0) -> dict:
    """The merged report of a shared job at ``path`` once it holds ``parts`` parts (each part is
    written beside it before it is merged in: a part on disk is not yet in the merged file)."""
    import json

    deadline = time.monotonic() + seconds  # a guard against a hang, not a timing
    while True:
        try:
            merged = json.loads(open(path, encoding="utf-8").read())
        except (OSError, ValueError):
            merged = {}
        if merged.get("partitions") == parts:
            return merged
        assert time.monotonic() < deadline, f"the merged report never held {parts} parts: {merged.get('partitions')}"
        time.sleep(0.05)
