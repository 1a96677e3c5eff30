"""An Arrow dataset streamed through a run into its output (``stream_dataset``): input batches held
only until their rows' results arrive; what a stop keeps of the output and what it removes."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterator
from typing import TYPE_CHECKING

from ..data.results import RowBlock, RowResult
from ..service.errors import BrokenInputError, JournalError, RequestCapReached

if TYPE_CHECKING:
    import pyarrow as pa

    from ..data.datasets import DatasetInput, DatasetOutput

__all__ = ["stream_dataset"]


async def stream_dataset(
    source: DatasetInput,
    output: DatasetOutput,
    results_of: Callable[[Iterator[RowBlock]], AsyncIterator[RowResult | list[RowResult]]],
    on_late_stop: Callable[[BaseException], None],
    batch_rows: int | None = None,
) -> None:
    """Stream ``source`` through ``results_of`` (a run's results for rows) into ``output``: input
    batches are held only until their rows' results arrive, so memory stays bounded.

    A stop that leaves answers nowhere else (a journal that cannot be written, an input that
    broke midway) writes the rows finished so far and commits them, then raises. An interrupt or
    a refused key removes the partial output (the answers are in the journal, and the same
    command resumes), unless every row was already written: a finished output is never thrown
    away, and the stop that came too late is told to ``on_late_stop``."""
    held: deque[pa.RecordBatch] = deque()
    column = source.column
    read_all = False

    def blocks() -> Iterator[RowBlock]:
        nonlocal read_all
        for batch in source.batches(batch_rows):
            held.append(batch)
            yield RowBlock(batch.column(column).to_pylist(), batch.nbytes)
        read_all = True

    finished: list[RowResult] = []
    results = results_of(blocks())
    try:
        async for result in results:
            if isinstance(result, list):
                finished.extend(result)
            else:
                finished.append(result)
            while held and len(finished) >= held[0].num_rows:
                batch = held.popleft()
                output.write(batch, finished[: batch.num_rows])
                del finished[: batch.num_rows]
        while held:  # batches of no rows
            output.write(held.popleft(), [])
    except (JournalError, BrokenInputError, RequestCapReached):
        if finished and held:
            output.write(held[0].slice(0, len(finished)), finished)
        output.commit()
        raise
    except (asyncio.CancelledError, KeyboardInterrupt) as exc:
        if not (read_all and not finished and all(batch.num_rows == 0 for batch in held)):
            output.abort()
            raise
        on_late_stop(exc)  # every row was written: the output is finished, keep it
    except BaseException:
        output.abort()
        raise
    output.commit()
