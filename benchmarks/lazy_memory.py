"""Peak memory of a lazy Polars scan -> batchsum -> sink against the same scan and sink without
batchsum, side by side in one run (issue 41). Run by hand, never in the tests:

    python -m benchmarks.lazy_memory                        # 200,000 rows
    python -m benchmarks.lazy_memory --rows 200000 2000000
    python -m benchmarks.lazy_memory --before /tmp/old   # also the batchsum run of another checkout

``--before PATH``: the ``batchsum`` run once more with the package found in PATH first on the path (a
checkout, or ``git archive c91d652 batchsum | tar -x -C PATH``), as ``batchsum (before)``.

Input: ``scale.py``'s (ROWS rows of 20,000 distinct texts of 40-120 words, an int64 ``id``, a 200-byte
``extra`` string distinct per row, Parquet in row groups of 50,000), cached in --work. One local
service answering at once (``batchsum serve --rpm 0``) in its own process; each measured run is a
fresh process started by ``scale.py``'s launcher, so its peak RSS (``ru_maxrss`` from ``wait4``) is
its own, interpreter and imports included:

- ``bare``: ``pl.scan_parquet(f).sink_parquet(out)``.
- ``bare-batchsum-imported``: the same after ``import batchsum.polars`` (what importing costs).
- ``batchsum``: ``pl.scan_parquet(f).batchsum.summarize("text", rpm=0, budget="none").sink_parquet(out)``
  (the lazy frame's own answer store; no journal named).

Where an excess can go, each alone (``--runs`` names them; none sends a request):

- ``passthrough``: the scan read by ``collect_batches`` inside a Python IO source (``register_io_source``)
  that yields its chunks unchanged to the sink: Polars' two engines, as a lazy batchsum has them.
- ``passthrough-arrow``: the same, each chunk through ``to_arrow()`` and ``pl.from_arrow`` (what
  batchsum did before issue 41): pyarrow's pool and the string copies (``to_arrow``'s default
  compatibility level turns Polars' string views into ``large_string``, and back).
- ``passthrough-arrow-system``: the same on pyarrow's system allocator instead of mimalloc.
- ``bare-pandas-loaded``: ``bare`` after ``import pyarrow`` and one Arrow array made from Python values
  (which loads pandas, as an Arrow conversion of results did before).

The output of each batchsum run is checked: ROWS rows, every status ``ok``, and the service's count of
requests (one per distinct text).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.scale import Server, child_env, input_path, note, run_measured, statuses

SCRIPTS = {
    "bare": """
import sys
import polars as pl
pl.scan_parquet(sys.argv[1]).sink_parquet(sys.argv[2])
""",
    "bare-batchsum-imported": """
import sys
import polars as pl
import batchsum.polars
pl.scan_parquet(sys.argv[1]).sink_parquet(sys.argv[2])
""",
    "passthrough": """
import sys
import polars as pl
from polars.io.plugins import register_io_source
lazy = pl.scan_parquet(sys.argv[1])
def source(with_columns, predicate, n_rows, batch_size):
    yield from lazy.collect_batches(chunk_size=batch_size or 10_000)
register_io_source(source, schema=lazy.collect_schema()).sink_parquet(sys.argv[2])
""",
    "passthrough-arrow": """
import sys
import polars as pl
from polars.io.plugins import register_io_source
lazy = pl.scan_parquet(sys.argv[1])
def source(with_columns, predicate, n_rows, batch_size):
    for chunk in lazy.collect_batches(chunk_size=batch_size or 10_000):
        for batch in chunk.to_arrow().to_batches():
            yield pl.from_arrow(batch)
register_io_source(source, schema=lazy.collect_schema()).sink_parquet(sys.argv[2])
""",
    "passthrough-arrow-system": """
import os, sys
os.environ["ARROW_DEFAULT_MEMORY_POOL"] = "system"
import polars as pl
from polars.io.plugins import register_io_source
lazy = pl.scan_parquet(sys.argv[1])
def source(with_columns, predicate, n_rows, batch_size):
    for chunk in lazy.collect_batches(chunk_size=batch_size or 10_000):
        for batch in chunk.to_arrow().to_batches():
            yield pl.from_arrow(batch)
register_io_source(source, schema=lazy.collect_schema()).sink_parquet(sys.argv[2])
""",
    "bare-pandas-loaded": """
import sys
import polars as pl
import pyarrow as pa
pa.array(["loads pandas"])
pl.scan_parquet(sys.argv[1]).sink_parquet(sys.argv[2])
""",
    "batchsum": """
import sys
import polars as pl
import batchsum.polars
lazy = pl.scan_parquet(sys.argv[1]).batchsum.summarize(
    "text", rpm=0, budget="none", progress=False, api_key="bench", base_url=sys.argv[3]
)
lazy.sink_parquet(sys.argv[2])
""",
}


def one_size(rows: int, runs: list[tuple[str, str]], args: argparse.Namespace, scratch: Path) -> dict[str, Any]:
    inp = input_path(args.work, rows, args.distinct, args.seed)
    folder = scratch / f"rows{rows}"
    folder.mkdir()
    result: dict[str, Any] = {"rows": rows, "distinct": args.distinct, "input_mb": inp.stat().st_size / 1e6}
    server = Server(folder)
    try:
        for label, script in runs:
            out = folder / "out.parquet"
            before = server.requests()
            note(f"{rows} rows: {label} ...")
            command = [sys.executable, "-c", SCRIPTS[script], str(inp), str(out), server.url]
            env = child_env(PYTHONPATH=str(args.before)) if label.endswith("(before)") else child_env()
            done = run_measured(command, env, folder / "run.log")
            done["requests"] = server.requests() - before
            if done["exit"] == 0 and script == "batchsum":
                done["statuses"] = statuses(out)
            out.unlink(missing_ok=True)
            result[label] = done
            note(f"  peak RSS {done['peak_rss_mb']:.0f} MB, {done['wall_s']:.1f} s, {done['requests']} requests")
    finally:
        server.close()
    return result


def table(sizes: list[dict[str, Any]], runs: list[tuple[str, str]]) -> str:
    lines = [
        "| rows | run | peak RSS | against bare | wall | requests | statuses |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for size in sizes:
        bare = size.get("bare", {}).get("peak_rss_mb")
        for name, _ in runs:
            done = size[name]
            peak = done["peak_rss_mb"]
            against = f"{peak - bare:+.0f} MB" if bare is not None and name != "bare" else ""
            lines.append(
                f"| {size['rows']:,} | {name} | {peak:.0f} MB | {against} | {done['wall_s']:.0f} s | "
                f"{done['requests']} | {done.get('statuses') or ''} |"
            )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, nargs="+", default=[200_000])
    parser.add_argument("--distinct", type=int, default=20_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--runs", nargs="+", default=["bare", "batchsum"], choices=sorted(SCRIPTS))
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "batchsum-scale")
    parser.add_argument("--before", type=Path, help="the batchsum run also with the package in this folder")
    parser.add_argument("--json", action="store_true", help="one JSON object on stdout instead of the table")
    args = parser.parse_args()
    runs = [(name, name) for name in args.runs]
    if args.before:
        runs.append(("batchsum (before)", "batchsum"))
    args.work.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="lazy-", dir=args.work))
    os.chdir(scratch)  # the children's working folder: no batchsum there, so PYTHONPATH's is the one imported
    try:
        sizes = [one_size(rows, runs, args, scratch) for rows in sorted(args.rows)]
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    print(json.dumps(sizes, indent=2) if args.json else table(sizes, runs))


if __name__ == "__main__":
    main()
