"""What the load generator sends and when (localserve/bench/workloads.py): arrival processes,
request mixes, the prompts that ask for the pasted text back (edit, quote), and the multi-turn
conversations."""

from __future__ import annotations

import hashlib
import math
import re
import statistics

import numpy as np
import pytest

from localserve.bench.scenario import TOKENS_PER_WORD, pages
from localserve.bench.workloads import (
    EDIT_REQUEST,
    FIRST_PART,
    NEXT_PART,
    QUOTE_REQUEST,
    arrival_times,
    build_conversations,
    build_requests,
    estimate_prompt_tokens,
    turn_messages,
)


def test_poisson_arrivals_have_the_asked_rate():
    times = arrival_times(4000, rate=5.0, seed=1)
    gaps = np.diff(times)
    assert times[0] == 0.0
    assert statistics.mean(gaps) == pytest.approx(0.2, rel=0.05)
    assert statistics.stdev(gaps) / statistics.mean(gaps) == pytest.approx(1.0, rel=0.1)


def test_burstiness_below_one_makes_arrivals_burstier():
    smooth = np.diff(arrival_times(4000, rate=5.0, burstiness=4.0, seed=2))
    bursty = np.diff(arrival_times(4000, rate=5.0, burstiness=0.25, seed=2))
    for gaps in (smooth, bursty):
        assert gaps.mean() == pytest.approx(0.2, rel=0.1)  # same rate
    cv = lambda g: g.std() / g.mean()  # noqa: E731
    assert cv(smooth) == pytest.approx(0.5, rel=0.1)  # 1 / sqrt(shape)
    assert cv(bursty) == pytest.approx(2.0, rel=0.1)


def test_infinite_rate_sends_everything_at_once():
    assert arrival_times(5, rate=math.inf) == [0.0] * 5


def test_workloads_are_reproducible_and_mixed():
    a, b = build_requests("mixed", 200, seed=3), build_requests("mixed", 200, seed=3)
    assert a == b and a != build_requests("mixed", 200, seed=4)
    kinds = [r.kind for r in a]
    assert {"short", "long", "paste"} == set(kinds)
    assert 0.35 < kinds.count("short") / 200 < 0.65
    paste = next(r for r in a if r.kind == "paste")
    assert len(paste.prompt.split()) > 1500


def test_max_tokens_sets_every_requests_output_length():
    default = build_requests("mixed", 50, seed=2)
    capped = build_requests("mixed", 50, seed=2, max_tokens=96)
    assert {r.max_tokens for r in default} == {48, 320, 96}
    assert all(r.max_tokens == 96 for r in capped)
    assert [(r.kind, r.prompt) for r in capped] == [(r.kind, r.prompt) for r in default]
    with pytest.raises(ValueError, match="--max-tokens"):
        build_requests("short", 3, max_tokens=0)


def test_unknown_workload_is_refused():
    with pytest.raises(ValueError, match="--workload"):
        build_requests("everything", 3)


# --- the workloads that ask for the pasted text back (speculative decoding, issue 37) ----------


def _split(prompt: str, request: str) -> tuple[str, str]:
    """(the pasted text, the request after it)."""
    text, _, rest = prompt.rpartition(f"\n\n{request}")
    assert text and rest is not None
    return text, request + rest


def test_edit_requests_paste_one_to_three_thousand_tokens_and_name_real_corrections():
    a = build_requests("edit", 40, seed=5)
    assert a == build_requests("edit", 40, seed=5) and a != build_requests("edit", 40, seed=6)
    document = "\n\n".join(pages())
    sizes = []
    for r in a:
        assert r.kind == "edit" and r.max_tokens == 256
        text, request = _split(r.prompt, EDIT_REQUEST)
        assert text in document  # consecutive paragraphs of the shipped text
        sizes.append(len(text.split()) * TOKENS_PER_WORD)
        assert 1000 <= sizes[-1] <= 3100
        pairs = re.findall(r'replace "([^"]+)" with "([^"]+)"', request)
        assert 2 <= len(pairs) <= 3
        olds, news = zip(*pairs, strict=True)
        assert len(set(olds)) == len(olds) and len(set(news)) == len(news)
        words = set(re.findall(r"[A-Za-z]+", text))
        assert all(old in words for old in olds)  # each correction names a word of the text
        assert not any(new in words for new in news)  # ...and changes it to another
        assert request.endswith(".")
    assert max(sizes) - min(sizes) > 1000  # the slice's length varies per request


