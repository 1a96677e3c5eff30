"""A fast rule-based sentence splitter: abbreviations, initials, decimals, quotes and brackets.

One regular-expression pass finds candidate ends (``.``, ``!``, ``?``, ``…`` with any closing quotes
or brackets, then white space, then something that can open a sentence); a few rules veto the ones
that follow an abbreviation or an initial. A 5000-word text splits in about a millisecond.

A run of more than ``LONG_RUN`` (40) words without a sentence end (a transcript without punctuation,
scraped text whose full stops were lost) is cut into pseudo-sentences of about ``PSEUDO_WORDS`` (25)
words at word boundaries, after a comma, semicolon, colon or dash where one is near, so that a
summary of such text picks some of it instead of returning it whole.
"""

from __future__ import annotations

import re

__all__ = ["split_sentences", "LONG_RUN", "PSEUDO_WORDS"]

LONG_RUN = 40  # more words than this without a sentence end are cut into pseudo-sentences
PSEUDO_WORDS = 25  # about this many words each: a long sentence's length, ranked and chosen like one
_CLAUSE_SLACK = 5  # how far (in words) a cut may move from an even share to land after a clause mark

# Words that end with a period without ending a sentence (compared lower-cased, without the period).
_ABBREVIATIONS = frozenset(
    """
    mr mrs ms dr prof sr jr st mt ft rev hon gen col maj capt cpt lt sgt cmdr adm gov sen rep pres
    supt insp det pc cllr messrs mme mlle
    jan feb mar apr jun jul aug sep sept oct nov dec mon tue tues wed thu thur thurs fri sat sun
    vs etc cf al approx dept est fig figs inc ltd co corp bros llc plc no nos vol vols pp ed eds
    ave blvd rd hwy e.g i.e a.m p.m u.s u.k u.n e.u d.c l.a n.y a.k.a ph.d b.a m.a b.sc m.sc
    """.split()
)

# A candidate end: terminal punctuation, optional closing quotes/brackets, white space, and a
# sentence opener (opening quote/bracket, capital letter, digit, or a list marker).
_CANDIDATE = re.compile(
    r"""
    (?P<end>[.!?…]+[\"'”’)\]]*)            # the end and anything that closes after it
    (?P<gap>\s+)                           # the white space between sentences
    (?=[\"'“‘(\[]?[A-Z0-9À-ÖØ-Þ\u0400-\u042f\u0391-\u03a9•\-–—*])   # what opens the next one
    """,
    re.VERBOSE,
)
_PARAGRAPH = re.compile(r"\n\s*\n|\n(?=\s*(?:[-*•–]|\d+[.)])\s)")
_WORD_BEFORE = re.compile(r"([\w.]+)$")
_WORD = re.compile(r"\S+")
_CLAUSE_END = re.compile(r"(?:[,;:]|[.!?…][\"'”’)\]]*|[-–—])\Z")


def _is_false_end(text: str, end_at: int, punct: str) -> bool:
    """True when the period at ``end_at`` belongs to an abbreviation or an initial."""
    if not punct.startswith("."):
        return False
    match = _WORD_BEFORE.search(text, max(0, end_at - 32), end_at)
    if not match:
        return False
    word = match.group(1).strip(".")
    lowered = word.lower()
    if lowered in _ABBREVIATIONS:
        return True
    if len(word) == 1 and word.isalpha() and word.isupper():  # an initial: "J. K. Rowling"
        return True
    # Dotted acronyms such as "U.S." or "a.m." not in the list: letters separated by periods.
    return bool(re.fullmatch(r"(?:[A-Za-z]\.)+[A-Za-z]", word))


def _add(sentence: str, out: list[str]) -> None:
    """Append ``sentence``, or its pseudo-sentences when it is a run too long to be one."""
    spans = [match.span() for match in _WORD.finditer(sentence)]
    if len(spans) <= LONG_RUN:
        out.append(sentence)
        return
    pieces = max(2, round(len(spans) / PSEUDO_WORDS))
    start = 0  # index of the first word of the current pseudo-sentence
    for piece in range(1, pieces):
        even = round(piece * len(spans) / pieces)
        nearby = range(max(start + 1, even - _CLAUSE_SLACK), min(len(spans) - 1, even + _CLAUSE_SLACK) + 1)
        # After a clause mark when one is near (the nearest such), else at the even share.
        marked = [cut for cut in nearby if _CLAUSE_END.search(sentence, spans[cut - 1][0], spans[cut - 1][1])]
        cut = min(marked, key=lambda c: (abs(c - even), c)) if marked else even
        out.append(sentence[spans[start][0] : spans[cut - 1][1]])
        start = cut
    out.append(sentence[spans[start][0] : spans[-1][1]])


def _split_block(block: str, out: list[str]) -> None:
    start = 0
    for match in _CANDIDATE.finditer(block):
        end_at = match.start("end")
        if _is_false_end(block, end_at, match.group("end")):
            continue
        sentence = block[start : match.end("end")].strip()
        if sentence:
            _add(sentence, out)
        start = match.end("gap")
    tail = block[start:].strip()
    if tail:
        _add(tail, out)


def split_sentences(text: str) -> list[str]:
    """The sentences of ``text`` in order, each stripped; blank lines and list items also split."""
    out: list[str] = []
    for block in _PARAGRAPH.split(text):
        block = " ".join(block.split()) if "\n" in block else block.strip()
        if block:
            _split_block(block, out)
    return out
