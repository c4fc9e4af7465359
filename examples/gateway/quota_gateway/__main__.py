"""``python -m quota_gateway [--host H] [--port P] [--provision]``: serve the gateway with
uvicorn (settings from ``REDIS_URL`` and ``GATEWAY_*``; see config.Settings)."""

from __future__ import annotations

import argparse
import logging

import redis
import uvicorn
from redis_quota import Quota

from .app import create_app
from .config import Settings, Tenants
from .provision import provision


def main() -> None:
    ap = argparse.ArgumentParser(description="OpenAI-style gateway with redis-quota limits")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--provision", action="store_true", help="write the tenants' limits first")
    a = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    settings = Settings.from_env()
    tenants = Tenants.load(settings.config_path)
    if a.provision:
        client = redis.Redis.from_url(settings.redis_url)
        n = len(provision(Quota(client), tenants))
        client.close()
        logging.getLogger("quota_gateway").info("provisioned %d keys", n)
    uvicorn.run(create_app(settings, tenants), host=a.host, port=a.port, log_level="info")


if __name__ == "__main__":
    main()
