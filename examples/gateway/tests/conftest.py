"""Fixtures: a real redis-server with the module, the real gateway under uvicorn on a free
port (in a thread), and httpx as the HTTP client."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import httpx
import pytest
import redis
from gateway_harness import TEST_SETTINGS, RunningGateway, config
from redis_quota import Quota
from redis_quota.testing import RedisServer, find_module

from quota_gateway.config import Tenants
from quota_gateway.provision import provision


@pytest.fixture(scope="session")
def module_path() -> Path:
    return find_module(Path(__file__).parent)


@pytest.fixture(scope="session")
def tenants() -> Tenants:
    return config()


@pytest.fixture(scope="session")
def server(module_path: Path) -> Iterator[RedisServer]:
    with RedisServer(module_path) as s:
        yield s


@pytest.fixture
def r(server: RedisServer, tenants: Tenants) -> Iterator[redis.Redis]:
    """A client of the test server, flushed and provisioned for this test."""
    client = redis.Redis(port=server.port, decode_responses=True)
    client.flushall()
    provision(Quota(client), tenants)
    yield client
    client.close()


@pytest.fixture(scope="session")
def gateway(server: RedisServer, tenants: Tenants) -> Iterator[RunningGateway]:
    gw = RunningGateway(replace(TEST_SETTINGS, redis_url=server.url), tenants).start()
    yield gw
    gw.stop()


@pytest.fixture
def http(gateway: RunningGateway, r: redis.Redis) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=gateway.url, timeout=30) as c:
        yield c
