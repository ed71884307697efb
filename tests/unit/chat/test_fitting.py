"""Fitting long chats to the context: which turns go, where the cut falls, what it costs."""

from __future__ import annotations

import pytest

from localserve.chat.fitting import (
    MAX_MEASUREMENTS,
    choose_cut,
    cut_points,
    droppable_turns,
    fit_chat,
)

OVERHEAD = 3  # tokens the pretend template adds around each message


def words(n: int, tag: str = "w") -> str:
    return " ".join(f"{tag}{i}" for i in range(n))


class Meter:
    """A pretend renderer and tokenizer: a message takes its words plus OVERHEAD tokens; it
    counts its calls, to pin what fitting costs."""

    def __init__(self) -> None:
        self.num_measured = 0
        self.num_counted = 0

    def measure(self, messages):
        self.num_measured += 1
        num = sum(len(c.split()) + OVERHEAD for _, c in messages)
        return num, [role for role, _ in messages]

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


def test_the_cut_is_the_first_point_that_drops_enough():
    shares = [40] * 10
    assert choose_cut(shares, 1, 100) == 3
    assert choose_cut(shares, 120, 100) == 3
    assert choose_cut(shares, 121, 100) == 5
    assert choose_cut(shares, 10_000, 100) == 10  # not enough: all of them
    assert choose_cut(shares, 1, 100, at_least=3) == 5


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
    # each message counted once, the chat measured twice (whole, then as cut)
    assert meter.num_counted == 80 and meter.num_measured == 2


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


def test_shares_that_fall_short_move_the_cut_on_a_bounded_number_of_times():
    """Each turn takes far more in the prompt than its content's count (a template that wraps
    each message in 60 tokens): the cut moves on until it fits, within MAX_MEASUREMENTS."""
    meter = Meter()

    def measure(messages):
        meter.num_measured += 1
        return sum(len(c.split()) + 60 for _, c in messages), None

    fitted = fit_chat(chat(40, size=10), 1024, 100, measure, meter.count, step=20)
    assert fitted.num_tokens + 100 <= 1024 or fitted.messages[1:] == [("user", "And now?")]
    assert meter.num_measured <= MAX_MEASUREMENTS + 1
