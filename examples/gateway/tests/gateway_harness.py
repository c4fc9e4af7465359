"""Test harness: the test tenants and settings, uvicorn serving the gateway in a thread."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import uvicorn
from redis_quota.testing import free_port

from quota_gateway.app import Gateway, create_app
from quota_gateway.config import Settings, Tenants

BIG = 10**9


def tenant(
    name: str,
    *,
    rpm: int = 10_000,
    tpm: int = BIG,
    concurrency: int = 100,
    key: int = BIG,
    team: int = BIG,
    org: int = BIG,
) -> dict[str, Any]:
    """A tenant with one team ``eng`` and one API key ``sk-<name>`` (daily budget ``key``)."""
    return {
        "tz": "UTC",
        "org": {"limit": org, "period": "MONTH"},
        "rpm": rpm,
        "tpm": tpm,
        "concurrency": concurrency,
        "teams": {"eng": {"limit": team, "period": "MONTH"}},
        "keys": {f"sk-{name}": {"id": "k1", "team": "eng", "limit": key, "period": "DAY"}},
    }


def config() -> Tenants:
    """One tenant per kind of limit; the others generous."""
    return Tenants.parse(
        {
            "tenants": {
                "ok": tenant("ok"),
                "rpm": tenant("rpm", rpm=2),
                "tpm": tenant("tpm", tpm=1000),
                "conc": tenant("conc", concurrency=1),
                "keyb": tenant("keyb", key=1000),
                "teamb": tenant("teamb", team=1000),
                "orgb": tenant("orgb", org=1000),
            }
        }
    )


TEST_SETTINGS = Settings(
    default_max_tokens=64,
    first_token_ms=20,
    token_ms=5,
    reservation_ttl_ms=1500,  # 15 heartbeats: a loaded machine may delay a few
    heartbeat_ms=100,
    redis_timeout_ms=2000,  # lenient: a loaded CI machine must not look like a Redis outage
)


class RunningGateway:
    """uvicorn serving the gateway app on a free port in a thread."""

    def __init__(self, settings: Settings, tenants: Tenants) -> None:
        self.port = free_port()
        self.app = create_app(settings, tenants)
        cfg = uvicorn.Config(self.app, host="127.0.0.1", port=self.port, log_level="warning")
        self.server = uvicorn.Server(cfg)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def gateway(self) -> Gateway:
        gw: Gateway = self.app.state.gateway
        return gw

    def start(self) -> RunningGateway:
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("gateway did not start")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


def wait_until(cond: Callable[[], bool], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.01)
    raise AssertionError("condition not reached in time")
