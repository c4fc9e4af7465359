"""The gateway: ``POST /v1/chat/completions`` (OpenAI-style, SSE with ``stream: true``) in front
of the fake model, admitting each request against all of its limits in one QUOTA.MRESERVE.

One request:

1. Authenticate the Bearer API key; find its tenant, team and limits.
2. Size it: ``prompt_tokens + ceil(clamp(max_tokens) * 1.2)`` (``max_tokens`` defaults to
   ``default_max_tokens`` and is clamped to ``1..max_tokens_cap``).
3. ``QUOTA.MRESERVE 6 key team org rpm tpm concurrency  est est est 1 est 1  ID id TTL ttl``:
   all six limits or none. A denial is a 429 with ``Retry-After`` and ``X-RateLimit-*`` of
   the limit that denied (``X-RateLimit-Scope`` names it).
4. Stream the completion, ``QUOTA.MEXTEND`` every ``heartbeat_ms`` while it runs.
5. ``QUOTA.MSETTLE`` the real tokens (``prompt + streamed``; RPM 1; concurrency 0), also when
   the client disconnects mid-stream (then what was streamed) or the model fails.

If Redis is unreachable or slower than ``redis_timeout_ms``, the gateway keeps serving on
local limits (degrade mode, ``X-Quota-Degraded: 1``, counted in ``/metrics``), or with
``GATEWAY_FAIL_OPEN=0`` answers 503.
"""

from __future__ import annotations

import json
import math
import time
import uuid
from collections import Counter, deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import redis.asyncio
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis_quota import (
    AsyncHeartbeat,
    AsyncQuota,
    FailurePolicy,
    KeyOutcome,
    LocalLimiter,
    MultiReservation,
    QuotaReplyError,
    QuotaUnavailableError,
)
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from . import model
from .config import SCOPES, Limits, Settings, Tenants

MODEL_NAME = "fake-gpt"


def error(
    status: int, message: str, type_: str, code: str | None = None, **headers: str
) -> Response:
    body = {"error": {"message": message, "type": type_, "code": code}}
    return JSONResponse(body, status_code=status, headers=headers)


def ceil_s(ms: int) -> int:
    """Seconds for a header, rounded up (a client waiting that long is admitted), at least 1."""
    return max(1, math.ceil(ms / 1000))


def local_limits(tenants: Tenants) -> dict[str, int]:
    """Degrade-mode limits per key: concurrency, RPM and TPM as configured; each budget at
    most the tenant's TPM per minute (spend stays bounded while it cannot be checked)."""
    out: dict[str, int] = {}
    for t in tenants.tenants.values():
        for k in t.keys.values():
            lim = Limits.of(t, k)
            for scope, key, limit in zip(SCOPES, lim.keys, lim.limits, strict=True):
                out[key] = limit if scope in ("rpm", "tpm", "concurrency") else min(limit, t.tpm)
    return out


class Completion:
    """One admitted request: streams, heartbeats, and settles exactly once (``finish``)."""

    def __init__(
        self,
        gw: Gateway,
        rid: str,
        limits: Limits,
        prompt: str,
        prompt_tokens: int,
        max_tokens: int,
    ) -> None:
        self.gw = gw
        self.rid = rid
        self.limits = limits
        self.prompt = prompt
        self.prompt_tokens = prompt_tokens
        self.max_tokens = max_tokens
        self.completion_tokens = 0
        self.finish_reason = "stop"
        self.done = False
        self._hb: AsyncHeartbeat | None = None

    def start_heartbeat(self) -> None:
        s = self.gw.settings
        self._hb = self.gw.quota.heartbeat(
            list(self.limits.keys), self.rid, s.reservation_ttl_ms, s.heartbeat_ms / 1000
        )

    async def tokens(self) -> AsyncIterator[str]:
        """The model's tokens. The caller counts ``completion_tokens`` once a token is
        delivered, so a disconnect settles what the client was sent."""
        s = self.gw.settings
        n = 0
        async for tok in model.generate(self.prompt, self.max_tokens, s.first_token_ms, s.token_ms):
            n += 1
            yield tok
        if n >= self.max_tokens:
            self.finish_reason = "length"

    def usage(self) -> dict[str, int]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
        }

    async def finish(self, outcome: str) -> None:
        """Stops the heartbeat and settles the tokens so far, once, even while cancelled."""
        if self.done:
            return
        self.done = True
        with anyio.CancelScope(shield=True):
            if self._hb is not None:
                await self._hb.stop()
            total = self.prompt_tokens + self.completion_tokens
            settled: list[KeyOutcome] | None = None
            err = None
            try:
                settled = await self.gw.quota.msettle(
                    list(self.limits.keys), self.rid, Limits.settle_actuals(total)
                )
            except Exception as e:  # a settle that fails must not break the response
                err = f"{type(e).__name__}: {e}"
            self.gw.record(self, outcome, settled, err)


