"""The local service's extractive summarizer: sentences scored, chosen, and laid out per type.

Mode 1 ("mini"): TF-IDF centroid similarity plus a position prior: one matrix-vector product.
Mode 2 ("full"): position-aware directed centrality over the sentence graph (after PacSum, Zheng &
Lapata 2019: similarity to later sentences counts for, to earlier ones against) plus the position
prior, then redundancy removal when choosing; at longer lengths its prior weakens, so the later
parts of a text are covered too. Sentences that are too short to say anything, or carry scraped
boilerplate (a "word" of 30+ letters), rank last.

Coherence, both modes: a sentence that opens with a reference it cannot resolve by itself (a
pronoun, a connective such as "But" or "However", a quote whose speaker is not in it) is taken only
together with the sentence before it, or not at all; mode 2 also accepts one whose pronoun the
sentence before it in the summary can resolve (a small coreference heuristic: that sentence names
someone). ``summary_2`` groups are headed by a noun phrase from the text (the group's most central
run of content words, in the text's own casing); ``best_line`` is the best sentence that stands
alone. Deterministic; needs only numpy. Weights were chosen on the validation splits by
``benchmarks/quality.py --tune``.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import dataclass

import numpy as np

from ..service import contract
from .sentences import split_sentences

__all__ = ["summarize", "rank_sentences", "sentence_budget", "Tuning", "dangles", "unresolved_share"]

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


# Words that, opening a sentence, point at something said before it.
_POINTERS = frozenset(
    """
    he she they it its his her their them him this these those that such there here
    but however also meanwhile still yet so then instead therefore thus hence moreover furthermore
    besides nevertheless nonetheless otherwise likewise similarly consequently accordingly indeed
    and or nor which whose another other others both either neither
    """.split()
)
_PERSONAL = frozenset("he she they his her their him them".split())
_OPENING_QUOTE = ('"', "“", "‘", "'")
_SPEECH = re.compile(
    r"\b(said|says|say|told|tells|added|asked|according|explained|wrote|writes|insisted|"
    r"claimed|warned|stated)\b",
    re.IGNORECASE,
)
_NAME = re.compile(r"(?<![.!?]\s)(?<!^)\b[A-Z][a-z]+(?:\s+[A-Z][a-z]+)*")


def dangles(sentence: str) -> bool:
    """Does ``sentence`` open with a reference it cannot resolve by itself: a pronoun, a
    connective, or a quote whose speaker is not named in it?"""
    stripped = sentence.lstrip()
    if stripped.startswith(_OPENING_QUOTE):
        return _SPEECH.search(stripped) is None
    first = _TOKEN.match(stripped)
    if first is None:
        return False
    word = first.group(0).lower().replace("’", "'")
    if word == "in" and stripped.lower().startswith(("in addition", "in contrast", "in turn", "in that")):
        return True
    return word in _POINTERS


def _names_someone(sentence: str) -> bool:
    """A name after the sentence's first word (a capitalized word not opening it): a likely antecedent."""
    return bool(_NAME.search(sentence))


def unresolved_share(chosen: list[int], sentences: list[str]) -> float:
    """The share of chosen sentences that open with a reference their summary leaves unresolved:
    the sentence before them in the text is not chosen."""
    picked = set(chosen)
    bad = sum(1 for i in chosen if dangles(sentences[i]) and i - 1 not in picked)
    return bad / len(chosen) if chosen else 0.0


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
    mode2_prior: float = 2.0  # mode 2 score: directed centrality + mode2_prior * prior
    backward_weight: float = -1.0  # mode 2: similarity to earlier sentences counts against
    forward_weight: float = 1.0  # mode 2: similarity to later sentences counts for
    edge_threshold: float = 0.1  # share of the similarity range under which an edge is dropped
    redundancy: float = 0.5  # mode 2 passes over a sentence this similar to one already chosen
    coverage: float = 0.15  # mode 2: each percentage step above 1 weakens the position prior by this share
    coherent: bool = True  # the coherence rule (off only to measure what it changes)
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


