"""Tenants (API keys, teams, org budgets, RPM, TPM, concurrency), their Redis keys, and the
gateway's settings (from the environment)."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Budget:
    """A token budget: ``limit`` per ``period`` (``NONE``, ``DAY``, ``MONTH``, ...)."""

    limit: int
    period: str = "MONTH"


@dataclass(frozen=True)
class ApiKey:
    """An API key: its secret (the Bearer token), short id, team and daily budget."""

    secret: str
    id: str
    team: str
    budget: Budget


@dataclass(frozen=True)
class Tenant:
    """One customer (the org). Every key of a tenant carries its ``{name}`` hash tag, so all
    the limits of one request live in one cluster slot and one QUOTA.MRESERVE checks them."""

    name: str
    tz: str
    org: Budget
    rpm: int
    tpm: int
    concurrency: int
    teams: dict[str, Budget]
    keys: dict[str, ApiKey]

    def prefix(self) -> str:
        return f"quota:{{{self.name}}}"

    def org_key(self) -> str:
        return f"{self.prefix()}:org:{self.org.period.lower()}"

    def team_key(self, team: str) -> str:
        return f"{self.prefix()}:team:{team}:{self.teams[team].period.lower()}"

    def api_key_key(self, key: ApiKey) -> str:
        return f"{self.prefix()}:key:{key.id}:{key.budget.period.lower()}"

    def rpm_key(self) -> str:
        return f"{self.prefix()}:rpm"

    def tpm_key(self) -> str:
        return f"{self.prefix()}:tpm"

    def concurrency_key(self) -> str:
        return f"{self.prefix()}:concurrency"


# The order of the limits in every MRESERVE / MSETTLE of a request (see Limits.keys).
SCOPES = ("key", "team", "org", "rpm", "tpm", "concurrency")


@dataclass(frozen=True)
class Limits:
    """The six limits of one request, in ``SCOPES`` order, with their configured limits."""

    keys: tuple[str, ...]
    limits: tuple[int, ...]

    @staticmethod
    def of(tenant: Tenant, key: ApiKey) -> Limits:
        return Limits(
            (
                tenant.api_key_key(key),
                tenant.team_key(key.team),
                tenant.org_key(),
                tenant.rpm_key(),
                tenant.tpm_key(),
                tenant.concurrency_key(),
            ),
            (
                key.budget.limit,
                tenant.teams[key.team].limit,
                tenant.org.limit,
                tenant.rpm,
                tenant.tpm,
                tenant.concurrency,
            ),
        )

    @staticmethod
    def reserve_amounts(estimate: int) -> list[int]:
        """Budgets and TPM take the estimate, RPM one request, concurrency one slot."""
        return [estimate, estimate, estimate, 1, estimate, 1]

    @staticmethod
    def settle_actuals(tokens: int) -> list[int]:
        """The real tokens; the request still counts once; the concurrency slot settles 0."""
        return [tokens, tokens, tokens, 1, tokens, 0]


@dataclass(frozen=True)
class Tenants:
    """Every tenant, and the API key index."""

    tenants: dict[str, Tenant]
    by_secret: dict[str, tuple[Tenant, ApiKey]] = field(default_factory=dict)

    @staticmethod
    def parse(data: dict[str, Any]) -> Tenants:
        tenants: dict[str, Tenant] = {}
        by_secret: dict[str, tuple[Tenant, ApiKey]] = {}
        for name, t in data["tenants"].items():
            if "{" in name or "}" in name:
                raise ValueError(f"tenant name {name!r}: no braces (it is the hash tag)")
            teams = {
                n: Budget(int(b["limit"]), str(b.get("period", "MONTH")))
                for n, b in t.get("teams", {}).items()
            }
            keys: dict[str, ApiKey] = {}
            for secret, k in t["keys"].items():
                team = str(k["team"])
                if team not in teams:
                    raise ValueError(f"key {k['id']!r} of {name!r}: unknown team {team!r}")
                keys[secret] = ApiKey(
                    secret, str(k["id"]), team, Budget(int(k["limit"]), str(k.get("period", "DAY")))
                )
            org = t["org"]
            tenant = Tenant(
                name=name,
                tz=str(t.get("tz", "UTC")),
                org=Budget(int(org["limit"]), str(org.get("period", "MONTH"))),
                rpm=int(t["rpm"]),
                tpm=int(t["tpm"]),
                concurrency=int(t["concurrency"]),
                teams=teams,
                keys=keys,
            )
            tenants[name] = tenant
            for secret, key in keys.items():
                if secret in by_secret:
                    raise ValueError(f"API key secret used twice: {key.id!r}")
                by_secret[secret] = (tenant, key)
        return Tenants(tenants, by_secret)

    @staticmethod
    def load(path: str | Path) -> Tenants:
        return Tenants.parse(json.loads(Path(path).read_text()))


def _env_int(name: str, default: int) -> int:
    return int(os.environ.get(name, default))


DEFAULT_CONFIG = Path(__file__).resolve().parent.parent / "tenants.example.json"


@dataclass(frozen=True)
class Settings:
    """The gateway's knobs; ``Settings.from_env()`` reads ``GATEWAY_*`` and ``REDIS_URL``.

    Times are ms. ``reservation_ttl_ms`` bounds how long a crashed gateway's reservation holds
    quota; ``heartbeat_ms`` (well below it) extends the reservation during a stream.
    """

    redis_url: str = "redis://127.0.0.1:6379/0"
    config_path: Path = DEFAULT_CONFIG
    default_max_tokens: int = 512
    max_tokens_cap: int = 4096
    estimate_factor: float = 1.2
    first_token_ms: int = 300
    token_ms: int = 30
    reservation_ttl_ms: int = 30_000
    heartbeat_ms: int = 10_000
    fail_open: bool = True
    redis_timeout_ms: int = 250
    busy_retry_after_s: int = 1

    @staticmethod
    def from_env() -> Settings:
        d = Settings()
        return Settings(
            redis_url=os.environ.get("REDIS_URL", d.redis_url),
            config_path=Path(os.environ.get("GATEWAY_CONFIG", str(d.config_path))),
            default_max_tokens=_env_int("GATEWAY_DEFAULT_MAX_TOKENS", d.default_max_tokens),
            max_tokens_cap=_env_int("GATEWAY_MAX_TOKENS_CAP", d.max_tokens_cap),
            first_token_ms=_env_int("GATEWAY_FIRST_TOKEN_MS", d.first_token_ms),
            token_ms=_env_int("GATEWAY_TOKEN_MS", d.token_ms),
            reservation_ttl_ms=_env_int("GATEWAY_RESERVATION_TTL_MS", d.reservation_ttl_ms),
            heartbeat_ms=_env_int("GATEWAY_HEARTBEAT_MS", d.heartbeat_ms),
            fail_open=os.environ.get("GATEWAY_FAIL_OPEN", "1") not in ("0", "false", "no"),
            redis_timeout_ms=_env_int("GATEWAY_REDIS_TIMEOUT_MS", d.redis_timeout_ms),
        )
