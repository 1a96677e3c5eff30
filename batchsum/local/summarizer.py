"""The local service's extractive summarizer: sentences scored, chosen, and laid out per type.

Mode 1 ("mini"): TF-IDF centroid similarity plus a position prior: one matrix-vector product.
Mode 2 ("full"): position-aware directed centrality over the sentence graph (after PacSum, Zheng &
Lapata 2019: similarity to later sentences counts for, to earlier ones against) plus the position
prior, then redundancy removal when choosing. Sentences that are too short to say anything, or
carry scraped boilerplate (a "word" of 30+ letters), rank last. Deterministic; needs only numpy.
Weights were chosen on the validation splits by ``benchmarks/quality.py --tune``.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import dataclass

import numpy as np

from .. import contract
from .sentences import split_sentences

__all__ = ["summarize", "rank_sentences", "sentence_budget", "Tuning"]

_TOKEN = re.compile(r"[^\W_]+(?:['’][^\W_]+)?", re.UNICODE)
_STOPWORDS = frozenset(
    """
    a about above after again against all also am an and any are aren't as at be because been before
    being below between both but by can could did do does doing down during each few for from further
    had has have having he her here hers herself him himself his how i if in into is it its itself
    just me more most my myself no nor not now of off on once only or other our ours ourselves out over
    own same she should so some such than that the their theirs them themselves then there these they
    this those through to too under until up very was we were what when where which while who whom why
    will with would you your yours yourself yourselves said says say one two new would could may might
    must shall us mr mrs ms dr s t don't can't won't it's i'm he's she's we're they're i've we've
    """.split()
)
_SUFFIXES = ("ingly", "edly", "ings", "ing", "ied", "ies", "ed", "es", "ly", "s")


def _stem(word: str) -> str:
    for suffix in _SUFFIXES:
        if word.endswith(suffix) and len(word) - len(suffix) >= 3:
            word = word[: -len(suffix)]
            if suffix in ("ied", "ies"):
                word += "y"
            break
    return word


def _terms(sentence: str) -> list[str]:
    return [
        _stem(w)
        for w in (t.lower().replace("’", "'") for t in _TOKEN.findall(sentence))
        if w not in _STOPWORDS and not w.isdigit() and len(w) > 1
    ]


@dataclass(frozen=True)
class Tuning:
    """Weights found on the validation splits (``benchmarks/quality.py --tune``)."""

    position_decay: float = 1.0  # the prior: 1 / (1 + position) ** decay
    mode1_prior: float = 8.0  # mode 1 score: centroid similarity + mode1_prior * prior
    mode2_prior: float = 1.0  # mode 2 score: directed centrality + mode2_prior * prior
    backward_weight: float = -0.5  # mode 2: similarity to earlier sentences counts against
    forward_weight: float = 1.0  # mode 2: similarity to later sentences counts for
    edge_threshold: float = 0.0  # share of the similarity range under which an edge is dropped
    redundancy: float = 0.5  # mode 2 passes over a sentence this similar to one already chosen
    min_terms: int = 3  # fewer content words: a dateline or a caption, ranked last
    junk_length: int = 30  # a "word" this long is glued boilerplate ("Share this withEmailFacebook...")


TUNING = Tuning()

# Share of the text's sentences kept per percentage step: monotone, and never fewer than one sentence.
_SHARE = {1: 0.05, 2: 0.10, 3: 0.15, 4: 0.22, 5: 0.32, 6: 0.45}


def sentence_budget(n_sentences: int, percentage: int) -> int:
    """How many sentences a summary at ``percentage`` keeps (1..n, growing with percentage)."""
    return max(1, min(n_sentences, math.ceil(n_sentences * _SHARE[percentage])))


class _Document:
    """Sentences, their TF-IDF rows (L2-normalized) and the pairwise cosine similarities."""

    def __init__(self, text: str) -> None:
        self.sentences = split_sentences(text)
        self.terms = [_terms(s) for s in self.sentences]
        vocabulary: dict[str, int] = {}
        for terms in self.terms:
            for term in terms:
                vocabulary.setdefault(term, len(vocabulary))
        self.vocabulary = vocabulary
        n = len(self.sentences)
        counts = np.zeros((n, max(1, len(vocabulary))), dtype=np.float32)
        for row, terms in enumerate(self.terms):
            for term, count in Counter(terms).items():
                counts[row, vocabulary[term]] = count
        df = (counts > 0).sum(axis=0)
        self.idf = np.log((1 + n) / (1 + df)) + 1.0
        weights = np.log1p(counts) * self.idf
        norms = np.linalg.norm(weights, axis=1, keepdims=True)
        norms[norms == 0] = 1.0
        self.matrix = weights / norms

    def similarities(self) -> np.ndarray:
        similarities: np.ndarray = self.matrix @ self.matrix.T
        return similarities


def _position_prior(n: int, tuning: Tuning) -> np.ndarray:
    return 1.0 / (1.0 + np.arange(n, dtype=np.float64)) ** tuning.position_decay


def _centroid_scores(doc: _Document) -> np.ndarray:
    centroid = doc.matrix.sum(axis=0)
    norm = np.linalg.norm(centroid)
    return (doc.matrix @ (centroid / norm)).astype(np.float64) if norm else np.zeros(len(doc.sentences))


def _directed_centrality(similarity: np.ndarray, tuning: Tuning) -> np.ndarray:
    n = similarity.shape[0]
    if n < 2:
        return np.ones(n)
    sim = similarity.astype(np.float64).copy()
    np.fill_diagonal(sim, 0.0)
    low, high = sim.min(), sim.max()
    sim = np.maximum(sim - (low + tuning.edge_threshold * (high - low)), 0.0)
    forward = np.triu(sim, 1).sum(axis=1)  # similarity to later sentences
    backward = np.tril(sim, -1).sum(axis=1)  # similarity to earlier sentences
    scores: np.ndarray = tuning.forward_weight * forward + tuning.backward_weight * backward
    return scores


def _normalized(scores: np.ndarray) -> np.ndarray:
    low, high = scores.min(), scores.max()
    return (scores - low) / (high - low) if high > low else np.ones_like(scores)


def _scores(doc: _Document, mode: contract.Mode, tuning: Tuning) -> np.ndarray:
    n = len(doc.sentences)
    prior = _position_prior(n, tuning)
    if mode == contract.Mode.STANDARD:
        scores = _normalized(_centroid_scores(doc)) + tuning.mode1_prior * prior
    else:
        scores = _normalized(_directed_centrality(doc.similarities(), tuning)) + tuning.mode2_prior * prior
    junk = np.array(
        [
            len(terms) < tuning.min_terms or any(len(word) >= tuning.junk_length for word in sentence.split())
            for terms, sentence in zip(doc.terms, doc.sentences)
        ]
    )
    return np.where(junk, scores - 100.0, scores)  # still rankable (a text of only such), but last


def _choose(doc: _Document, scores: np.ndarray, k: int, redundancy: float | None) -> list[int]:
    order = sorted(range(len(scores)), key=lambda i: (-scores[i], i))
    if redundancy is None:
        return order[:k]
    chosen: list[int] = []
    for i in order:
        if len(chosen) == k:
            break
        if all(float(doc.matrix[i] @ doc.matrix[j]) < redundancy for j in chosen):
            chosen.append(i)
    for i in order:  # everything left was redundant: fill up in rank order
        if len(chosen) == k:
            break
        if i not in chosen:
            chosen.append(i)
    return chosen


def rank_sentences(text: str, mode: int, k: int, tuning: Tuning = TUNING) -> list[str]:
    """The ``k`` best sentences of ``text`` for ``mode``, in text order."""
    doc = _Document(text)
    if not doc.sentences:
        return []
    chosen = _pick(doc, contract.Mode(mode), k, tuning)
    return [doc.sentences[i] for i in sorted(chosen)]


def _pick(doc: _Document, mode: contract.Mode, k: int, tuning: Tuning) -> list[int]:
    scores = _scores(doc, mode, tuning)
    redundancy = tuning.redundancy if mode == contract.Mode.ADVANCED else None
    return _choose(doc, scores, k, redundancy)


def _heading(doc: _Document, rows: list[int], used: set[str]) -> str:
    """A short heading: the group's key terms (frequent in the whole text, specific to it, present
    in the group), in the text's own spelling; terms another heading used already come last."""
    document_counts = Counter(term for terms in doc.terms for term in terms)
    surface: dict[str, str] = {}
    for row in rows:
        for word in _TOKEN.findall(doc.sentences[row]):
            lowered = word.lower().replace("’", "'")
            if lowered in _STOPWORDS or lowered.isdigit() or len(lowered) < 3:
                continue
            term = _stem(lowered)
            if term in doc.vocabulary:
                surface.setdefault(term, word if word[:1].isupper() else word.capitalize())

    def weight(term: str) -> tuple[bool, float, str]:
        return (term in used, -document_counts[term] * float(doc.idf[doc.vocabulary[term]]), term)

    top = sorted(surface, key=weight)[:3]
    used.update(top)
    return ", ".join(surface[t] for t in top) if top else "Summary"


