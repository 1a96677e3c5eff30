"""Texts over the service's word limit: splitting them into parts, and the plan of map/reduce requests.

Pure planning, no I/O: the engine sends what this module says to send. Imports only the contract.

Part size. A part holds at most ``PART_WORDS`` = 4500 words, 10% under the service's 5000. How the
service counts words is not documented (``count_words`` splits on white space, an assumption): a text a
user gives us at 4990 words is their risk, but a part is our cut, and a part refused with a 422 fails
its row after the other parts were paid for. The same limit holds for every request this module
plans (reduce rounds, the last request, ``truncate_text``).

Splitting. A text of N words becomes the fewest parts that fit, ``ceil(N / max_words)``, so the
number of part requests depends on the word count alone: ``count_parts`` is exact without splitting
and a dry run can quote it. Within the slack that count leaves, each cut goes to the coarsest
boundary in reach (LangChain's ``RecursiveCharacterTextSplitter`` idea: paragraph first, then a
sentence end, then a line break, then any word boundary, for a 12,000-word line or a transcript
without punctuation), and among equally coarse ones to the one nearest an even share, so parts come
out balanced. (A period after "Mr" counts as a sentence end here: a boundary is only a preference.) Every cut is a run of white space: parts are exact substrings of the text, in order,
and together hold every word once; none is under ``MIN_WORDS`` (a short tail borrows from the part
before it). A text near a multiple of the limit leaves no slack, and is cut where the count says.

Part requests. Each part is summarized with ``part_params``: the row's mode (the tier the user chose
and pays for), the default type (plain sentences: bullets and headings add words that carry nothing
into the next step, ``best_line`` keeps one line per part) and percentage 6, the longest: the part
summaries are not the answer, only the material of the last request, so they should keep the most.

Reduce. The part summaries, joined in order with blank lines, are summarized once more with the
row's own parameters when they fit one request. When they do not, they are grouped (consecutive,
each group within the limit) and each group is summarized with ``part_params`` again: a tree, one
round at a time, until one request fits. ``reduce_plan`` runs these rules as a generator the engine
drives (it yields each round's requests and is sent their answers).

- Joined summaries under the minimum (the service returned a few words per part): no request is
  made, the joined text is the row's answer. The service would refuse it ("too short"), and it is
  already shorter than any summary it could give. It is then plain text, whatever the row's type.
- No round follows one that does not shrink: a round must bring its input down to at most
  ``SHRINK`` (3/4) of its words (the part round counts, against the text's words). Summaries at
  percentage 6 keep well under that (the local service keeps about 45% of the sentences); a round
  keeping more is making no progress worth paying for. Its output is then cut at a word boundary to
  fit one request, that request is the last, and the result says what was cut. The same cut applies
  to a single summary too long for any group. The ratio also bounds the rounds, so
  ``estimate_requests`` can give a true upper bound of reduce requests.

Replay. A dry run of a row whose parts are answered already (a job done before, the machine's store)
replays its reduce with the answers kept (``replay_reduce``): each round's requests are looked up as
the engine would look them up, so a reduce answered before is known to cost nothing, and the first
round with a request not kept is exact; only the rounds after it are a bound.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Generator
from dataclasses import dataclass
from fractions import Fraction
from itertools import islice

from ..service import contract

__all__ = [
    "PART_WORDS",
    "SHRINK",
    "split_text",
    "count_parts",
    "part_params",
    "join_summaries",
    "reduce_groups",
    "short_answer",
    "cut_to_fit",
    "truncate_text",
    "estimate_requests",
    "Round",
    "Reduced",
    "reduce_plan",
    "Replay",
    "replay_reduce",
]

PART_WORDS = 4500  # 10% headroom under contract.MAX_WORDS: see the module docstring
SHRINK = Fraction(3, 4)  # a round must keep at most this share of its input's words

_WORD = re.compile(r"\S+")  # the same runs of non-white-space as contract.count_words (str.split)
# A blank line (white space only between two line breaks) or a Unicode paragraph separator.
_PARAGRAPH_GAP = re.compile(r"(?:\r\n|[\n\r\u2028])[^\S\r\n\u2028]*(?:\r\n|[\n\r\u2028])|\u2029")
_LINE_GAP = re.compile(r"[\n\r\u2028\u2029\x0b\x0c\x85]")
# Terminal punctuation at a word's end, with any closing quotes or brackets after it.
_SENTENCE_END = re.compile(r"[.!?…。！？][\"'”’»)\]]*\Z")
_PARAGRAPH, _SENTENCE, _LINE, _WORD_BOUNDARY = range(4)  # boundary ranks, coarsest first


def _check_max_words(max_words: int) -> None:
    # Below twice the minimum, two parts of at least MIN_WORDS may not fit where a text needs them.
    if not 2 * contract.MIN_WORDS <= max_words <= contract.MAX_WORDS:
        raise ValueError(f"max_words must be from {2 * contract.MIN_WORDS} to {contract.MAX_WORDS}, not {max_words}")


def _parts_for(word_count: int, max_words: int) -> int:
    return 0 if word_count <= 0 else math.ceil(word_count / max_words)


def count_parts(text: str, *, max_words: int = PART_WORDS) -> int:
    """How many parts ``split_text(text, max_words=max_words)`` returns, without splitting."""
    _check_max_words(max_words)
    return _parts_for(contract.count_words(text), max_words)


def _boundary_rank(text: str, word_start: int, word_end: int, next_start: int) -> int:
    """How coarse the white space between one word (``text[word_start:word_end]``) and the next is."""
    gap = text[word_end:next_start]
    if len(gap) > 1 and _PARAGRAPH_GAP.search(gap):
        return _PARAGRAPH
    # The last few characters are enough: the end mark and a few closers (a "word" may be huge).
    if _SENTENCE_END.search(text, max(word_start, word_end - 8), word_end):
        return _SENTENCE
    if _LINE_GAP.search(gap):
        return _LINE
    return _WORD_BOUNDARY


def split_text(text: str, *, max_words: int = PART_WORDS) -> list[str]:
    """``text`` in the fewest parts of at most ``max_words`` words, cut at the coarsest boundaries.

    Each part is an exact substring of ``text`` from a word's first character to a word's last, in
    order; between them only white space is dropped, so the parts' words are the text's words, each
    once. Every part has at least ``contract.MIN_WORDS`` words when there are two or more. A text
    that fits comes back whole (stripped) as one part, whatever its length; an empty one as ``[]``.
    ``len(split_text(text)) == count_parts(text)``. Raises ValueError for a ``max_words`` outside
    ``2 * MIN_WORDS .. MAX_WORDS``.
    """
    _check_max_words(max_words)
    spans = [match.span() for match in _WORD.finditer(text)]
    n_words = len(spans)
    n_parts = _parts_for(n_words, max_words)
    if n_parts <= 1:
        return [text[spans[0][0] : spans[-1][1]]] if spans else []

    def rank(cut: int) -> int:  # the boundary before word ``cut``
        return _boundary_rank(text, spans[cut - 1][0], spans[cut - 1][1], spans[cut][0])

    minimum = contract.MIN_WORDS
    cuts = [0]
    for parts_after in range(n_parts - 1, 0, -1):
        previous = cuts[-1]
        # Any cut in [low, high] leaves this part and all later ones a feasible size.
        low = max(previous + minimum, n_words - parts_after * max_words)
        high = min(previous + max_words, n_words - parts_after * minimum)
        even = previous + round((n_words - previous) / (parts_after + 1))
        cuts.append(min(range(low, high + 1), key=lambda cut: (rank(cut), abs(cut - even), cut)))
    cuts.append(n_words)
    return [text[spans[first][0] : spans[last - 1][1]] for first, last in zip(cuts, cuts[1:])]


def part_params(params: contract.Params) -> contract.Params:
    """The parameters of a part request and of an intermediate reduce round: the row's mode, the
    default type, percentage 6 (the module docstring says why)."""
    return contract.Params(params.mode, contract.PERCENTAGE_MAX, None)


def join_summaries(summaries: list[str]) -> str:
    """The summaries in order, stripped, separated by a blank line; empty ones left out."""
    return "\n\n".join(summary.strip() for summary in summaries if summary.strip())


def reduce_groups(summaries: list[str], *, max_words: int = PART_WORDS) -> list[list[str]]:
    """Consecutive summaries packed greedily into groups whose joined text has at most ``max_words``
    words; a summary longer than that is a group alone (``reduce_plan`` cuts it to fit)."""
    groups: list[list[str]] = []
    words_in_last = 0
    for summary in summaries:
        words = contract.count_words(summary)
        if groups and words_in_last + words <= max_words:
            groups[-1].append(summary)
            words_in_last += words
        else:
            groups.append([summary])
            words_in_last = words
    return groups


def short_answer(summaries: list[str]) -> str | None:
    """The joined summaries when they are under the service's minimum: then they are the row's answer,
    with no further request (the service would refuse them). None when they can be summarized."""
    joined = join_summaries(summaries)
    return joined if contract.count_words(joined) < contract.MIN_WORDS else None


def _end_of_word(text: str, max_words: int) -> int | None:
    """The index just past word ``max_words`` when more words follow it; None when the text fits."""
    if max_words < 1:
        raise ValueError(f"max_words must be at least 1, not {max_words}")
    last = next(islice(_WORD.finditer(text), max_words - 1, max_words), None)
    if last is None or _WORD.search(text, last.end()) is None:
        return None
    return last.end()


def cut_to_fit(text: str, *, max_words: int = PART_WORDS) -> tuple[str, bool]:
    """``text`` up to its ``max_words``-th word, with its own spacing, and whether anything was cut."""
    end = _end_of_word(text, max_words)
    return (text, False) if end is None else (text[:end], True)


def truncate_text(text: str, *, max_words: int = PART_WORDS) -> str:
    """The first ``max_words`` words of ``text`` as written (for the ``truncate`` policy)."""
    return cut_to_fit(text, max_words=max_words)[0]


def estimate_requests(word_count: int, *, max_words: int = PART_WORDS) -> tuple[int, int]:
    """(part requests, an upper bound of reduce requests) for a text of ``word_count`` words.

    The first is exact: ``len(split_text(text))``. A text of one part is one ordinary request (with
    the row's own parameters) and needs no reduce. The bound holds whatever the service returns,
    because of the shrink rule: each round keeps at most ``SHRINK`` of its input's words or is the
    last, and greedy groups are fewer than ``2 * words / max_words + 1``. It is the worst case
    (summaries as long as the rule allows); real summaries need fewer.
    """
    _check_max_words(max_words)
    parts = _parts_for(word_count, max_words)
    if parts <= 1:
        return parts, 0
    requests = 0
    summaries, words = parts, math.floor(word_count * SHRINK)  # after the part round
    while words > max_words:
        summaries = min(summaries, math.ceil(2 * words / max_words))  # this round's groups
        requests += summaries
        words = math.floor(words * SHRINK)
    return parts, requests + 1  # the last request


@dataclass(frozen=True)
class Round:
    """One round of reduce requests: send each of ``texts`` with ``params`` (they can go at once),
    then send ``reduce_plan`` the answers in the same order."""

    texts: list[str]
    params: contract.Params
    final: bool  # the last request: the row's own parameters, its answer is the row's answer


@dataclass(frozen=True)
class Reduced:
    """What a row's reduce came to: its answer, how many reduce requests it took, and whether some
    summary text was cut to fit (``note`` says what, for the row's result)."""

    text: str
    requests: int
    cut: bool
    note: str | None


def _fits(text: str, max_words: int) -> tuple[str, int]:
    """``text`` cut to fit one request, and how many words were cut."""
    kept, was_cut = cut_to_fit(text, max_words=max_words)
    return kept, (contract.count_words(text) - max_words if was_cut else 0)


def reduce_plan(
    summaries: list[str], text_words: int, params: contract.Params, *, max_words: int = PART_WORDS
) -> Generator[Round, list[str], Reduced]:
    """The reduce of one row's part summaries (in order; ``text_words`` is the text's word count,
    ``params`` the row's own). Drive it with ``next`` for the first round and ``send(answers)`` for
    each next one; it returns (``StopIteration.value``) the ``Reduced`` result::

        plan = reduce_plan(part_summaries, count_words(text), row_params)
        try:
            round = next(plan)
            while True:
                round = plan.send([summarize(t, round.params) for t in round.texts])
        except StopIteration as done:
            reduced = done.value
    """
    _check_max_words(max_words)
    requests, words_cut = 0, 0
    words_before = text_words
    current = [summary.strip() for summary in summaries if summary.strip()]
    note: str | None
    while True:
        joined = join_summaries(current)
        words = contract.count_words(joined)
        if words < contract.MIN_WORDS:
            note = f"the summaries came to {words} words, under the service's minimum: they are the answer"
            return Reduced(joined, requests, words_cut > 0, note)
        if words <= max_words or words > words_before * SHRINK:
            # The last request: the summaries fit it, or the round before made too little progress
            # to be worth another (then what does not fit is cut, and the result says so).
            last, cut_here = _fits(joined, max_words)
            answers = yield Round([last], params, final=True)
            if len(answers) != 1:
                raise ValueError(f"the last request was sent {len(answers)} answers")
            requests += 1
            note = None
            if cut_here:
                note = (
                    f"the summaries stopped shrinking at {words} words; "
                    f"the last {cut_here} were cut before the last request"
                )
            elif words_cut:
                note = f"{words_cut} words of a summary too long for one request were cut"
            return Reduced(answers[0], requests, bool(words_cut or cut_here), note)
        # A round: each group within the limit; a group under the minimum is not sent, it stands for
        # itself in the next round (the service would refuse it, and it is short already).
        groups = [join_summaries(group) for group in reduce_groups(current, max_words=max_words)]
        to_send = [i for i, group in enumerate(groups) if contract.count_words(group) >= contract.MIN_WORDS]
        texts = []
        for i in to_send:
            kept, cut_here = _fits(groups[i], max_words)
            words_cut += cut_here
            texts.append(kept)
        answers = yield Round(texts, part_params(params), final=False)
        if len(answers) != len(texts):
            raise ValueError(f"a round of {len(texts)} requests was sent {len(answers)} answers")
        requests += len(texts)
        for i, answer in zip(to_send, answers):
            groups[i] = answer.strip()
        words_before = words
        current = [group for group in groups if group]


@dataclass(frozen=True)
class Replay:
    """What a row's reduce would still send (``replay_reduce``): ``to_send``, the requests (text,
    parameters) of the first round with an answer not kept, exact; then at most ``more`` reduce
    requests in the rounds after it (0: that round is the last, or the row ends there)."""

    to_send: list[tuple[str, contract.Params]]
    more: int


# What a reduce request's answer is, kept: (answered, its summary), a refusal (False, ""), or None
# when nothing is kept for it.
Kept = Callable[[str, contract.Params], tuple[bool, str] | None]


def replay_reduce(
    summaries: list[str], text_words: int, params: contract.Params, kept: Kept, *, max_words: int = PART_WORDS
) -> Replay:
    """The reduce of one row whose ``summaries`` (its parts', in order) are known, driven with the
    answers ``kept`` holds for its requests, as the engine drives it: a round wholly kept goes on to
    the next; the first round with a request not kept is what would be sent (the round's other
    requests are kept, and cost nothing); a refusal kept ends the row after its round."""
    plan = reduce_plan(summaries, text_words, params, max_words=max_words)
    bound = estimate_requests(text_words, max_words=max_words)[1]
    done = 0
    try:
        step = next(plan)
        while True:
            looked = [kept(text, step.params) for text in step.texts]
            refused = any(found is not None and not found[0] for found in looked)
            missing = [(text, step.params) for text, found in zip(step.texts, looked) if found is None]
            if missing:
                more = 0 if step.final or refused else max(0, bound - done - len(step.texts))
                return Replay(missing, more)
            if refused:
                return Replay([], 0)
            done += len(step.texts)
            step = plan.send([found[1] for found in looked if found is not None])
    except StopIteration:
        return Replay([], 0)