class SSEResponse(StreamingResponse):
    """A StreamingResponse that settles the completion however the response ends (a client
    that disconnects before the first byte included: then the body never runs)."""

    def __init__(self, content: AsyncIterator[str], completion: Completion, **kw: Any) -> None:
        super().__init__(content, media_type="text/event-stream", **kw)
        self.completion = completion

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self.completion.finish("disconnected")


class Gateway:
    """The request handlers, the quota client and the counters behind ``/metrics``."""

    def __init__(self, settings: Settings, tenants: Tenants, quota: AsyncQuota) -> None:
        self.settings = settings
        self.tenants = tenants
        self.quota = quota
        self.counters: Counter[str] = Counter()
        self.recent: deque[dict[str, Any]] = deque(maxlen=200)

    def record(
        self, c: Completion, outcome: str, settled: list[KeyOutcome] | None, err: str | None
    ) -> None:
        self.counters[f"requests_{outcome}"] += 1
        self.counters["tokens_settled"] += c.prompt_tokens + c.completion_tokens
        if err is not None:
            self.counters["settle_errors"] += 1
        self.recent.append(
            {
                "id": c.rid,
                "outcome": outcome,
                "prompt_tokens": c.prompt_tokens,
                "completion_tokens": c.completion_tokens,
                "settle": None if settled is None else [o.status for o in settled],
                "degraded": bool(settled and settled[0].degraded),
                "settle_error": err,
            }
        )

    # --- routes ----------------------------------------------------------------------------

    async def health(self, request: Request) -> Response:
        return JSONResponse({"ok": True, "quota_degraded": self.quota.stats.degraded})

    async def metrics(self, request: Request) -> Response:
        return JSONResponse(
            {
                "gateway": dict(self.counters),
                "quota": self.quota.stats.snapshot(),
                "recent": list(self.recent),
            }
        )

    async def chat(self, request: Request) -> Response:
        self.counters["requests"] += 1
        auth = request.headers.get("authorization", "")
        found = self.tenants.by_secret.get(auth.removeprefix("Bearer ").strip())
        if found is None:
            return error(401, "Invalid API key.", "invalid_request_error", "invalid_api_key")
        tenant, key = found
        try:
            body = await request.json()
            messages = body["messages"]
            if not isinstance(messages, list) or not messages:
                raise ValueError("messages must be a non-empty list")
            prompt = model.prompt_text(messages)
            asked = body.get("max_tokens", body.get("max_completion_tokens"))
            if asked is not None and (not isinstance(asked, int) or asked < 1):
                raise ValueError("max_tokens must be a positive integer")
            stream = bool(body.get("stream", False))
        except (ValueError, KeyError, TypeError, json.JSONDecodeError) as e:
            return error(400, f"Bad request: {e}", "invalid_request_error")
        s = self.settings
        max_tokens = min(
            max(asked if asked is not None else s.default_max_tokens, 1), s.max_tokens_cap
        )
        prompt_tokens = model.count_tokens(prompt, len(messages))
        estimate = prompt_tokens + math.ceil(max_tokens * s.estimate_factor)
        limits = Limits.of(tenant, key)
        rid = f"chatcmpl-{uuid.uuid4().hex}"
        try:
            res = await self.quota.mreserve(
                limits.keys, Limits.reserve_amounts(estimate), id=rid, ttl_ms=s.reservation_ttl_ms
            )
        except QuotaUnavailableError:
            self.counters["unavailable"] += 1
            return error(
                503, "Quota store unavailable.", "server_error", None, **{"Retry-After": "1"}
            )
        except QuotaReplyError as e:
            self.counters["quota_errors"] += 1
            return error(500, f"Quota misconfigured for this tenant: {e}", "server_error")
        if not res.granted:
            return self.denied(res, limits)
        self.counters["admitted"] += 1
        headers = self.admitted_headers(res, limits)
        c = Completion(self, rid, limits, prompt, prompt_tokens, max_tokens)
        if stream:
            return SSEResponse(self.sse(c), c, headers=headers)
        return await self.whole(c, headers)

    # --- replies ---------------------------------------------------------------------------

    def admitted_headers(self, res: MultiReservation, limits: Limits) -> dict[str, str]:
        rpm, tpm = SCOPES.index("rpm"), SCOPES.index("tpm")
        h = {
            "X-Request-Id": res.id or "",
            "X-RateLimit-Limit": str(limits.limits[rpm]),
            "X-RateLimit-Remaining": str(max(0, res.values[rpm])),
            "X-RateLimit-Limit-Requests": str(limits.limits[rpm]),
            "X-RateLimit-Remaining-Requests": str(max(0, res.values[rpm])),
            "X-RateLimit-Limit-Tokens": str(limits.limits[tpm]),
            "X-RateLimit-Remaining-Tokens": str(max(0, res.values[tpm])),
        }
        if res.degraded:
            h["X-Quota-Degraded"] = "1"
        return h

    def denied(self, res: MultiReservation, limits: Limits) -> Response:
        i = res.denied_index if 0 <= res.denied_index < len(SCOPES) else 0
        scope = SCOPES[i]
        self.counters[f"denied_{scope}"] += 1
        h = {
            "X-RateLimit-Scope": scope,
            "X-RateLimit-Limit": str(limits.limits[i]),
            "X-RateLimit-Remaining": str(max(0, res.values[i]) if i < len(res.values) else 0),
        }
        if res.degraded:
            h["X-Quota-Degraded"] = "1"
        retry_ms = res.retry_after_ms
        if scope in ("rpm", "tpm") and retry_ms < 0:
            # more than the window can ever admit: waiting does not help
            msg = f"Request needs more than the {scope.upper()} limit {limits.limits[i]}."
            return error(413, msg, "invalid_request_error", "request_too_large", **h)
        if scope == "concurrency":
            # a slot frees when a request ends (the module says -1: no period; degrade mode's
            # local window end would say too much)
            retry_ms = self.settings.busy_retry_after_s * 1000
        if retry_ms >= 0:
            h["Retry-After"] = h["X-RateLimit-Reset"] = str(ceil_s(retry_ms))
            rate = scope in ("rpm", "tpm", "concurrency")
            code = "rate_limit_exceeded" if rate else "budget_exceeded"
            type_ = "requests" if scope in ("rpm", "concurrency") else "tokens"
            return error(429, f"Rate limit reached ({scope}). Retry later.", type_, code, **h)
        # a budget without a period that cannot fit: no time to wait for
        return error(
            429, f"Quota exhausted ({scope}).", "insufficient_quota", "insufficient_quota", **h
        )

    def chunk(self, c: Completion, delta: dict[str, str], finish: str | None) -> str:
        body = {
            "id": c.rid,
            "object": "chat.completion.chunk",
            "created": int(time.time()),
            "model": MODEL_NAME,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        }
        return f"data: {json.dumps(body)}\n\n"

    async def sse(self, c: Completion) -> AsyncIterator[str]:
        c.start_heartbeat()
        outcome = "disconnected"
        try:
            yield self.chunk(c, {"role": "assistant", "content": ""}, None)
            async for tok in c.tokens():
                yield self.chunk(c, {"content": tok}, None)
                # resumed: Starlette sent the chunk and asks for the next one
                c.completion_tokens += 1
            yield self.chunk(c, {}, c.finish_reason)
            last = {
                "id": c.rid,
                "object": "chat.completion.chunk",
                "created": int(time.time()),
                "model": MODEL_NAME,
                "choices": [],
                "usage": c.usage(),
            }
            yield f"data: {json.dumps(last)}\n\n"
            yield "data: [DONE]\n\n"
            outcome = "completed"
        except Exception:
            outcome = "error"
            raise
        finally:
            await c.finish(outcome)

    async def whole(self, c: Completion, headers: dict[str, str]) -> Response:
        c.start_heartbeat()
        outcome = "disconnected"
        try:
            parts = []
            async for tok in c.tokens():
                parts.append(tok)
                c.completion_tokens += 1
            text = "".join(parts)
            outcome = "completed"
        except Exception:
            outcome = "error"
            raise
        finally:
            await c.finish(outcome)
        body = {
            "id": c.rid,
            "object": "chat.completion",
            "created": int(time.time()),
            "model": MODEL_NAME,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": text},
                    "finish_reason": c.finish_reason,
                }
            ],
            "usage": c.usage(),
        }
        return JSONResponse(body, headers=headers)


