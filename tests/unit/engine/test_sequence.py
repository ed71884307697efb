"""Text streaming, sampling parameters and a sequence's life (localserve/engine/sequence.py)."""

from __future__ import annotations

import math

import msgspec
import pytest

from localserve.engine.sampling_params import SamplingParams
from localserve.engine.sequence import FinishReason, Sequence, Status
from localserve.engine.text_stream import TextStream

EOG = 1  # any token id: the runner tells end-of-generation through `is_eog`


def push_all(stream: TextStream, *pieces: str | bytes) -> list[tuple[str, bool]]:
    return [stream.push(p if isinstance(p, bytes) else p.encode()) for p in pieces]


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


# --- TextStream ------------------------------------------------------------------------------


def test_plain_text_passes_through_without_stops():
    stream = TextStream(())
    assert push_all(stream, "Hello", ", ", "world") == [
        ("Hello", False),
        (", ", False),
        ("world", False),
    ]
    assert stream.text == "Hello, world"


def test_plain_text_passes_through_when_it_cannot_start_a_stop():
    stream = TextStream(("END",))
    assert push_all(stream, "abc", "xyz") == [("abc", False), ("xyz", False)]


def test_multibyte_character_split_across_pieces_is_released_only_when_complete():
    stream = TextStream(())
    euro = "€".encode()  # 3 bytes
    assert stream.push(euro[:1]) == ("", False)
    assert stream.push(euro[1:2]) == ("", False)
    assert stream.push(euro[2:] + b"!") == ("€!", False)
    assert stream.text == "€!"


def test_multibyte_character_split_is_also_held_with_stop_strings():
    stream = TextStream(("END",))
    e_acute = "é".encode()
    assert stream.push(b"caf" + e_acute[:1]) == ("caf", False)
    assert stream.push(e_acute[1:]) == ("é", False)


def test_stop_string_is_not_streamed_and_ends_the_stream():
    stream = TextStream(("END",))
    assert stream.push(b"answerEND trailing") == ("answer", True)
    assert stream.text == "answer"


def test_stop_string_split_across_pieces_is_not_streamed():
    stream = TextStream(("END",))
    assert push_all(stream, "xEN", "D") == [("x", False), ("", True)]
    assert stream.text == "x"


def test_stop_prefix_that_turns_out_not_to_be_a_stop_is_released():
    stream = TextStream(("END",))
    assert push_all(stream, "EN", "ding") == [("", False), ("ENding", False)]
    assert stream.text == "ENding"


def test_earliest_of_several_stop_strings_wins():
    stream = TextStream(("world", "lo"))
    assert stream.push(b"hello world") == ("hel", True)


def test_repeated_prefix_characters_hold_back_only_a_possible_stop():
    stream = TextStream(("aab",))
    assert push_all(stream, "aa", "a", "b") == [("", False), ("a", False), ("", True)]
    assert stream.text == "a"


def test_flush_releases_held_text():
    stream = TextStream(("END",))
    assert stream.push(b"the EN") == ("the ", False)
    assert stream.flush() == "EN"
    assert stream.text == "the EN"


def test_flush_replaces_an_incomplete_utf8_tail():
    stream = TextStream(())
    stream.push("é".encode()[:1])
    assert stream.flush() == "\ufffd"


# --- SamplingParams --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("max_tokens", 0),
        ("temperature", -1.0),
        ("top_p", 0.0),
        ("top_k", -1),
        ("min_p", 1.5),
        ("repeat_penalty", 0.0),
        ("repeat_last_n", 5000),
        ("seed", -1),
        ("seed", 1 << 32),
        ("stop", ("",)),
        ("stop", tuple(f"s{i}" for i in range(17))),
        ("stop", ("x" * 257,)),
        ("top_k", 1 << 31),
        ("top_k", 10**40),
        ("max_tokens", 10**40),
        ("repeat_penalty", 5e-324),
        ("repeat_penalty", 0.00999),
        ("temperature", float("inf")),
        ("temperature", float("nan")),
        ("top_p", float("nan")),
    ],
)
def test_invalid_sampling_param_raises_value_error_naming_the_field(field, value):
    with pytest.raises(ValueError, match=f"^{field}: "):
        SamplingParams(**{field: value})


def test_sampling_params_boundary_values_are_accepted():
    SamplingParams(max_tokens=1, temperature=0, top_p=1.0, seed=(1 << 32) - 1, stop=("x",) * 16)
    SamplingParams(
        temperature=5e-324,
        top_p=5e-324,
        min_p=5e-324,
        top_k=(1 << 31) - 1,
        repeat_penalty=0.01,
        stop=("x" * 256,),
    )


def test_the_chat_formats_stop_strings_do_not_count_against_the_users_sixteen():
    stops = tuple(f"s{i}" for i in range(16))
    seq = make_seq(stop=stops, format_stop=("\nUser:",))
    assert seq.params.all_stops == (*stops, "\nUser:")
    assert seq.stream.push(b"Paris.\nUser:") == ("Paris.", True)


def test_a_tiny_temperature_is_greedy():
    assert SamplingParams(temperature=1e-320).is_greedy


def test_invalid_sampling_param_in_json_is_a_validation_error_naming_the_field():
    with pytest.raises(msgspec.ValidationError, match="temperature"):
        msgspec.json.decode(b'{"temperature": -1}', type=SamplingParams)


def test_unknown_sampling_param_is_rejected():
    with pytest.raises(msgspec.ValidationError, match="temprature"):
        msgspec.json.decode(b'{"temprature": 0}', type=SamplingParams)


def test_temperature_zero_without_penalty_is_greedy():
    assert SamplingParams(temperature=0).is_greedy


@pytest.mark.parametrize(
    "params", [{"temperature": 0.7}, {"temperature": 0, "repeat_penalty": 1.1}]
)
def test_sampling_with_temperature_or_penalty_is_not_greedy(params):
    assert not SamplingParams(**params).is_greedy


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
