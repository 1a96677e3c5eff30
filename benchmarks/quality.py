"""Summary quality of the local service's summarizer: ROUGE-1/2/Lsum F1 (Google's rouge-score,
stemming on) and ms/doc, for mode 1, mode 2, Lead-k and a plain TF-IDF TextRank at the same
number of sentences (3 for CNN/DM, 1 for XSum). Run by hand:

    python benchmarks/quality.py --split test
    python benchmarks/quality.py --split validation --tune     # the search that set Tuning
    python benchmarks/quality.py --examples                    # both modes on benchmarks/articles

Data: shared/data/eval/frank_{cnndm,xsum}.jsonl (tune on split=validation, report on split=test).
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import re
import statistics
import time
from pathlib import Path

import numpy as np
from rouge_score import rouge_scorer

from batchsum.local import summarizer
from batchsum.local.sentences import split_sentences

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "eval"
SETS = {"cnndm": ("frank_cnndm.jsonl", 3), "xsum": ("frank_xsum.jsonl", 1)}
SCORER = rouge_scorer.RougeScorer(["rouge1", "rouge2", "rougeLsum"], use_stemmer=True)


def load(name: str, split: str) -> list[dict]:
    path = DATA / SETS[name][0]
    return [row for row in map(json.loads, path.open()) if row["split"] == split]


def reference_lines(reference: str) -> str:
    """One sentence per line, as rougeLsum wants (the CNN/DM references end sentences with ' .')."""
    return "\n".join(s.strip() for s in re.split(r"(?<=[.!?])\s+(?=[A-Z0-9\"'`])", reference) if s.strip())


def lead(text: str, k: int) -> list[str]:
    return split_sentences(text)[:k]


def textrank(text: str, k: int) -> list[str]:
    """Plain TextRank: TF-IDF cosine graph, PageRank (d=0.85), top k in text order; no position prior."""
    doc = summarizer._Document(text)
    n = len(doc.sentences)
    if n == 0:
        return []
    sim = doc.similarities().astype(np.float64)
    np.fill_diagonal(sim, 0.0)
    rows = sim.sum(axis=1, keepdims=True)
    rows[rows == 0] = 1.0
    transition = sim / rows
    rank = np.full(n, 1.0 / n)
    for _ in range(50):
        rank = 0.15 / n + 0.85 * transition.T @ rank
    top = sorted(sorted(range(n), key=lambda i: (-rank[i], i))[:k])
    return [doc.sentences[i] for i in top]


def method(mode: int, tuning: summarizer.Tuning):
    return lambda text, k: summarizer.rank_sentences(text, mode, k, tuning)


def unresolved(text: str, picked: list[str]) -> tuple[int, int]:
    """(selected sentences that open with a reference the summary leaves unresolved, selected)."""
    sentences = split_sentences(text)
    where = {s: i for i, s in reversed(list(enumerate(sentences)))}
    chosen = [where[s] for s in picked if s in where]
    return round(summarizer.unresolved_share(chosen, sentences) * len(chosen)), len(chosen)


def evaluate(rows: list[dict], k: int, pick) -> dict[str, float]:
    scores = {"rouge1": [], "rouge2": [], "rougeLsum": []}
    started = time.perf_counter()
    predictions = [pick(row["text"], k) for row in rows]
    ms = (time.perf_counter() - started) / len(rows) * 1e3
    dangling = picked = 0
    for row, sentences in zip(rows, predictions):
        result = SCORER.score(reference_lines(row["reference"]), "\n".join(sentences))
        for key in scores:
            scores[key].append(result[key].fmeasure)
        bad, total = unresolved(row["text"], sentences)
        dangling, picked = dangling + bad, picked + total
    return {
        "R1": 100 * statistics.mean(scores["rouge1"]),
        "R2": 100 * statistics.mean(scores["rouge2"]),
        "RLsum": 100 * statistics.mean(scores["rougeLsum"]),
        "ms/doc": ms,
        "unresolved": 100 * dangling / picked if picked else 0.0,
    }


def report(split: str) -> None:
    print(f"split={split}; ROUGE F1 x100, rouge-score with stemming")
    print("| set | method | sentences | R1 | R2 | RLsum | unresolved % | ms/doc |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    before = dataclasses.replace(summarizer.TUNING, coherent=False)
    for name, (_, k) in SETS.items():
        rows = load(name, split)
        methods = {
            "Lead-k": lead,
            "TextRank (TF-IDF)": textrank,
            "mode 1, no coherence rule (before)": method(1, before),
            "mode 2, no coherence rule (before)": method(2, before),
            "mode 1 (mini)": method(1, summarizer.TUNING),
            "mode 2 (full)": method(2, summarizer.TUNING),
        }
        for label, pick in methods.items():
            s = evaluate(rows, k, pick)
            print(
                f"| {name} ({len(rows)}) | {label} | {k} | {s['R1']:.1f} | {s['R2']:.1f} | {s['RLsum']:.1f} "
                f"| {s['unresolved']:.1f} | {s['ms/doc']:.2f} |"
            )
    speed()


def speed() -> None:
    """ms for a 5000-word text (validation articles joined), best of 20, per mode and type."""
    words: list[str] = []
    for row in load("cnndm", "validation"):
        words.extend(row["text"].split())
        if len(words) >= 5000:
            break
    text = " ".join(words[:5000])
    print("\n| 5000 words | default | summary_2 | best_line |")
    print("| --- | --- | --- | --- |")
    for mode in (1, 2):
        cells = []
        for kind in (None, "summary_2", "best_line"):
            best = min(_timed(text, mode, kind) for _ in range(20))
            cells.append(f"{best:.1f} ms")
        print(f"| mode {mode} | " + " | ".join(cells) + " |")


def _timed(text: str, mode: int, kind: str | None) -> float:
    started = time.perf_counter()
    summarizer.summarize(text, mode, 4, kind)
    return (time.perf_counter() - started) * 1e3


def tune() -> None:
    """Grid search on the validation split. The objective is the R1 margin over the baselines
    the targets name: mode 2 over Lead-3 on CNN/DM plus over TextRank on XSum; mode 1 likewise."""
    data = {name: load(name, "validation") for name in SETS}
    baseline = {"cnndm": evaluate(data["cnndm"], 3, lead)["R1"], "xsum": evaluate(data["xsum"], 1, textrank)["R1"]}
    print(f"validation baselines: Lead-3 on cnndm {baseline['cnndm']:.2f}, TextRank on xsum {baseline['xsum']:.2f}")
    grids = {
        2: {
            "position_decay": [0.5, 1.0, 2.0],
            "mode2_prior": [0.5, 1.0, 2.0],
            "backward_weight": [-1.0, -0.5, 0.0],
            "edge_threshold": [0.0, 0.1],
            "redundancy": [0.5, 1.01],
        },
        1: {"position_decay": [0.5, 1.0, 2.0], "mode1_prior": [2.0, 4.0, 8.0, 16.0]},
    }
    for mode, grid in grids.items():
        results = []
        for values in itertools.product(*grid.values()):
            tuning = dataclasses.replace(summarizer.TUNING, **dict(zip(grid, values)))
            r1 = {n: evaluate(data[n], SETS[n][1], method(mode, tuning))["R1"] for n in SETS}
            results.append((sum(r1[n] - baseline[n] for n in SETS), r1, dict(zip(grid, values))))
        results.sort(key=lambda r: -r[0])
        for margin, r1, values in results[:5]:
            print(f"mode {mode}: margin {margin:+.2f} cnndm {r1['cnndm']:.2f} xsum {r1['xsum']:.2f} {values}")


ARTICLES = Path(__file__).resolve().parent / "articles"


def examples() -> None:
    """Both modes' outputs in every type for the example articles (written for the project), as
    Markdown for benchmarks/README.md, so a reader can judge by eye."""
    for path in sorted(ARTICLES.glob("*.txt")):
        text = path.read_text()
        print(f"### `{path.name}` ({len(text.split())} words)\n")
        for kind in (None, "bullets", "summary_2", "best_line"):
            for mode in (1, 2):
                print(f"**mode {mode}, {kind or 'default'}** (length 4):\n")
                summary = summarizer.summarize(text, mode, 4, kind)
                print("\n".join("> " + line if line else ">" for line in summary.splitlines()) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--split", default="test", choices=["test", "validation"], help="which split to report")
    parser.add_argument("--tune", action="store_true", help="grid-search Tuning on the validation split")
    parser.add_argument("--examples", action="store_true", help="print both modes' outputs for benchmarks/articles")
    args = parser.parse_args()
    if args.tune:
        tune()
    elif args.examples:
        examples()
    else:
        report(args.split)


if __name__ == "__main__":
    main()
