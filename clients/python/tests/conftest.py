"""Fixtures: a real redis-server with the module (free port, temp dir), flushed per test."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from redis_quota import Quota
from redis_quota.testing import RedisServer, find_module


@pytest.fixture(scope="session")
def module_path() -> Path:
    return find_module(Path(__file__).parent)


@pytest.fixture(scope="session")
def server(module_path: Path) -> Iterator[RedisServer]:
    with RedisServer(module_path) as s:
        yield s


@pytest.fixture
def r(server: RedisServer) -> Iterator[redis.Redis]:
    client = redis.Redis(port=server.port, decode_responses=True)
    client.flushall()
    client.config_set("quota.max-pending", 100000)
    yield client
    client.close()


@pytest.fixture
def q(r: redis.Redis) -> Quota:
    return Quota(r)


@pytest.fixture
def own_server(module_path: Path) -> Iterator[RedisServer]:
    """A server of the test's own, which the test may stop and start."""
    s = RedisServer(module_path).start()
    yield s
    s.close()
