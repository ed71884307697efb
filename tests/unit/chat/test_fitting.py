"""Fitting long chats to the context: which turns go, where the cut falls, what it costs."""

from __future__ import annotations

import pytest

from localserve.chat.fitting import (
    MAX_MEASUREMENTS,
    Cut,
    cut_points,
    droppable_turns,
    fit_chat,
    guess_cut,
    search_cut,
    turn_shares,
)

OVERHEAD = 3  # tokens the pretend template adds around each message


def words(n: int, tag: str = "w") -> str:
    return " ".join(f"{tag}{i}" for i in range(n))


class Meter:
    """A pretend renderer and tokenizer: a message takes its words plus `overhead` tokens, the
    prompt `fixed` more; it counts its calls, to pin what fitting costs."""

    def __init__(self, overhead: int = OVERHEAD, fixed: int = 0) -> None:
        self.overhead, self.fixed = overhead, fixed
        self.num_measured = 0
        self.num_counted = 0

    def measure(self, messages):
        self.num_measured += 1
        num = self.fixed + sum(len(c.split()) + self.overhead for _, c in messages)
        return num, [role for role, _ in messages]

    def tools(self):
        return self.measure, self.count

    def count(self, content: str) -> int:
        self.num_counted += 1
        return len(content.split())


def chat(num_turns: int, size: int = 50, system: bool = True) -> list[tuple[str, str]]:
    """A system prompt, then num_turns user/assistant pairs, then the newest user message."""
    messages = [("system", "Be brief.")] if system else []
    for t in range(num_turns):
        messages += [("user", words(size, f"u{t}-")), ("assistant", words(size, f"a{t}-"))]
    return [*messages, ("user", "And now?")]


# --- turns --------------------------------------------------------------------------------------


def test_a_turn_is_a_user_message_with_its_replies_and_the_newest_is_not_droppable():
    roles = ["system", "assistant", "user", "assistant", "assistant", "system", "user", "user"]
    assert droppable_turns(roles) == [[1], [2, 3, 4], [6]]
    assert droppable_turns(["system", "user"]) == []
    assert droppable_turns(["user", "assistant"]) == []  # a prefilled reply is the newest turn


# --- where the cut falls ------------------------------------------------------------------------


def test_cut_points_are_the_first_boundaries_past_each_step():
    assert cut_points([40, 40, 40, 40, 40], 100) == [3, 5]
    assert cut_points([250, 10, 10], 100) == [1, 3]  # one big turn passes several steps
    assert cut_points([10, 10], 100) == [2]  # the end is always a cut
    with pytest.raises(ValueError, match="step"):
        cut_points([1], 0)


def test_a_turn_s_share_is_its_content_and_the_overhead_per_message_measured_from_the_chat():
    # 2 turns of 3 messages, 6 content tokens: 30 tokens in the prompt leave 4 a message
    assert turn_shares([[1, 1, 1], [2, 0, 1]], 30) == [15, 15]
    assert turn_shares([[5, 5]], 13) == [14]  # 1.5 a message: 2, to the nearest whole token
    assert turn_shares([[5], [7]], 10) == [5, 7]  # contents counted over what they take: no less
    assert turn_shares([[0, 0]], 0) == [0]


def test_a_guess_scales_the_shares_to_what_the_cuts_around_it_measured():
    dropped = [0, 10, 20, 30, 40, 50]  # shares of 10 a turn
    over, fits = Cut(0, 1000, None), Cut(5, 100, None)  # each turn really takes 180
    assert guess_cut([1, 2, 3, 4], dropped, 700, over, fits) == 2  # 1000 - 2 x 180 = 640
    assert guess_cut([1, 2, 3, 4], dropped, 999, over, fits) == 1
    assert guess_cut([1, 2, 3, 4], dropped, 150, over, fits) == 4  # none does: the last
    assert guess_cut([1, 2, 3], [0] * 6, 500, over, fits) == 2  # no shares: the middle