def create_app(settings: Settings | None = None, tenants: Tenants | None = None) -> Starlette:
    """The ASGI app (``uvicorn quota_gateway.app:create_app --factory``)."""
    s = settings or Settings.from_env()
    t = tenants or Tenants.load(s.config_path)
    timeout_s = s.redis_timeout_ms / 1000
    client = redis.asyncio.Redis.from_url(
        s.redis_url,
        socket_timeout=timeout_s,
        socket_connect_timeout=timeout_s,
        retry=Retry(NoBackoff(), 1),  # one quick retry (a stale pooled connection), no backoff
    )
    limiter = LocalLimiter(
        local_limits(t), default_limit=0, window_s=60, default_ttl_s=s.reservation_ttl_ms / 1000
    )
    policy = (
        FailurePolicy.open(limiter, timeout_s=timeout_s)
        if s.fail_open
        else FailurePolicy.closed(timeout_s=timeout_s)
    )
    gw = Gateway(s, t, AsyncQuota(client, policy))

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        yield
        await client.aclose()

    routes = [
        Route("/v1/chat/completions", gw.chat, methods=["POST"]),
        Route("/healthz", gw.health),
        Route("/metrics", gw.metrics),
    ]
    app = Starlette(routes=routes, lifespan=lifespan)
    app.state.gateway = gw
    return app
