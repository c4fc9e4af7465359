"""The setup step: writes every tenant's limits into Redis (idempotent; run it again after
editing the config). Budgets with ``QUOTA.SET key LIMIT n PERIOD p TZ zone``, RPM and TPM as
window keys that store their limit (``QUOTA.SET key WINDOW limit 60000``), concurrency as a
budget without a period (amount 1 per request in flight, settled 0).

    python -m quota_gateway.provision [--redis-url URL] [--config tenants.json]
"""

from __future__ import annotations

import argparse

import redis
from redis_quota import Quota

from .config import Settings, Tenants

MINUTE_MS = 60_000


def provision(q: Quota, tenants: Tenants) -> list[str]:
    """Creates or updates every key of every tenant; returns the keys written."""
    written: list[str] = []
    for t in tenants.tenants.values():
        q.set_budget(t.org_key(), limit=t.org.limit, period=t.org.period, tz=t.tz)
        written.append(t.org_key())
        for team, b in t.teams.items():
            q.set_budget(t.team_key(team), limit=b.limit, period=b.period, tz=t.tz)
            written.append(t.team_key(team))
        for k in t.keys.values():
            q.set_budget(t.api_key_key(k), limit=k.budget.limit, period=k.budget.period, tz=t.tz)
            written.append(t.api_key_key(k))
        q.set_window(t.rpm_key(), t.rpm, MINUTE_MS)
        q.set_window(t.tpm_key(), t.tpm, MINUTE_MS)
        q.set_budget(t.concurrency_key(), limit=t.concurrency, period="NONE")
        written += [t.rpm_key(), t.tpm_key(), t.concurrency_key()]
    return written


def main() -> None:
    d = Settings.from_env()
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--redis-url", default=d.redis_url)
    ap.add_argument("--config", default=str(d.config_path))
    a = ap.parse_args()
    client = redis.Redis.from_url(a.redis_url)
    keys = provision(Quota(client), Tenants.load(a.config))
    print(f"provisioned {len(keys)} keys from {a.config}:")
    for k in keys:
        print(f"  {k}")
    client.close()


if __name__ == "__main__":
    main()
