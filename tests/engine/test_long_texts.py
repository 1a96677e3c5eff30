"""Long texts: splitting keeps every word once within the limits; the map/reduce plan's rules and bounds."""

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from batchsum.engine.long_texts import (
    PART_WORDS,
    Reduced,
    count_parts,
    cut_to_fit,
    estimate_requests,
    join_summaries,
    part_params,
    reduce_groups,
    reduce_plan,
    short_answer,
    split_text,
    truncate_text,
)
from batchsum.service import contract

ROW = contract.parse_params(2, 2, "bullets")


def assert_a_good_split(text, parts, max_words):
    assert [word for part in parts for word in part.split()] == text.split()  # nothing lost or repeated
    position = 0
    for part in parts:  # exact substrings, in order, between them only white space
        found = text.find(part, position)
        assert found >= position and not text[position:found].strip()
        position = found + len(part)
    assert not text[position:].strip()
    assert (
        len(parts)
        == count_parts(text, max_words=max_words)
        == estimate_requests(len(text.split()), max_words=max_words)[0]
    )
    if len(parts) > 1:
        assert all(contract.MIN_WORDS <= contract.count_words(part) <= max_words for part in parts)


# Words, white-space runs of every kind (blank lines, tabs, Unicode spaces, the separators str.split
# knows), sentence ends, and none of those at all.
_WORDS = st.one_of(
    st.sampled_from(["word", "Sentence.", "end!", "“quoted.”", "(aside.)", "Mr.", "a", "東京の駅", "x" * 40]),
    st.text(st.characters(blacklist_categories=["Cs", "Zs", "Zl", "Zp", "Cc"]), min_size=1, max_size=6),
)
_GAPS = st.sampled_from([" ", "  ", "\n", "\n\n", " \n \t\n", "\t", "\u00a0", "\u2003", "\u2029", "\r\n\r\n", "\x1c"])


@st.composite
def texts(draw):
    words = draw(st.lists(_WORDS, min_size=0, max_size=400))
    gaps = draw(st.lists(_GAPS, min_size=len(words) + 1, max_size=len(words) + 1))
    glue = draw(st.sampled_from(["mixed", "spaces only"]))
    if glue == "spaces only":  # no boundary but words: one long line without punctuation
        gaps = [" "] * len(gaps)
    return gaps[0] + "".join(word + gap for word, gap in zip(words, gaps[1:]))


@given(texts(), st.integers(2 * contract.MIN_WORDS, 90))
@settings(max_examples=400, deadline=None)
def test_splitting_any_text_loses_and_repeats_no_word_and_every_part_is_within_the_limits(text, max_words):
    assert_a_good_split(text, split_text(text, max_words=max_words), max_words)


def test_a_12000_word_line_without_punctuation_splits_at_word_boundaries_into_even_parts():
    text = " ".join(f"w{i}" for i in range(12_000))
    parts = split_text(text)
    assert_a_good_split(text, parts, PART_WORDS)
    assert [contract.count_words(part) for part in parts] == [4000, 4000, 4000]


def test_31000_words_in_paragraphs_are_cut_between_paragraphs():
    paragraph = " ".join(["The harbour bridge will reopen in spring."] * 16)  # 112 words
    text = "\n\n".join(f"Part {i}. {paragraph}" for i in range(270))  # 270 * 114 = 30,780 words
    text += "\n\n" + " ".join(["More words here."] * 74)  # 31,002 in all
    assert contract.count_words(text) == 31_002
    parts = split_text(text)
    assert_a_good_split(text, parts, PART_WORDS)
    assert len(parts) == 7
    for part in parts[:-1]:
        assert text[text.index(part) + len(part) :].startswith("\n\nPart ")  # each ends where a paragraph does


def test_a_text_of_sentences_without_paragraphs_is_cut_after_sentence_ends():
    text = " ".join(f"Sentence number {i} says a little more here." for i in range(1000))  # 8000 words
    parts = split_text(text)
    assert_a_good_split(text, parts, PART_WORDS)
    assert len(parts) == 2 and all(part.endswith(".") for part in parts)