def _scores(doc: _Document, mode: contract.Mode, tuning: Tuning, percentage: int = 1) -> np.ndarray:
    n = len(doc.sentences)
    prior = _position_prior(n, tuning)
    if mode == contract.Mode.STANDARD:
        scores = _normalized(_centroid_scores(doc)) + tuning.mode1_prior * prior
    else:
        weight = tuning.mode2_prior * max(0.0, 1.0 - tuning.coverage * (percentage - 1))
        scores = _normalized(_directed_centrality(doc.similarities(), tuning)) + weight * prior
    junk = np.array(
        [
            len(terms) < tuning.min_terms or any(len(word) >= tuning.junk_length for word in sentence.split())
            for terms, sentence in zip(doc.terms, doc.sentences)
        ]
    )
    return np.where(junk, scores - 100.0, scores)  # still rankable (a text of only such), but last


class _Choice:
    """Sentences taken in rank order, ``k`` at most, keeping the summary coherent: a sentence that
    dangles comes with the one before it (when that one stands, and there is room) or not at all."""

    def __init__(
        self, doc: _Document, k: int, redundancy: float | None, resolve_names: bool, coherent: bool = True
    ) -> None:
        self.doc = doc
        self.k = k
        self.redundancy = redundancy
        self.resolve_names = resolve_names
        self.chosen: list[int] = []
        self.dangling = [coherent and dangles(s) for s in doc.sentences]

    def _redundant(self, i: int) -> bool:
        return self.redundancy is not None and any(
            float(self.doc.matrix[i] @ self.doc.matrix[j]) >= self.redundancy for j in self.chosen
        )

    def _resolved_by_summary(self, i: int) -> bool:
        """Mode 2's coreference heuristic: a personal pronoun the summary's sentence before it can
        resolve (that sentence names someone)."""
        first = _TOKEN.match(self.doc.sentences[i].lstrip())
        if not self.resolve_names or first is None or first.group(0).lower() not in _PERSONAL:
            return False
        before = [j for j in self.chosen if j < i]
        return bool(before) and _names_someone(self.doc.sentences[max(before)])

    def offer(self, i: int, *, check_redundancy: bool = True) -> None:
        if len(self.chosen) >= self.k or i in self.chosen or (check_redundancy and self._redundant(i)):
            return
        if not self.dangling[i] or i - 1 in self.chosen or self._resolved_by_summary(i):
            self.chosen.append(i)
        elif i > 0 and not self.dangling[i - 1] and self.k - len(self.chosen) >= 2:
            if not (check_redundancy and self._redundant(i - 1)):
                self.chosen.extend([i - 1, i])


def _choose(
    doc: _Document,
    scores: np.ndarray,
    k: int,
    redundancy: float | None,
    resolve_names: bool = False,
    coherent: bool = True,
) -> list[int]:
    order = sorted(range(len(scores)), key=lambda i: (-scores[i], i))
    choice = _Choice(doc, k, redundancy, resolve_names, coherent)
    for i in order:
        choice.offer(i)
    for i in order:  # what is left was redundant: fill up in rank order, still coherent
        choice.offer(i, check_redundancy=False)
    for i in order:  # a text of nothing but dangling sentences: take the best anyway
        if len(choice.chosen) < min(k, len(order)) and i not in choice.chosen:
            choice.chosen.append(i)
    return choice.chosen


def rank_sentences(text: str, mode: int, k: int, tuning: Tuning = TUNING) -> list[str]:
    """The ``k`` best sentences of ``text`` for ``mode``, in text order."""
    doc = _Document(text)
    if not doc.sentences:
        return []
    chosen = _pick(doc, contract.Mode(mode), k, tuning)
    return [doc.sentences[i] for i in sorted(chosen)]


