"""A spec bound to its service (``bind``): the process-wide local reference service started when the
spec asks for it (``local_service``), its address and fresh key filled in."""

from __future__ import annotations

import dataclasses
import threading
from typing import TYPE_CHECKING

from ..service.errors import ConfigurationError
from ..service.settings import Secret
from .spec import RunSpec

if TYPE_CHECKING:
    from ..local import LocalService

__all__ = ["bind", "local_service", "spec_key_hash"]

_services: dict[int, LocalService] = {}
_services_lock = threading.Lock()


def local_service(rpm: float = 0) -> LocalService:
    """The process-wide local reference service with a per-key limit of ``rpm`` (0: none), started on
    first use; its key is fresh, so no other run shares its budget."""
    limit = int(rpm)
    with _services_lock:
        service = _services.get(limit)
        if service is None:
            try:
                from ..local import LocalService
            except ImportError as exc:
                raise ConfigurationError(str(exc)) from None
            service = _services[limit] = LocalService(rpm=limit).start()
        return service


def bind(spec: RunSpec) -> RunSpec:
    """``spec`` with the local service started and its address and key filled in (when it asks for it)."""
    if not spec.client.local or spec.client.api_key is not None:
        return spec
    service = local_service(spec.rpm)
    client = dataclasses.replace(spec.client, api_key=Secret(service.key), base_url=service.url)
    return spec.replace(client=client)


def spec_key_hash(spec: RunSpec) -> str:
    """The hash of the spec's key (``bind`` fills in the local service's)."""
    found = spec.client.key_hash
    assert found is not None, "bind() fills in the local service's key"
    return found