def test_quote_requests_paste_about_fifteen_hundred_tokens_and_ask_for_quotes():
    a = build_requests("quote", 20, seed=2)
    assert a == build_requests("quote", 20, seed=2) and a != build_requests("quote", 20, seed=3)
    document = "\n\n".join(pages())
    for r in a:
        assert r.kind == "quote" and r.max_tokens == 256
        text, request = _split(r.prompt, QUOTE_REQUEST)
        assert request == QUOTE_REQUEST and text in document
        assert 1500 <= len(text.split()) * TOKENS_PER_WORD <= 1700
    assert len({r.prompt for r in a}) > 5


@pytest.mark.parametrize(
    ("workload", "digest"), [("mixed", "70a8693c8fca12df"), ("chat", "dec69a1e14f4b27c")]
)
def test_the_older_workloads_draw_the_prompts_they_drew_before_edit_and_quote(workload, digest):
    # benchmarks' recorded figures depend on these prompts (digests taken at e857e43): a change
    # here is a change of every chat and mixed figure, to be made on purpose or not at all
    specs = [(r.kind, r.prompt, r.max_tokens) for r in build_requests(workload, 40, seed=0)]
    assert hashlib.sha256(repr(specs).encode()).hexdigest()[:16] == digest


# --- the conversation workload ------------------------------------------------------------------


def test_conversations_are_reproducible_and_read_the_text_part_by_part():
    a, b = build_conversations(3, 5, seed=7), build_conversations(3, 5, seed=7)
    assert a == b and a != build_conversations(3, 5, seed=8)
    for conv in a:
        assert len(conv.user_messages) == 5
        assert conv.user_messages[0].startswith(FIRST_PART)
        assert all(m.startswith(NEXT_PART) for m in conv.user_messages[1:])
        # each part is ~350 tokens of the document (the intro and the question aside)
        assert all(280 < len(m.split()) < 340 for m in conv.user_messages)
    with pytest.raises(ValueError, match="--turns"):
        build_conversations(2, 0)


def test_history_grows_to_about_2000_tokens_by_turn_5_and_each_prompt_extends_the_last():
    from localserve.serve.prompt import render_transcript

    reply = " ".join(["word"] * 40)  # a ~50-token reply
    for conv in build_conversations(4, 5, seed=1):
        replies = [f"{reply} {k}" for k in range(5)]
        sizes, previous = [], ""
        for turn in range(1, 6):
            messages = turn_messages(conv, replies, turn)
            assert len(messages) == 2 * turn - 1 and messages[-1][0] == "user"
            assert [m for r, m in messages if r == "assistant"] == replies[: turn - 1]
            text = render_transcript(messages)
            assert text.startswith(previous)  # the last turn's prompt is a prefix: reusable
            previous = text
            sizes.append(estimate_prompt_tokens(messages))
        assert all(b - a > 350 for a, b in zip(sizes, sizes[1:], strict=False))
        assert 1800 < sizes[-1] < 2300
    with pytest.raises(ValueError, match="turn 3 needs 2 replies"):
        turn_messages(conv, ["one"], 3)


def test_a_multiturn_request_is_the_4th_turn_of_a_file_edited_over_three():
    a, b = build_requests("multiturn", 2, seed=5), build_requests("multiturn", 2, seed=5)
    assert a == b and a[0] != a[1]
    spec = a[0]
    roles = [role for role, _ in spec.history]
    assert roles == ["user", "assistant"] * 3 and "Rename the variable" in spec.prompt
    versions = [text for role, text in spec.history if role == "assistant"]
    assert all(v.startswith("```python\n") for v in versions)
    # each reply repeats most of the last: one variable renamed, the rest the same lines
    for before, after in zip(versions, versions[1:], strict=False):
        same = set(before.splitlines()) & set(after.splitlines())
        assert 0.5 < len(same) / len(after.splitlines()) < 1.0
    assert 1500 < estimate_prompt_tokens([*spec.history, ("user", spec.prompt)]) < 4000


def test_a_json_request_asks_a_schema_for_values_its_page_holds():
    spec = build_requests("json", 1, seed=2)[0]
    assert spec.response_format["type"] == "json_schema"
    schema = spec.response_format["json_schema"]["schema"]
    assert set(schema["required"]) == {"name", "email", "address", "items", "note"}
    email = re.search(r"\(([^)]+@example\.org)\)", spec.prompt)
    assert email and "Customer's note:" in spec.prompt and spec.history == ()