def _pick(doc: _Document, mode: contract.Mode, k: int, tuning: Tuning, percentage: int = 1) -> list[int]:
    scores = _scores(doc, mode, tuning, percentage)
    advanced = mode == contract.Mode.ADVANCED
    return _choose(
        doc, scores, k, tuning.redundancy if advanced else None, resolve_names=advanced, coherent=tuning.coherent
    )


def _best_line(doc: _Document, mode: contract.Mode, tuning: Tuning) -> str:
    """The sentence that best stands alone: the best ranked of those that do not dangle, are not
    a quote fragment, and say enough (5 to 60 words); else simply the best ranked."""
    scores = _scores(doc, mode, tuning)
    order = sorted(range(len(scores)), key=lambda i: (-scores[i], i))
    for i in order:
        sentence = doc.sentences[i]
        words = len(sentence.split())
        if not dangles(sentence) and 5 <= words <= 60 and len(doc.terms[i]) >= tuning.min_terms:
            return sentence
    return doc.sentences[order[0]]


_CHUNK_WORD = re.compile(r"[^\W_][\w'’-]*", re.UNICODE)
# Common verbs, quantifiers and time words that a noun phrase does not run through (no tagger).
_NOT_IN_PHRASES = frozenset(
    """
    every many much few several last next first took take takes taken kept keep keeps away part made make
    makes get got gets went go goes gone came come comes left found told asked called put set per via
    thousands hundreds dozens million millions billion week weeks year years day days month months time
    times today yesterday tomorrow ago already almost around nearly about like well even back still
    near across along behind beside toward towards upon onto among
    """.split()
)


def _chunks(sentence: str) -> list[str]:
    """Runs of 2 to 4 content words in a row, as written: the sentence's candidate noun phrases
    (no tagger: stopwords, pointers, numbers, common verbs and time words, and lower-case words
    ending in -ed or -ly break a run)."""
    runs: list[list[str]] = [[]]
    for match in re.finditer(r"[^\W_][\w'’-]*|[^\w\s]", sentence):
        word = match.group(0)
        lowered = word.lower().replace("’", "'")
        if (
            not _CHUNK_WORD.fullmatch(word)
            or lowered in _STOPWORDS
            or lowered in _POINTERS
            or lowered in _NOT_IN_PHRASES
            or (word[:1].islower() and lowered.endswith(("ed", "ly")))  # likely a verb or an adverb
            or lowered.isdigit()
            or len(lowered) < 2
        ):
            runs.append([])
        else:
            runs[-1].append(word)
    out = []
    for run in runs:
        for size in (4, 3, 2):
            for start in range(0, len(run) - size + 1):
                out.append(" ".join(run[start : start + size]))
    return out


def _heading(doc: _Document, rows: list[int], used: set[str]) -> str:
    """The group's heading: a noun phrase from it (the run of content words whose terms weigh most
    in the whole text), in the text's own casing, not used by another group; a single key word
    only when the group has no run of two."""
    document_counts = Counter(term for terms in doc.terms for term in terms)

    def weight(phrase: str) -> float:
        terms = [t for t in _terms(phrase) if t in doc.vocabulary]
        if not terms:
            return 0.0
        total = sum(document_counts[t] * float(doc.idf[doc.vocabulary[t]]) for t in terms)
        return float(total / len(phrase.split()) ** 0.5)

    candidates = [c for row in rows for c in _chunks(doc.sentences[row]) if c.lower() not in used]
    if not candidates:
        candidates = [
            w
            for row in rows
            for w in _TOKEN.findall(doc.sentences[row])
            if w.lower() not in _STOPWORDS and w.lower() not in used and len(w) > 2
        ]
    if not candidates:
        return "Summary"
    best = max(candidates, key=lambda c: (weight(c), -len(c), c))
    used.add(best.lower())
    return best[:1].upper() + best[1:]


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
        return _best_line(doc, mode, TUNING)
    chosen = _pick(doc, mode, sentence_budget(len(doc.sentences), percentage), TUNING, percentage)
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
