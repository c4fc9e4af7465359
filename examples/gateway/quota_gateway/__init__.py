"""An OpenAI-style gateway in front of a fake streaming model, admitting every request against
its key, team and org budgets, RPM, TPM and concurrency in one QUOTA.MRESERVE (docs/gateway.md)."""

from .app import create_app
from .config import Settings, Tenants

__all__ = ["Settings", "Tenants", "create_app"]