def test_the_search_finds_the_first_cut_point_that_fits_however_far_off_the_shares_are():
    """The shares say 10 a turn; the turns really take from 1 to 5,000 (the old ones the most,
    the new ones, in waves, 10 huge ones first, growing exponentially): the cut is the first
    point that fits, as measuring every point would find, within the measurements allowed."""
    shares = [10] * 200
    points = cut_points(shares, 50)  # 40 of them
    for taken in (
        [300 - t for t in range(200)],
        [1 + t for t in range(200)],
        [1 + 299 * (t // 20 % 2) for t in range(200)],
        [5000 if t < 10 else 1 for t in range(200)],
        [int(1.05**t) for t in range(200)],
    ):
        tokens = [30 + sum(taken[k:]) for k in range(201)]  # k oldest turns dropped
        for budget in range(40, tokens[0], tokens[0] // 97):
            measured = []

            def measure_cut(k, tokens=tokens, measured=measured):
                measured.append(k)
                return Cut(k, tokens[k], None)

            whole, least = Cut(0, tokens[0], None), Cut(200, tokens[200], None)
            cut = search_cut(points, shares, budget, whole, least, measure_cut)
            assert cut.num_turns == next(k for k in points if tokens[k] <= budget)
            assert len(measured) <= MAX_MEASUREMENTS - 2


def test_when_the_measurements_run_out_the_cut_is_one_measured_to_fit():
    shares, tokens = [10] * 1000, [1000 - k for k in range(1001)]
    points = cut_points(shares, 10)  # a point at every turn
    whole, least = Cut(0, 1000, None), Cut(1000, 0, None)
    cut = search_cut(points, shares, 500, whole, least, lambda k: Cut(k, tokens[k] * 7, None), 3)
    assert cut.num_tokens <= 500 and 0 < cut.num_turns < 1000


def test_successive_turns_of_a_growing_chat_cut_at_the_same_place():
    """The point of steps: as a chat grows turn by turn, the cut stays put for several turns,
    so the kept chat's prefix (after the system prompt) is the same from one turn to the next
    and the engine's prefix cache keeps it."""
    n_ctx, reply = 2000, 200
    cuts = []
    for num_turns in range(15, 40):
        fitted = fit_chat(chat(num_turns), n_ctx, reply, Meter().measure, Meter().count)
        assert fitted.num_tokens + reply <= n_ctx
        cuts.append(fitted.num_dropped_messages)
    changes = sum(a != b for a, b in zip(cuts, cuts[1:], strict=False))
    assert changes <= len(cuts) // 4, cuts  # the fewest-turns cut would move at every turn
    assert cuts == sorted(cuts) and cuts[-1] > 0


# --- what is kept -------------------------------------------------------------------------------


def test_a_chat_that_fits_is_measured_once_and_kept_whole():
    meter = Meter()
    messages = chat(3)
    fitted = fit_chat(messages, 4096, 256, meter.measure, meter.count)
    assert fitted.messages == messages and fitted.num_dropped_messages == 0
    assert (meter.num_measured, meter.num_counted) == (1, 0)


def test_a_long_chat_keeps_its_system_prompts_and_newest_turn_and_drops_whole_turns():
    meter = Meter()
    messages = chat(40)  # 40 x 106 tokens
    messages.insert(21, ("system", "A note in the middle."))
    fitted = fit_chat(messages, 2048, 256, meter.measure, meter.count)
    kept = fitted.messages
    assert fitted.num_tokens + 256 <= 2048
    assert kept[0] == ("system", "Be brief.") and kept[-1] == ("user", "And now?")
    assert ("system", "A note in the middle.") in kept
    # whole turns: what is kept of the dialogue starts at a user message
    assert [role for role, _ in kept if role != "system"][0] == "user"
    assert len(kept) + fitted.num_dropped_messages == len(messages)
    assert fitted.num_dropped_messages % 2 == 0  # user and assistant together
    assert fitted.payload == [role for role, _ in kept]
    # each message counted once; the chat measured whole, without its droppable turns, as cut,
    # and as cut at the point before, which does not fit
    assert meter.num_counted == 80 and meter.num_measured == 4


def test_the_cut_leaves_headroom_but_not_more_than_a_step():
    meter = Meter()
    n_ctx, reply = 4096, 256
    fitted = fit_chat(chat(60), n_ctx, reply, meter.measure, meter.count)
    room = n_ctx - reply - fitted.num_tokens
    assert 0 <= room <= n_ctx // 4 + 106  # a step, and the turn that crosses it


def test_without_room_for_the_reply_every_droppable_turn_goes():
    """System prompt + newest turn + max_tokens do not fit: all older turns go, and the caller
    gets the smallest chat there is (its reply will end at the context)."""
    meter = Meter()
    messages = [("system", "Be brief."), *chat(10, system=False)[:-1], ("user", words(900))]
    fitted = fit_chat(messages, 1024, 500, meter.measure, meter.count)
    assert fitted.messages == [messages[0], messages[-1]]
    assert fitted.num_dropped_messages == 20
    assert fitted.num_tokens < 1024 < fitted.num_tokens + 500


def test_a_max_tokens_over_half_the_context_keeps_room_for_half_only():
    """An app asking for a reply as long as the context does not lose the whole chat for it."""
    meter = Meter()
    messages = chat(10)  # about 1,070 tokens
    whole = fit_chat(messages, 2048, 4096, meter.measure, meter.count)
    assert whole.num_dropped_messages > 0 and whole.num_tokens + 1024 <= 2048
    assert whole.messages[-3:] == messages[-3:]  # the latest turns are kept, not just the newest
    assert fit_chat(chat(3), 2048, 4096, meter.measure, meter.count).num_dropped_messages == 0


def test_a_prompt_too_long_on_its_own_comes_back_as_it_is_for_the_caller_to_refuse():
    meter = Meter()
    messages = [*chat(2)[:-1], ("user", words(5000))]
    fitted = fit_chat(messages, 4096, 100, meter.measure, meter.count)
    assert fitted.messages == [messages[0], messages[-1]]
    assert fitted.num_tokens > 4096
    only = [("user", words(5000))]
    assert fit_chat(only, 4096, 100, meter.measure, meter.count).messages == only


def one_word_chat(num_messages: int) -> list[tuple[str, str]]:
    return [(("user", "assistant")[i % 2], f"hi{i}") for i in range(num_messages)]


def test_a_chat_of_many_one_word_messages_keeps_about_as_many_as_fit():
    """Counts like the embedded model's transcript: a message is 1 token of content and 3 of
    "User: " and a line break, the preamble 31: 5,000 messages take 20,031 tokens. The newest
    that fit 8,192 less a reply of 1,024 are kept (about 1,780), up to a step short (512)."""
    meter = Meter(fixed=31)
    n_ctx, reply = 8192, 1024
    fitted = fit_chat(one_word_chat(5000), n_ctx, reply, meter.measure, meter.count)
    room = n_ctx - reply - fitted.num_tokens
    assert 0 <= room <= n_ctx // 4 + 8, room  # a step, and the turn that crosses it
    assert len(fitted.messages) >= (n_ctx - reply - 31) // 4 - n_ctx // 16
    assert meter.num_measured <= 4 and meter.num_counted == 4998


class MergingMeter(Meter):
    """As a real tokenizer: in stretches of the chat a message takes a token less in the prompt
    than its content and overhead (its word merges with what precedes it), so the overhead a
    message is no whole token, and it drifts as the chat grows."""

    def measure(self, messages):
        num, payload = super().measure(messages)
        return num - sum(int(c[2:]) // 300 % 2 for _, c in messages), payload


def test_successive_turns_of_a_chat_of_one_word_messages_cut_at_the_same_place():
    n_ctx, reply = 8192, 1024
    cuts = []
    for num_messages in range(5000, 5400, 2):
        meter = MergingMeter(fixed=31)
        fitted = fit_chat(one_word_chat(num_messages), n_ctx, reply, *meter.tools())
        assert fitted.num_tokens + reply <= n_ctx
        cuts.append(fitted.num_dropped_messages)
    # 8 tokens a turn, a step of 2,048 tokens: the cut moves once in 256 turns at most
    assert sum(a != b for a, b in zip(cuts, cuts[1:], strict=False)) <= 1, cuts


def test_turns_that_take_far_more_than_their_content_are_cut_as_many_as_need():
    """A template that wraps each message in 60 tokens: the cut is the first point that fits,
    found within MAX_MEASUREMENTS."""
    meter = Meter(overhead=60)
    fitted = fit_chat(chat(40, size=10), 1024, 100, meter.measure, meter.count, step=20)
    assert 0 <= 1024 - 100 - fitted.num_tokens <= 20 + 140  # a step, and the turn that crosses it
    assert meter.num_measured <= MAX_MEASUREMENTS
