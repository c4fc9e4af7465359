"""The gateway end to end: real redis-server with the module, real uvicorn, real HTTP client."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import httpx
import pytest
import redis
from gateway_harness import TEST_SETTINGS, RunningGateway, wait_until
from redis_quota import Quota
from redis_quota.testing import RedisServer

from quota_gateway.config import Tenants
from quota_gateway.model import count_tokens
from quota_gateway.provision import provision

MAX_TOKENS = 64  # TEST_SETTINGS.default_max_tokens


def prompt(tokens: int) -> str:
    return f"[[tokens={tokens}]] tell me about quotas"


def prompt_tokens(tokens: int) -> int:
    return count_tokens(prompt(tokens), 1)


def body(tokens: int, max_tokens: int | None = None, stream: bool = False) -> dict[str, Any]:
    b: dict[str, Any] = {
        "model": "fake-gpt",
        "messages": [{"role": "user", "content": prompt(tokens)}],
        "stream": stream,
    }
    if max_tokens is not None:
        b["max_tokens"] = max_tokens
    return b


def auth(tenant: str) -> dict[str, str]:
    return {"Authorization": f"Bearer sk-{tenant}"}


def keys(tenant: str) -> dict[str, str]:
    p = f"quota:{{{tenant}}}"
    return {
        "key": f"{p}:key:k1:day",
        "team": f"{p}:team:eng:month",
        "org": f"{p}:org:month",
        "rpm": f"{p}:rpm",
        "tpm": f"{p}:tpm",
        "concurrency": f"{p}:concurrency",
    }


def info(r: redis.Redis, key: str) -> dict[str, Any]:
    send: Any = r.execute_command
    raw = send("QUOTA.INFO", key)
    assert raw is not None, key
    return {raw[i]: raw[i + 1] for i in range(0, len(raw), 2)}


def used(r: redis.Redis, tenant: str) -> dict[str, int]:
    """What each limit of the tenant has taken: budgets' used, windows' counted."""
    out = {}
    for scope, key in keys(tenant).items():
        i = info(r, key)
        out[scope] = i["counted"] if scope in ("rpm", "tpm") else i["used"]
    return out


def reserved(r: redis.Redis, tenant: str) -> int:
    return sum(info(r, k)["reserved"] for s, k in keys(tenant).items() if s not in ("rpm", "tpm"))


def events(lines: Iterator[str]) -> Iterator[dict[str, Any]]:
    for line in lines:
        if line.startswith("data: ") and line != "data: [DONE]":
            yield json.loads(line.removeprefix("data: "))


def recent(gw: RunningGateway, rid: str) -> dict[str, Any] | None:
    for entry in gw.gateway.recent:
        if entry["id"] == rid:
            return entry
    return None


def settled(r: redis.Redis, tenant: str) -> None:
    """Waits until nothing of the tenant is reserved (the settle ran)."""
    wait_until(lambda: reserved(r, tenant) == 0)


# --- admitted ---------------------------------------------------------------------------------


def test_stream_admitted_settles_exactly(http: httpx.Client, r: redis.Redis) -> None:
    contents: list[str] = []
    usage = None
    with http.stream(
        "POST", "/v1/chat/completions", json=body(20, 50, True), headers=auth("ok")
    ) as resp:
        assert resp.status_code == 200
        assert resp.headers["content-type"].startswith("text/event-stream")
        assert resp.headers["X-RateLimit-Limit"] == "10000"
        assert resp.headers["X-RateLimit-Remaining"] == "9999"
        assert "X-Quota-Degraded" not in resp.headers
        for ev in events(resp.iter_lines()):
            if ev.get("usage"):
                usage = ev["usage"]
            for ch in ev["choices"]:
                if ch["delta"].get("content"):
                    contents.append(ch["delta"]["content"])
    assert len(contents) == 20
    p = prompt_tokens(20)
    assert usage == {"prompt_tokens": p, "completion_tokens": 20, "total_tokens": p + 20}
    settled(r, "ok")
    total = p + 20
    assert used(r, "ok") == {
        "key": total,
        "team": total,
        "org": total,
        "rpm": 1,
        "tpm": total,  # the TPM window was corrected from the estimate to the real tokens
        "concurrency": 0,
    }
    conc = info(r, keys("ok")["concurrency"])
    assert conc["reserved"] == 0 and conc["pending"] == 0


def test_non_stream_admitted_settles_exactly(http: httpx.Client, r: redis.Redis) -> None:
    resp = http.post("/v1/chat/completions", json=body(7), headers=auth("ok"))
    assert resp.status_code == 200
    data = resp.json()
    assert data["usage"]["completion_tokens"] == 7
    assert len(data["choices"][0]["message"]["content"].split()) == 7
    settled(r, "ok")
    assert used(r, "ok")["org"] == prompt_tokens(7) + 7


def test_reservation_sizing_while_in_flight(http: httpx.Client, r: redis.Redis) -> None:
    """prompt + ceil(clamp(max_tokens) * 1.2) is held while the request runs; the default
    max_tokens applies when absent, and max_tokens is clamped to the cap."""
    for max_tokens, expected in ((100, 120), (None, math.ceil(MAX_TOKENS * 1.2)), (10**6, None)):
        with http.stream(
            "POST", "/v1/chat/completions", json=body(50, max_tokens, True), headers=auth("ok")
        ) as resp:
            lines = resp.iter_lines()
            next(events(lines))  # admitted, streaming
            held = info(r, keys("ok")["key"])["reserved"]
            cap = TEST_SETTINGS.max_tokens_cap
            want = expected if expected is not None else math.ceil(cap * 1.2)
            assert held == prompt_tokens(50) + want
            for _ in lines:
                pass
        settled(r, "ok")


# --- denials ----------------------------------------------------------------------------------


def assert_429(resp: httpx.Response, scope: str, limit: int) -> int:
    assert resp.status_code == 429, resp.text
    h = resp.headers
    assert h["X-RateLimit-Scope"] == scope
    assert h["X-RateLimit-Limit"] == str(limit)
    assert int(h["X-RateLimit-Remaining"]) >= 0
    retry = int(h["Retry-After"])
    assert retry >= 1 and int(h["X-RateLimit-Reset"]) == retry
    return retry


def test_429_rpm_consumes_nothing(http: httpx.Client, r: redis.Redis) -> None:
    for _ in range(2):
        assert (
            http.post("/v1/chat/completions", json=body(3), headers=auth("rpm")).status_code == 200
        )
    settled(r, "rpm")
    before = used(r, "rpm")
    resp = http.post("/v1/chat/completions", json=body(3), headers=auth("rpm"))
    retry = assert_429(resp, "rpm", 2)
    # 1 s buckets: at most the window plus one bucket
    assert retry <= 61 and resp.headers["X-RateLimit-Remaining"] == "0"
    assert resp.json()["error"]["code"] == "rate_limit_exceeded"
    assert used(r, "rpm") == before and reserved(r, "rpm") == 0  # all or nothing


def test_429_tpm_and_413_when_it_can_never_fit(http: httpx.Client, r: redis.Redis) -> None:
    ok = http.post("/v1/chat/completions", json=body(200, 200), headers=auth("tpm"))
    assert ok.status_code == 200
    settled(r, "tpm")
    assert used(r, "tpm")["tpm"] == prompt_tokens(200) + 200
    before = used(r, "tpm")
    # 13 + ceil(700 * 1.2) = 853 tokens do not fit in the 787 left this minute
    resp = http.post("/v1/chat/completions", json=body(1, 700), headers=auth("tpm"))
    assert_429(resp, "tpm", 1000)
    assert used(r, "tpm") == before
    huge = http.post("/v1/chat/completions", json=body(1, 1000), headers=auth("tpm"))
    assert huge.status_code == 413 and "Retry-After" not in huge.headers
    assert huge.headers["X-RateLimit-Scope"] == "tpm"


@pytest.mark.parametrize("scope", ["key", "team", "org"])
def test_429_budgets(http: httpx.Client, r: redis.Redis, scope: str) -> None:
    tenant = {"key": "keyb", "team": "teamb", "org": "orgb"}[scope]
    ok = http.post("/v1/chat/completions", json=body(150, 150), headers=auth(tenant))
    assert ok.status_code == 200
    settled(r, tenant)
    before = used(r, tenant)
    assert before[scope] == prompt_tokens(150) + 150
    # 13 + ceil(700 * 1.2) = 853 tokens do not fit in the 837 left, but would in a new period
    resp = http.post("/v1/chat/completions", json=body(1, 700), headers=auth(tenant))
    retry = assert_429(resp, scope, 1000)
    # the budget's period ends at the next midnight (key: DAY) or 1st of the month (UTC)
    horizon = 86_400 if scope == "key" else 31 * 86_400
    assert retry <= horizon
    assert int(resp.headers["X-RateLimit-Remaining"]) == 1000 - before[scope]
    assert resp.json()["error"]["code"] == "budget_exceeded"
    assert used(r, tenant) == before and reserved(r, tenant) == 0


def test_429_concurrency_and_release(
    http: httpx.Client, r: redis.Redis, gateway: RunningGateway
) -> None:
    with http.stream(
        "POST", "/v1/chat/completions", json=body(200, 200, True), headers=auth("conc")
    ) as first:
        lines = first.iter_lines()
        next(events(lines))
        with httpx.Client(base_url=gateway.url, timeout=30) as other:
            resp = other.post("/v1/chat/completions", json=body(3), headers=auth("conc"))
        assert_429(resp, "concurrency", 1)
        assert resp.headers["Retry-After"] == "1"
        for _ in lines:
            pass
    settled(r, "conc")
    assert info(r, keys("conc")["concurrency"])["used"] == 0  # a slot is never charged
    again = http.post("/v1/chat/completions", json=body(3), headers=auth("conc"))
    assert again.status_code == 200


# --- streams: disconnects and heartbeats ------------------------------------------------------


def test_disconnect_mid_stream_settles_what_was_streamed(
    http: httpx.Client, r: redis.Redis, gateway: RunningGateway
) -> None:
    got = 0
    with http.stream(
        "POST", "/v1/chat/completions", json=body(1000, 1000, True), headers=auth("ok")
    ) as resp:
        rid = resp.headers["X-Request-Id"]
        for ev in events(resp.iter_lines()):
            if any(ch["delta"].get("content") for ch in ev["choices"]):
                got += 1
            if got == 10:
                break  # the client goes away mid-stream
    wait_until(lambda: recent(gateway, rid) is not None)
    entry = recent(gateway, rid)
    assert entry is not None and entry["outcome"] == "disconnected"
    streamed = entry["completion_tokens"]
    assert 10 <= streamed < 1000
    assert entry["settle"] == ["settled", "settled", "settled", "corrected", "corrected", "settled"]
    total = prompt_tokens(1000) + streamed
    assert used(r, "ok") == {
        "key": total,
        "team": total,
        "org": total,
        "rpm": 1,
        "tpm": total,
        "concurrency": 0,
    }
    assert reserved(r, "ok") == 0  # the concurrency slot is released


def test_heartbeat_keeps_a_long_stream_reserved(
    http: httpx.Client, r: redis.Redis, gateway: RunningGateway
) -> None:
    ttl_s = TEST_SETTINGS.reservation_ttl_ms / 1000
    start = time.monotonic()
    checked = False
    with http.stream(
        "POST", "/v1/chat/completions", json=body(600, 600, True), headers=auth("ok")
    ) as resp:
        rid = resp.headers["X-Request-Id"]
        for _ in resp.iter_lines():
            if not checked and time.monotonic() - start > 1.5 * ttl_s:
                # long past the reservation's TTL: still held thanks to MEXTEND
                assert info(r, keys("ok")["concurrency"])["reserved"] == 1
                assert info(r, keys("ok")["key"])["reserved"] > 0
                checked = True
    assert checked, "the stream ended before 1.5 TTLs: make it longer"
    wait_until(lambda: recent(gateway, rid) is not None)
    entry = recent(gateway, rid)
    assert entry is not None and entry["outcome"] == "completed"
    # settled on time (not "late"): the reservation never expired
    assert entry["settle"] == ["settled", "settled", "settled", "corrected", "corrected", "settled"]


# --- bad requests -----------------------------------------------------------------------------


def test_bad_requests(http: httpx.Client, r: redis.Redis) -> None:
    assert (
        http.post("/v1/chat/completions", json=body(1), headers=auth("nobody")).status_code == 401
    )
    bad = http.post("/v1/chat/completions", json={"messages": "x"}, headers=auth("ok"))
    assert bad.status_code == 400
    neg = http.post("/v1/chat/completions", json=body(1, 0), headers=auth("ok"))
    assert neg.status_code == 400
    assert used(r, "ok")["rpm"] == 0


def test_provision_is_idempotent(r: redis.Redis, tenants: Tenants) -> None:
    q = Quota(r)
    written = provision(q, tenants)
    snapshot = {k: info(r, k) for k in written}
    provision(q, tenants)
    assert {k: info(r, k) for k in written} == snapshot
    rpm = info(r, keys("rpm")["rpm"])
    assert (rpm["limit"], rpm["window_ms"]) == (2, 60_000)
    assert info(r, keys("keyb")["key"])["period"] == "DAY"


# --- degrade mode -----------------------------------------------------------------------------


@pytest.fixture
def fragile(module_path: Any, tenants: Tenants) -> Iterator[tuple[RedisServer, RunningGateway]]:
    """A Redis of its own (to stop) and a gateway that fails open on it."""
    srv = RedisServer(module_path).start()
    client = redis.Redis(port=srv.port)
    provision(Quota(client), tenants)
    client.close()
    gw = RunningGateway(replace(TEST_SETTINGS, redis_url=srv.url), tenants).start()
    yield srv, gw
    gw.stop()
    srv.close()


def test_degrade_mode_when_redis_is_stopped(
    fragile: tuple[RedisServer, RunningGateway], tenants: Tenants
) -> None:
    srv, gw = fragile
    with httpx.Client(base_url=gw.url, timeout=30) as http:
        assert (
            "X-Quota-Degraded"
            not in http.post("/v1/chat/completions", json=body(3), headers=auth("ok")).headers
        )
        srv.stop()
        resp = http.post("/v1/chat/completions", json=body(5), headers=auth("ok"))
        assert resp.status_code == 200 and resp.headers["X-Quota-Degraded"] == "1"
        assert resp.json()["usage"]["completion_tokens"] == 5
        # local limits still hold: one request in flight for tenant "conc"
        with http.stream(
            "POST", "/v1/chat/completions", json=body(200, 200, True), headers=auth("conc")
        ) as first:
            assert first.headers["X-Quota-Degraded"] == "1"
            lines = first.iter_lines()
            next(events(lines))
            with httpx.Client(base_url=gw.url, timeout=30) as other:
                busy = other.post("/v1/chat/completions", json=body(3), headers=auth("conc"))
            assert busy.status_code == 429 and busy.headers["X-Quota-Degraded"] == "1"
            assert busy.headers["X-RateLimit-Scope"] == "concurrency"
            assert busy.headers["Retry-After"] == "1"
            for _ in lines:
                pass
        m = http.get("/metrics").json()
        assert m["quota"]["degraded"] is True and m["quota"]["failures"] >= 3
        assert m["quota"]["degraded_grants"] >= 2 and m["quota"]["degraded_denials"] >= 1
        assert http.get("/healthz").json() == {"ok": True, "quota_degraded": True}
        # Redis is back (empty: provision again): no longer degraded
        srv.start()
        client = redis.Redis(port=srv.port)
        provision(Quota(client), tenants)
        client.close()
        back = http.post("/v1/chat/completions", json=body(3), headers=auth("ok"))
        assert back.status_code == 200 and "X-Quota-Degraded" not in back.headers
        assert http.get("/metrics").json()["quota"]["degraded"] is False


def test_fail_closed_gateway_answers_503(module_path: Any, tenants: Tenants) -> None:
    srv = RedisServer(module_path).start()
    gw = RunningGateway(replace(TEST_SETTINGS, redis_url=srv.url, fail_open=False), tenants)
    gw.start()
    try:
        srv.stop()
        with httpx.Client(base_url=gw.url, timeout=30) as http:
            resp = http.post("/v1/chat/completions", json=body(3), headers=auth("ok"))
            assert resp.status_code == 503 and resp.headers["Retry-After"] == "1"
            assert http.get("/metrics").json()["quota"]["fail_closed"] == 1
    finally:
        gw.stop()
        srv.close()
