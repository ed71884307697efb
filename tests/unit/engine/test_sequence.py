"""A sequence's life (localserve/engine/sequence.py): its tokens, how it finishes, its timings."""

from __future__ import annotations

import math

import pytest

from localserve.engine.sampling_params import SamplingParams
from localserve.engine.sequence import FinishReason, Sequence, Status

EOG = 1  # any token id: the runner tells end-of-generation through `is_eog`


def make_seq(prompt_len: int = 3, arrival: float = 0.0, max_total: int = 1 << 30, **params):
    return Sequence(
        "r1",
        list(range(10, 10 + prompt_len)),
        SamplingParams(**params),
        user="alice",
        arrival_time=arrival,
        max_total_tokens=max_total,
    )


def feed(seq: Sequence, *pieces: str, start: float = 1.0, step: float = 1.0) -> str:
    """Append one non-EOG token per piece at start, start+step, ...; return the streamed text."""
    for i, piece in enumerate(pieces):
        seq.append_token(100 + i, piece.encode(), False, start + i * step)
    return seq.take_text()


def eog(seq: Sequence, piece: bytes, at: float) -> str:
    """Append an end-of-generation token; return the text it releases."""
    seq.append_token(EOG, piece, True, at)
    return seq.take_text()


# --- Sequence.append_token -------------------------------------------------------------------


def test_empty_prompt_raises_value_error():
    with pytest.raises(ValueError, match="prompt"):
        Sequence("r1", [], SamplingParams())


def test_new_sequence_is_waiting_with_its_prompt():
    seq = make_seq(prompt_len=4)
    assert seq.status is Status.WAITING
    assert seq.num_prompt_tokens == 4
    assert seq.num_output_tokens == 0
    assert seq.num_remaining == 4 and seq.is_prefilling


def test_tokens_stream_their_text():
    seq = make_seq()
    assert feed(seq, "Hel", "lo") == "Hello"
    assert not seq.is_finished
    assert seq.num_output_tokens == 2


def test_eog_finishes_with_stop_and_is_counted_but_not_streamed():
    seq = make_seq()
    feed(seq, "Hi")
    assert eog(seq, b"<end_of_turn>", 5.0) == ""
    assert seq.finish_reason is FinishReason.STOP
    assert seq.status is Status.FINISHED
    assert seq.finished_time == 5.0
    assert seq.num_output_tokens == 2
    assert seq.tokens[-1] == EOG
    assert seq.stream.text == "Hi"


def test_eog_flushes_text_held_back_for_a_stop_string():
    seq = make_seq(stop=("END",))
    assert feed(seq, "so EN") == "so "
    assert eog(seq, b"", 5.0) == "EN"


def test_ignore_eos_keeps_generating_past_eog():
    seq = make_seq(ignore_eos=True)
    assert eog(seq, b"<eos>", 1.0) == "<eos>"
    assert not seq.is_finished
    assert seq.num_output_tokens == 1


def test_max_tokens_finishes_with_length():
    seq = make_seq(max_tokens=3)
    assert feed(seq, "a", "b") == "ab"
    assert not seq.is_finished
    assert feed(seq, "c", start=3.0) == "c"
    assert seq.finish_reason is FinishReason.LENGTH
    assert seq.num_output_tokens == 3


def test_max_tokens_flushes_text_held_back_for_a_stop_string():
    seq = make_seq(max_tokens=1, stop=("END",))
    assert feed(seq, "EN") == "EN"
    assert seq.finish_reason is FinishReason.LENGTH


def test_full_context_finishes_with_length():
    seq = make_seq(prompt_len=3, max_total=5, max_tokens=100)
    feed(seq, "a")
    assert not seq.is_finished
    feed(seq, "b", start=2.0)
    assert seq.finish_reason is FinishReason.LENGTH
    assert len(seq.tokens) == 5


def test_stop_string_finishes_with_stop_and_is_not_streamed():
    seq = make_seq(stop=("END",))
    assert feed(seq, "done", "EN", "D") == "done"
    assert seq.finish_reason is FinishReason.STOP
    assert seq.stream.text == "done"


def test_stop_string_wins_over_max_tokens_on_the_same_token():
    seq = make_seq(max_tokens=1, stop=("END",))
    assert feed(seq, "xEND") == "x"
    assert seq.finish_reason is FinishReason.STOP


def test_last_itl_is_the_gap_before_the_latest_token():
    seq = make_seq()
    seq.append_token(100, b"a", False, 2.0)
    assert seq.last_itl_s is None
    seq.append_token(101, b"b", False, 2.5)
    assert seq.last_itl_s == pytest.approx(0.5)


def test_the_chat_formats_leading_space_is_dropped_from_the_reply_and_eog_flush():
    seq = make_seq(strip_space=True, format_stop=("\nUser:",))
    assert feed(seq, " Paris", " is", " big.") == "Paris is big."
    seq = make_seq(strip_space=True)
    assert eog(seq, b"", 1.0) == "" and seq.stream.text == ""
    assert feed(make_seq(), " Paris") == " Paris"  # the default keeps it


def test_the_chat_formats_stop_strings_do_not_count_against_the_users_sixteen():
    stops = tuple(f"s{i}" for i in range(16))
    seq = make_seq(stop=stops, format_stop=("\nUser:",))
    assert seq.params.all_stops == (*stops, "\nUser:")
    assert seq.stream.push(b"Paris.\nUser:") == ("Paris.", True)


# --- timings ---------------------------------------------------------------------------------


def test_timings_follow_vllm_definitions():
    seq = make_seq(arrival=10.0)
    seq.mark_scheduled(10.25)
    feed(seq, "a", "b", "c", "d", start=11.0, step=0.5)  # tokens at 11.0 .. 12.5
    seq.append_token(EOG, b"", True, 13.0)  # 5 output tokens, last at 13.0
    queue, ttft, e2e, tpot = seq.timings_s()
    assert queue == pytest.approx(0.25)
    assert ttft == pytest.approx(1.0)  # first token - arrival
    assert e2e == pytest.approx(3.0)  # finished - arrival
    assert tpot == pytest.approx((13.0 - 11.0) / 4)  # (last - first) / (n - 1)
    assert seq.timings() == pytest.approx(
        {"queue_ms": 250.0, "ttft_ms": 1000.0, "itl_ms": 500.0, "e2e_ms": 3000.0}
    )


def test_timings_are_nan_before_anything_happens():
    queue, ttft, e2e, tpot = make_seq(arrival=1.0).timings_s()
    assert queue == 0.0
    assert math.isnan(ttft) and math.isnan(e2e) and math.isnan(tpot)


def test_tpot_is_nan_with_a_single_output_token():
    seq = make_seq(arrival=0.0, max_tokens=1)
    feed(seq, "a", start=2.0)
    _, ttft, e2e, tpot = seq.timings_s()
    assert (ttft, e2e) == (2.0, 2.0)
    assert math.isnan(tpot)


def test_queue_time_includes_the_requeue_after_preemption():
    seq = make_seq(arrival=1.0)
    seq.mark_scheduled(1.5)  # waited 0.5
    seq.mark_scheduled(2.0)  # already running: no extra wait
    seq.num_computed = 3
    seq.mark_preempted(3.0)
    assert seq.status is Status.WAITING
    assert seq.num_computed == 0 and seq.num_preemptions == 1
    seq.mark_scheduled(3.25)  # waited 0.25 more
    assert seq.queue_s == pytest.approx(0.75)
    assert seq.first_scheduled_time == 1.5
    assert seq.timings_s()[0] == pytest.approx(0.75)
