"""Two checkouts of the package side by side (issue 34: a move must cost nothing): each measure run for
every tree in turn, the trees interleaved in each repetition (before, after, before, after, ...) so
the machine's noise falls on both, the median of the repetitions, and the ratio after / before.

    python -m benchmarks.house --tree before=/work/wt-before --tree after=/work/wt-after
    python -m benchmarks.house --tree before=A --tree after=B --repeat 3 --rows 200000 --json out.json
    python -m benchmarks.house --tree before=A --tree after=B --repeat 1 --rows 20000 --parts version cpu

Measures (--parts, all by default):

- version: the wall time and peak RSS of `python -m batchsum --version`, the median of --version-runs
  runs (20) in each repetition, the trees alternating run by run;
- cpu: the CPU seconds (user + sys, from wait4) of one `batchsum summarize` process sending
  --requests (3000) distinct texts from a Parquet file, divided by the requests the service counted,
  against a local `batchsum serve --rpm 0` in its own process (its CPU is not counted); the whole
  command, start-up included, with a fresh journal each time;
- scale: benchmarks/scale.py's first run (wall, peak RSS) at --rows rows (200,000; --distinct distinct
  texts, rows / 10 by default: the issue-24 shape), then --reruns (3) reruns with every answer
  journaled (the median of their wall and peak RSS), scale.py's input and command; each output is
  checked (every row ok) and every rerun must send nothing.

Each tree is a checkout holding `batchsum/`. Every measured command runs in a process of its own, with
this interpreter (the same dependencies for both trees), PYTHONPATH=<tree> only and a working folder
outside the trees (a scratch folder, removed at the end); a first check makes sure each tree's
package is the one imported. Peak RSS is the command's own (ru_maxrss, through scale.py's small
launcher). The one service (for cpu and scale) runs from the first tree. Inputs are cached in --work
as in scale.py. Run by hand, never in the tests. The table: measure | before | after | ratio; --json
writes every repetition's figures too.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks import scale

SLACK = 1.05  # the "within 5%"

LAUNCHER = scale.LAUNCHER  # it reports the child's CPU (user + sys, from the same wait4) too
assert '"cpu_s"' in LAUNCHER, "scale.LAUNCHER changed: house.py needs its CPU figure"

# (key, label, unit, format) in the table's order
MEASURES = [
    ("version_wall_s", "`batchsum --version` wall", "s", "{:.3f}"),
    ("version_peak_rss_mb", "`batchsum --version` peak RSS", "MB", "{:.1f}"),
    ("cpu_ms_per_request", "client CPU per request", "ms", "{:.3f}"),
    ("cpu_total_s", "client CPU, whole command", "s", "{:.2f}"),
    ("cpu_wall_s", "client wall, whole command", "s", "{:.2f}"),
    ("scale_first_wall_s", "scale: first run wall", "s", "{:.2f}"),
    ("scale_first_peak_rss_mb", "scale: first run peak RSS", "MB", "{:.1f}"),
    ("scale_rerun_wall_s", "scale: rerun wall (journal complete)", "s", "{:.2f}"),
    ("scale_rerun_peak_rss_mb", "scale: rerun peak RSS", "MB", "{:.1f}"),
]


class Tree:
    """A checkout under a label; its environment puts only its package on the path."""

    def __init__(self, spec: str) -> None:
        label, sep, path = spec.partition("=")
        if not sep or not label or not path:
            raise SystemExit(f"--tree wants LABEL=PATH, not {spec!r}")
        self.label, self.path = label, Path(path).resolve()
        if not (self.path / "batchsum" / "__init__.py").exists():
            raise SystemExit(f"{self.path} holds no batchsum/ package")
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("BATCHSUM_")}
        self.env["PYTHONPATH"] = str(self.path)

    def commit(self) -> str:
        git = ["git", "-C", str(self.path)]
        head = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
        dirty = subprocess.run([*git, "status", "--porcelain", "--", "batchsum"], capture_output=True, text=True)
        return head + (" (batchsum/ modified)" if dirty.stdout.strip() else "")

    def check(self) -> None:
        """The package a child imports is this tree's (not an installed or editable copy), byte-compiled
        first (a fresh checkout's first runs would otherwise pay for writing its .pyc files)."""
        subprocess.run([sys.executable, "-m", "compileall", "-q", str(self.path / "batchsum")], check=True)
        done = subprocess.run(
            [sys.executable, "-c", "import batchsum; print(batchsum.__file__)"],
            env=self.env,
            capture_output=True,
            text=True,
        )
        found = Path(done.stdout.strip()).resolve() if done.returncode == 0 else None
        if found is None or self.path not in found.parents:
            raise SystemExit(f"{self.label}: a child imports {found or done.stderr!r}, not {self.path}")


def measured(command: list[str], env: dict[str, str], log: Path) -> dict[str, Any]:
    """scale.run_measured with the CPU line: exit, wall_s, peak_rss_mb (the command's own), cpu_s."""
    report = log.with_suffix(".json")
    with log.open("wb") as out:
        subprocess.run([sys.executable, "-c", LAUNCHER, str(report), *command], env=env, stdout=out, stderr=out)
    result: dict[str, Any] = json.loads(report.read_text())
    if result["exit"] != 0:
        raise RuntimeError(
            f"{' '.join(command[1:4])} exited {result['exit']}: {log.read_text(errors='replace')[-2000:]}"
        )
    return result


def summarize_command(inp: Path, out: Path, journal: Path, service: scale.Server) -> list[str]:
    """scale.py's command, through `python -m batchsum` (the door a move keeps)."""
    command = scale.summarize_cli(inp, out, journal, service, argparse.Namespace(concurrency=None, budget=None))
    command[command.index("batchsum.cli")] = "batchsum"
    return command


def version_part(trees: list[Tree], folder: Path, args: argparse.Namespace) -> dict[str, dict[str, float]]:
    """One repetition: --version-runs runs of each tree, alternating run by run (a burst of other work
    falls on both), the median of each tree's."""
    runs: dict[str, list[dict[str, Any]]] = {t.label: [] for t in trees}
    for _ in range(args.version_runs):
        for tree in trees:
            command = [sys.executable, "-m", "batchsum", "--version"]
            runs[tree.label].append(measured(command, tree.env, folder / f"version-{tree.label}.log"))
    return {
        label: {
            "version_wall_s": statistics.median(r["wall_s"] for r in done),
            "version_peak_rss_mb": statistics.median(r["peak_rss_mb"] for r in done),
        }
        for label, done in runs.items()
    }


def summarize_once(
    tree: Tree, inp: Path, journal: Path, service: scale.Server, folder: Path, name: str
) -> dict[str, Any]:
    """One measured `batchsum summarize` of INP with TREE's package, its output checked and removed."""
    cache = tempfile.mkdtemp(prefix="cache-", dir=folder)  # no earlier run's answers in its answer store
    env = {**tree.env, "BATCHSUM_BASE_URL": service.url, "BATCHSUM_API_KEY": "bench", "XDG_CACHE_HOME": cache}
    out = folder / f"{name}-{tree.label}.parquet"
    before = service.requests()
    done = measured(summarize_command(inp, out, journal, service), env, folder / f"{name}-{tree.label}.log")
    done["requests"] = service.requests() - before
    done["statuses"] = scale.statuses(out)
    out.unlink()
    return done


def cpu_part(tree: Tree, inp: Path, service: scale.Server, folder: Path, args: argparse.Namespace) -> dict[str, float]:
    folder = Path(tempfile.mkdtemp(prefix="cpu-", dir=folder))  # a fresh journal
    done = summarize_once(tree, inp, folder / "journal.sqlite", service, folder, "cpu")
    shutil.rmtree(folder)
    if done["requests"] != args.requests or done["statuses"] != {"ok": args.requests}:
        raise RuntimeError(f"cpu, {tree.label}: {done['requests']} requests, {done['statuses']}")
    return {
        "cpu_ms_per_request": 1000 * done["cpu_s"] / done["requests"],
        "cpu_total_s": done["cpu_s"],
        "cpu_wall_s": done["wall_s"],
    }


def scale_part(
    tree: Tree, inp: Path, service: scale.Server, folder: Path, args: argparse.Namespace
) -> dict[str, float]:
    folder = Path(tempfile.mkdtemp(prefix="scale-", dir=folder))  # a fresh journal, shared by both runs
    journal = folder / "journal.sqlite"
    first = summarize_once(tree, inp, journal, service, folder, "first")
    reruns = [summarize_once(tree, inp, journal, service, folder, "rerun") for _ in range(args.reruns)]
    journaled = scale.journal_rows(journal)
    shutil.rmtree(folder)
    for run in [first, *reruns]:
        if run["statuses"] != {"ok": args.rows}:
            raise RuntimeError(f"scale, {tree.label}: {run['statuses']}")
    if any(run["requests"] for run in reruns) or journaled != args.distinct:
        raise RuntimeError(f"scale rerun, {tree.label}: {[r['requests'] for r in reruns]} requests, {journaled} rows")
    return {
        "scale_first_wall_s": first["wall_s"],
        "scale_first_peak_rss_mb": first["peak_rss_mb"],
        "scale_rerun_wall_s": statistics.median(r["wall_s"] for r in reruns),
        "scale_rerun_peak_rss_mb": statistics.median(r["peak_rss_mb"] for r in reruns),
    }


def summary(runs: dict[str, dict[str, list[float]]], trees: list[Tree]) -> dict[str, Any]:
    """Each measure's repetitions, medians and ratios (each later tree over the first)."""
    results: dict[str, Any] = {}
    for key, label, unit, _ in MEASURES:
        if key not in runs[trees[0].label]:
            continue
        median = {t.label: statistics.median(runs[t.label][key]) for t in trees}
        base = median[trees[0].label]
        results[key] = {
            "label": label,
            "unit": unit,
            "runs": {t.label: runs[t.label][key] for t in trees},
            "median": median,
            "ratio": {t.label: median[t.label] / base if base else None for t in trees[1:]},
        }
    return results


def table(report: dict[str, Any]) -> str:
    labels = list(report["trees"])
    first, later = labels[0], labels[1:]
    formats = {key: fmt for key, _, _, fmt in MEASURES}
    lines = [
        f"{report['machine']}; repeat {report['args']['repeat']}, median; "
        + ", ".join(f"{label} = {t['path']} ({t['commit']})" for label, t in report["trees"].items()),
        "",
        "| measure | " + " | ".join(labels) + " | " + " | ".join(f"ratio {x}/{first}" for x in later) + " |",
        "| --- " * (1 + len(labels) + len(later)) + "|",
    ]
    over = []
    for key, r in report["results"].items():
        values = [f"{formats[key].format(r['median'][x])} {r['unit']}" for x in labels]
        ratios = [f"{r['ratio'][x]:.3f}" if r["ratio"][x] is not None else "—" for x in later]
        lines.append(f"| {r['label']} | " + " | ".join(values + ratios) + " |")
        over += [f"{r['label']} ({x})" for x in later if (r["ratio"][x] or 0) > SLACK]
    lines += ["", f"over {SLACK:.2f}x: " + (", ".join(over) if over else "none")]
    if max(report["load"]) > (os.cpu_count() or 1):
        lines.append(f"load {max(report['load']):.1f} on {os.cpu_count()} cores: the wall times are not to be trusted")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tree", action="append", required=True, metavar="LABEL=PATH", help="twice or more")
    parser.add_argument("--repeat", type=int, default=3, help="repetitions, trees interleaved in each")
    parser.add_argument("--parts", nargs="+", choices=["version", "cpu", "scale"], default=["version", "cpu", "scale"])
    parser.add_argument("--rows", type=int, default=200_000, help="scale: rows")
    parser.add_argument("--distinct", type=int, default=None, help="scale: distinct texts (default rows / 10)")
    parser.add_argument("--requests", type=int, default=3000, help="cpu: distinct texts, one request each")
    parser.add_argument("--reruns", type=int, default=3, help="scale: reruns after each first run (their median)")
    parser.add_argument("--version-runs", type=int, default=20, help="version: runs in each repetition")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "batchsum-scale")
    parser.add_argument("--json", type=Path, default=None, help="write the report (every repetition) here")
    args = parser.parse_args()
    trees = [Tree(spec) for spec in args.tree]
    if len(trees) < 2 or len({t.label for t in trees}) != len(trees):
        raise SystemExit("give two --tree LABEL=PATH or more, with different labels")
    args.distinct = args.distinct or max(1, args.rows // 10)
    args.work = args.work.resolve()
    json_path = args.json.resolve() if args.json else None

    args.work.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="house-", dir=args.work))
    os.chdir(scratch)  # every child's working folder, first on its path (-m, -c): outside the trees
    for tree in trees:
        tree.check()
    runs: dict[str, dict[str, list[float]]] = {t.label: {} for t in trees}
    load, wall = os.getloadavg()[0], time.time()
    service = None
    try:
        inputs = {}
        if "cpu" in args.parts:
            inputs["cpu"] = scale.input_path(args.work, args.requests, args.requests, args.seed + 1)
        if "scale" in args.parts:
            inputs["scale"] = scale.input_path(args.work, args.rows, args.distinct, args.seed)
        service = scale.Server(scratch, env=trees[0].env) if inputs else None
        for part in args.parts:
            for rep in range(args.repeat):
                if part == "version":
                    scale.note(f"version, repetition {rep + 1}/{args.repeat}: the trees run by run ...")
                    found = version_part(trees, scratch, args)
                else:
                    assert service is not None
                    measure, found = (cpu_part if part == "cpu" else scale_part), {}
                    for tree in trees:
                        scale.note(f"{part}, repetition {rep + 1}/{args.repeat}: {tree.label} ...")
                        found[tree.label] = measure(tree, inputs[part], service, scratch, args)
                for label, values in found.items():
                    for key, value in values.items():
                        runs[label].setdefault(key, []).append(value)
    finally:
        if service is not None:
            service.close()
        os.chdir(args.work)
        shutil.rmtree(scratch, ignore_errors=True)

    report = {
        "machine": f"{os.cpu_count()} cores, load {load:.2f} at the start, {os.getloadavg()[0]:.2f} at the end; "
        f"Python {platform.python_version()}; {time.strftime('%Y-%m-%d %H:%M', time.gmtime(wall))} UTC, "
        f"{time.time() - wall:.0f} s",
        "load": [load, os.getloadavg()[0]],
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "trees": {t.label: {"path": str(t.path), "commit": t.commit()} for t in trees},
        "results": summary(runs, trees),
    }
    if json_path:
        json_path.write_text(json.dumps(report, indent=2))
    print(table(report))


if __name__ == "__main__":
    main()
