"""The local reference service: the interface of ``shared/api/interface.md`` on this machine.

Needs the ``local`` extra (``pip install 'batchsum[local]'``). Imports only
``batchsum.service.contract``.
"""

from __future__ import annotations

try:
    import starlette  # noqa: F401
    import uvicorn  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the install
    raise ImportError(
        f"the local service needs the 'local' extra: pip install 'batchsum[local]' ({exc.name} is missing)"
    ) from exc

from .server import LocalService
from .state import FAULT_KINDS, Account, Faults, Plan, ServiceState

__all__ = ["LocalService", "Account", "Faults", "Plan", "ServiceState", "FAULT_KINDS"]
