"""A run's answers, opened (``open_scopes``): its own scope (the output's journal, or this process's
memory) and the answer store the spec names, in the run's store scope (``store_scope``), served to
the run as its keys in its mode may be (``data.scopes.Trust``)."""

from __future__ import annotations

import asyncio
import functools
import hashlib
from collections.abc import Sequence
from contextlib import AsyncExitStack
from typing import Any

from ..data.journal import Journal, SharedJournal
from ..data.scopes import Proof, Scopes, Trust, open_store
from ..data.stores import AnswerStore, StoreError, process_cache, shared_memory
from .logs import event, log
from .spec import RunSpec

__all__ = ["open_scopes", "store_scope"]


async def open_scopes(
    stack: AsyncExitStack,
    spec: RunSpec,
    run_id: str,
    identity: str,
    output: Any,
    shared: bool,
    scope: str,
    keys: Sequence[Proof | None],
) -> tuple[Scopes, str | None]:
    """The run's answers (``Scopes``), closed with ``stack``: its own scope (the journal; else this
    process's memory, or for shared runs nothing: the store keeps their job's refusals) and the store
    ``spec.store`` names, in ``scope`` (``store_scope``), serving what the run's ``keys`` (their
    records) may be served in its mode (``Trust``); one that cannot be opened is one line, and the
    run goes on with its own scope alone (a shared run's: this process's memory), as with one only
    read. And what adopting a journal from before services meant, to say once (None: nothing)."""
    own, keeps_all, adopted = _own_scope(stack, spec, run_id, identity, output, shared)
    job = run_id if own is None else None  # the store is its only scope: it keeps the job's refusals too
    opening = functools.partial(open_store, spec.store, spec.client.service, identity, job, scope)
    try:
        store = await asyncio.get_running_loop().run_in_executor(None, opening)  # off the loop: Redis may be far
    except StoreError as exc:
        alone = "its journal" if spec.journal is not None else "this process's answers"
        log.warning("batchsum: %s; this run goes on with %s alone", exc, alone, extra={"event": "store"})
        store = None
    if store is not None and not store.writable:
        _say_read_only(store, spec)
    if own is None and (store is None or not store.writable):
        own = shared_memory(identity)
    if store is not None:
        stack.callback(store.close)
    trust = Trust.of(spec.params.mode, keys)
    return Scopes(own, store, keeps_all=keeps_all, refresh=spec.refresh, started=spec.started, trust=trust), adopted


def _own_scope(
    stack: AsyncExitStack, spec: RunSpec, run_id: str, identity: str, output: Any, shared: bool
) -> tuple[AnswerStore | None, bool, str | None]:
    """The run's own answers, whether they keep every answer (a journal) or only what no store on
    disk keeps (this process's memory), and what adopting a journal from before services meant."""
    if spec.journal is not None:
        journal = SharedJournal(spec.journal) if shared else Journal(spec.journal)
        stack.callback(journal.close)
        adopted = journal.serve(spec.client.service)
        if adopted is not None:  # said once: the journal is stamped now
            event("journal", adopted, run_id=run_id)
        if output is not None:
            journal.note_output(output.path)
        return journal, True, adopted
    if shared:  # the workers of one job share the store; with none, this process's memory (one process)
        return (shared_memory(identity) if spec.store.none else None), True, None
    return process_cache(spec.client.service), False, None


def _say_read_only(store: Any, spec: RunSpec) -> None:
    """The one line for a store this user cannot write: read, and new answers kept by the run alone."""
    where = "the journal" if spec.journal is not None else "this process's memory"
    log.warning(
        "batchsum: the answer store %s cannot be written here: its answers are used, and new answers go to %s alone",
        store.where,
        where,
        extra={"event": "store"},
    )


def store_scope(spec: RunSpec, key_hashes: Sequence[str]) -> str:
    """Whose answers the run's store keeps and serves (``store_scope``): ``""``, every key's of the
    service; with ``key``, the key that paid for them (its hash; a run with several keys: their set's)."""
    if spec.store_scope != "key":
        return ""
    if len(key_hashes) == 1:
        return key_hashes[0]
    return hashlib.sha256("\n".join(sorted(key_hashes)).encode()).hexdigest()[:32]