def _topics(doc: _Document, chosen: list[int]) -> list[list[int]]:
    """Chosen sentences grouped into a few topics: each joins the most similar group seed."""
    n_groups = 1 if len(chosen) < 3 else min(4, max(2, round(math.sqrt(len(chosen)))))
    seeds = sorted(chosen[:n_groups])
    groups: dict[int, list[int]] = {seed: [] for seed in seeds}
    for row in sorted(chosen):
        best = max(seeds, key=lambda s: (float(doc.matrix[row] @ doc.matrix[s]), -abs(s - row)))
        groups[best].append(row)
    return [rows for _, rows in sorted(groups.items(), key=lambda kv: kv[1][0]) if rows]


def summarize(text: str, mode: int = 1, percentage: int = 4, type: str | None = None) -> str:
    """The summary of ``text`` as the service gives it, laid out for ``type``."""
    doc = _Document(text)
    if not doc.sentences:
        return ""
    summary_type = contract.parse_type(type)
    mode = contract.Mode(mode)
    if summary_type is contract.SummaryType.BEST_LINE:
        return doc.sentences[_pick(doc, mode, 1, TUNING)[0]]
    chosen = _pick(doc, mode, sentence_budget(len(doc.sentences), percentage), TUNING)
    if summary_type is contract.SummaryType.BULLETS:
        return "\n".join(f"- {doc.sentences[i]}" for i in sorted(chosen))
    if summary_type is contract.SummaryType.SUMMARY_2:
        sections: list[str] = []
        used: set[str] = set()
        for rows in _topics(doc, chosen):
            points = "\n".join(f"- {doc.sentences[i]}" for i in rows)
            sections.append(f"## {_heading(doc, rows, used)}\n{points}")
        return "\n\n".join(sections)
    return " ".join(doc.sentences[i] for i in sorted(chosen))
