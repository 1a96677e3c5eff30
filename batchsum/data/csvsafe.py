"""The CSV formula rule: text from the service never reaches a spreadsheet as a live formula.

A CSV cell that begins with ``=``, ``+``, ``-``, ``@``, a tab or a carriage return is taken as a
formula by Excel, LibreOffice Calc and Google Sheets when the file is opened (``=HYPERLINK(...)``
leaks data, ``=cmd|...`` runs a program). A summary is untrusted text, so in CSV outputs such a cell
gets a leading single quote (OWASP's "CSV injection" advice): spreadsheets show it as text, and a
program reading the CSV sees the quote followed by the text as it came. Parquet and JSON Lines are
never changed; ``raw_csv=True`` (CLI ``--raw-csv``) keeps CSV cells as they came.

``neutralize`` is the rule, on an Arrow array, vectorized; ``neutralize_frame`` applies it to
columns of a pandas DataFrame (the notebook app's "Save CSV").
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import pyarrow as pa

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["FORMULA_START", "neutralize", "neutralize_frame"]

# The characters a spreadsheet reads as the start of a formula (OWASP's list), as an RE2 pattern.
FORMULA_START = r"^[=+\-@\t\r]"


def neutralize(values: pa.Array | pa.ChunkedArray) -> Any:
    """``values`` (strings) with a ``'`` before each one that begins like a formula; nulls and
    everything else unchanged. Returns an array of the same kind (``pa.Array`` or ``pa.ChunkedArray``)."""
    import pyarrow.compute as pc  # loaded by CSV outputs only

    dangerous = pc.match_substring_regex(values, FORMULA_START)
    return pc.if_else(dangerous, pc.binary_join_element_wise("'", values, ""), values)


def neutralize_frame(frame: pd.DataFrame, columns: Iterable[Any]) -> pd.DataFrame:
    """A copy of ``frame`` whose text ``columns`` follow the CSV formula rule; their dtype, the
    other columns and the index are kept. A column that does not hold only text is left as it is."""
    import pandas as pd

    out: pd.DataFrame = frame.copy()
    for name in columns:
        column = out[name]
        if not (pd.api.types.is_string_dtype(column.dtype) or column.dtype == object):
            continue
        try:
            values = pa.array(column, type=pa.string(), from_pandas=True)
        except (pa.ArrowInvalid, pa.ArrowTypeError):
            continue  # not all text (numbers in an object column): nothing a summary wrote
        safe = pd.Series(neutralize(values).to_pandas(), index=out.index, dtype=object)
        out[name] = safe.astype(column.dtype)
    return out