def test_a_tail_of_three_words_is_not_a_part_of_its_own():
    text = " ".join(["word"] * (2 * PART_WORDS + 3))
    parts = split_text(text)
    assert_a_good_split(text, parts, PART_WORDS)
    assert len(parts) == 3 and min(contract.count_words(part) for part in parts) >= contract.MIN_WORDS
    # the same when the paragraph structure puts three words at the end
    text = " ".join(["word"] * PART_WORDS) + "\n\nthree last words"
    parts = split_text(text)
    assert_a_good_split(text, parts, PART_WORDS)
    assert len(parts) == 2 and contract.count_words(parts[1]) >= contract.MIN_WORDS


@pytest.mark.parametrize("extra", [1, 2, 9, 10, 11, 500, 501])
def test_texts_just_over_the_limit(extra):
    for total in (PART_WORDS + extra, contract.MAX_WORDS + extra):
        text = "\n".join(" ".join(["word."] * 7) for _ in range(total // 7)) + " end" * (total % 7)
        assert contract.count_words(text) == total
        parts = split_text(text)
        assert_a_good_split(text, parts, PART_WORDS)
        assert len(parts) == 2


def test_a_text_that_fits_is_one_stripped_part_and_an_empty_one_none():
    assert split_text("  a few words here \n") == ["a few words here"]
    assert split_text(" \n\t ") == [] and count_parts("") == 0 and estimate_requests(0) == (0, 0)
    assert estimate_requests(PART_WORDS) == (1, 0)


def test_max_words_outside_the_limits_is_refused():
    for bad in (2 * contract.MIN_WORDS - 1, contract.MAX_WORDS + 1):
        with pytest.raises(ValueError, match="max_words"):
            split_text("a b c", max_words=bad)


def test_part_params_keep_the_mode_and_ask_for_the_longest_plain_summary():
    assert part_params(ROW) == contract.Params(contract.Mode.ADVANCED, 6, None)
    assert part_params(contract.parse_params(1, 1, "best_line")).mode == contract.Mode.STANDARD


def test_summaries_are_joined_in_order_by_blank_lines_and_grouped_within_the_limit():
    assert join_summaries([" one. ", "", "two.\n"]) == "one.\n\ntwo."
    summaries = [" ".join(["w"] * n) for n in (15, 10, 10, 30, 5, 25)]
    groups = reduce_groups(summaries, max_words=30)
    assert groups == [summaries[0:2], summaries[2:3], summaries[3:4], summaries[4:6]]
    assert [s for g in groups for s in g] == summaries


def test_joined_summaries_under_the_minimum_are_the_answer_without_a_request():
    assert short_answer(["Bridge shut.", "Ferry runs."]) == "Bridge shut.\n\nFerry runs."
    assert short_answer(["one two three four five", "six seven eight nine ten"]) is None
    plan = reduce_plan(["Bridge shut.", "Ferry runs."], 9000, ROW)
    with pytest.raises(StopIteration) as done:
        next(plan)
    assert done.value.value == Reduced("Bridge shut.\n\nFerry runs.", 0, False, done.value.value.note)
    assert "under the service's minimum" in done.value.value.note


def test_cut_to_fit_and_truncate_keep_the_prefix_as_written():
    text = "  one\ttwo\n\nthree  four five "
    assert cut_to_fit(text, max_words=3) == ("  one\ttwo\n\nthree", True)
    assert cut_to_fit(text, max_words=5) == (text, False)
    assert truncate_text(text, max_words=4) == "  one\ttwo\n\nthree  four"
    long = " ".join(["word"] * (contract.MAX_WORDS + 10))
    assert contract.count_words(truncate_text(long)) == PART_WORDS


# -- the reduce, driven by a fake service ------------------------------------------------------------


def fake_summarize(keep):
    """A service that keeps the first ``keep`` share of the words (at least one)."""

    def summarize(text, params):
        words = text.split()
        assert contract.MIN_WORDS <= len(words) <= PART_WORDS, "a request outside the limits"
        return " ".join(words[: max(1, math.floor(len(words) * keep))])

    return summarize


def run(text, params, summarize):
    """Map and reduce one text as the engine will: the parts, then the reduce plan's rounds."""
    parts = split_text(text)
    summaries = [summarize(part, part_params(params)) for part in parts]
    plan = reduce_plan(summaries, contract.count_words(text), params)
    rounds = []
    try:
        step = next(plan)
        while True:
            rounds.append(step)
            step = plan.send([summarize(t, step.params) for t in step.texts])
    except StopIteration as done:
        return parts, rounds, done.value


@pytest.mark.parametrize("keep", [0.05, 0.2, 0.45, 0.6, 0.75, 0.9, 1.0])
@pytest.mark.parametrize("words", [5001, 9000, 9001, 31_000, 120_000])
def test_the_estimate_is_exact_for_parts_and_bounds_the_reduce_requests(words, keep):
    text = " ".join(f"w{i}" for i in range(words))
    parts, rounds, reduced = run(text, ROW, fake_summarize(keep))
    estimated_parts, most_reduces = estimate_requests(words)
    assert estimated_parts == len(parts)
    assert reduced.requests == sum(len(r.texts) for r in rounds) <= most_reduces
    assert rounds[-1].final and rounds[-1].params == ROW and all(r.params == part_params(ROW) for r in rounds[:-1])
    assert reduced.text == fake_summarize(keep)(rounds[-1].texts[0], ROW)  # the last answer is the row's answer


def test_a_round_that_does_not_shrink_is_not_repeated_its_output_is_cut_and_the_result_says_so():
    text = " ".join(f"w{i}" for i in range(20_000))
    parts, rounds, reduced = run(text, ROW, fake_summarize(1.0))  # an echo: nothing ever shrinks
    assert len(rounds) == 1 and rounds[0].final
    assert contract.count_words(rounds[0].texts[0]) == PART_WORDS
    assert reduced.cut and "stopped shrinking" in reduced.note


def test_a_shrinking_reduce_is_a_tree_and_cuts_nothing():
    text = " ".join(f"w{i}" for i in range(100_000))
    parts, rounds, reduced = run(text, ROW, fake_summarize(0.45))
    assert len(rounds) >= 2 and not reduced.cut and reduced.note is None
    sizes = [len(r.texts) for r in rounds]
    assert sizes == sorted(sizes, reverse=True) and sizes[-1] == 1
    # the first round holds every part summary once, in order: nothing skipped or cut
    summaries = [fake_summarize(0.45)(part, ROW) for part in parts]
    assert " ".join(rounds[0].texts).split() == join_summaries(summaries).split()


def test_a_reduce_that_fits_is_one_request_with_the_rows_own_parameters():
    text = " ".join(f"w{i}" for i in range(9000))
    parts, rounds, reduced = run(text, ROW, fake_summarize(0.45))
    assert len(parts) == 2 and len(rounds) == 1 and rounds[0].params == ROW and reduced.requests == 1
    assert rounds[0].texts == [join_summaries([" ".join(p.split()[: math.floor(4500 * 0.45)]) for p in parts])]


def test_a_summary_longer_than_any_request_is_cut_to_fit_and_said():
    long = " ".join(["long"] * (PART_WORDS + 100))
    plan = reduce_plan([long, "short summary of the second part with enough words in it"], 40_000, ROW)
    step = next(plan)
    assert not step.final and [contract.count_words(t) for t in step.texts] == [PART_WORDS, 11]
    step = plan.send(["a b c d e f g h i j k l", "m n o p q r s t u v"])
    assert step.final and step.params == ROW
    with pytest.raises(StopIteration) as done:
        plan.send(["the answer"])
    assert done.value.value.cut and done.value.value.text == "the answer" and "100 words" in done.value.value.note


@given(st.integers(PART_WORDS + 1, 40_000), st.data())
@settings(max_examples=50, deadline=None)
def test_whatever_the_service_returns_every_request_fits_and_the_bound_holds(words, data):
    """Summaries of any length, even longer than their input: no request outside the limits, and
    never more reduce requests than estimate_requests says."""
    text = " ".join(["w"] * words)

    def summarize(request, params):
        n = contract.count_words(request)
        assert contract.MIN_WORDS <= n <= PART_WORDS
        return " ".join(["s"] * math.floor(n * data.draw(st.floats(0, 1.3), label="kept")))

    parts, rounds, reduced = run(text, ROW, summarize)
    assert len(parts) == estimate_requests(words)[0]
    assert reduced.requests == sum(len(r.texts) for r in rounds) <= estimate_requests(words)[1]
    assert all(r.params == part_params(ROW) for r in rounds if not r.final)
    if rounds and not rounds[-1].final:  # the last round's answers came to under the minimum
        assert reduced.text == join_summaries(reduced.text.split("\n\n")) and "minimum" in reduced.note
    else:
        assert not rounds or rounds[-1].params == ROW
