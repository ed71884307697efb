"""Long chats made to fit the context: drop the oldest turns, in steps that keep a cached prefix.

A chat whose prompt and reply do not fit the model's context (`n_ctx`) loses its oldest turns,
whole — a user message with the replies that answered it — until the prompt plus the reply's
`max_tokens` fits. System messages are never dropped (wherever they stand), nor is the newest
turn (the last user message and what follows it). Room is kept for at most half the context's
worth of reply (MAX_REPLY_FRACTION): a max_tokens larger than that (an app asking for 4,096 of a
4,096-token context) would otherwise leave out the whole chat for a reply that is rarely that
long; such a reply may still run on to the end of the context.

What it costs: the whole chat is measured (rendered and tokenized) once, as every chat is; only
a chat that does not fit has each droppable message's content tokenized once more, to know each
turn's share; the chosen cut is then measured once (a share is the content's tokens, about a
lower bound of what the turn takes in the prompt, so that one measurement nearly always fits;
when it does not, the cut moves on, at most MAX_MEASUREMENTS times before all droppable turns
go).

Where it cuts: not at the fewest turns that fit, which would move the cut at every new turn and
so change the prompt right after the system prompt each time, spoiling the engine's prefix cache
for the whole rest of the chat. The possible cuts are fixed points of the chat itself: the first
turn boundary past each multiple of `step` tokens of droppable content, counted from the chat's
start. The cut is the first of those points that drops enough. As the chat grows by new turns
those points stay where they are, so successive turns cut at the same place and share their
prompt's prefix with the previous turn's prompt and reply, until the chat has grown by about
`step` tokens more; then the cut moves to the next point, leaving that much headroom again.

Pure logic over token counts: the caller measures (renders and tokenizes) and counts.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from typing import Generic, NamedTuple, TypeVar

Payload = TypeVar("Payload")
Message = tuple  # (role, content, ...): a pair, or chat/messages.py's PromptMessage

STEP_FRACTION = 4  # the cut moves in steps of n_ctx // STEP_FRACTION tokens of content
MAX_REPLY_FRACTION = 2  # room is kept for at most n_ctx // MAX_REPLY_FRACTION reply tokens
MAX_MEASUREMENTS = 4  # chats measured at most before every droppable turn goes


class Fitted(NamedTuple, Generic[Payload]):
    """The chat as it will be sent: its messages, how many were left out, and the measurement
    of what is left (the caller's payload, e.g. its rendered text and tokens)."""

    messages: list[Message]
    num_dropped_messages: int  # messages left out, oldest first
    num_tokens: int  # the prompt's tokens as measured
    payload: Payload


def droppable_turns(roles: Sequence[str]) -> list[list[int]]:
    """The indices of the messages of each turn that may be dropped, oldest first.

    A turn starts at a user message and holds the non-system messages up to the next user
    message (assistant messages before the first user message are a turn of their own). The last
    turn, the newest user message and what follows it, is not droppable; system messages never
    are.
    """
    turns: list[list[int]] = []
    for i, role in enumerate(roles):
        if role == "system":
            continue
        if role == "user" or not turns:
            turns.append([])
        turns[-1].append(i)
    return turns[:-1]


def cut_points(shares: Sequence[int], step: int) -> list[int]:
    """The places the chat may be cut (how many of the oldest turns go), given each droppable
    turn's share in tokens: the first turn boundary at or past each multiple of `step`, and the
    end (every droppable turn). They depend only on the turns before them, so they stay put as
    the chat grows."""
    if step < 1:
        raise ValueError(f"step: {step} is not a positive number of tokens")
    points, total, threshold = [], 0, step
    for k, share in enumerate(shares, 1):
        total += share
        if total >= threshold:
            points.append(k)
            threshold = (total // step + 1) * step  # the next multiple past this boundary
    if not points or points[-1] != len(shares):
        points.append(len(shares))
    return points


def choose_cut(shares: Sequence[int], excess: int, step: int, at_least: int = 0) -> int:
    """How many of the oldest turns to drop: the first cut point past `at_least` turns whose
    turns' shares add up to `excess` tokens or more (or all of them when none does)."""
    dropped = [0, *itertools.accumulate(shares)]  # tokens of the k oldest turns
    for k in cut_points(shares, step):
        if k > at_least and dropped[k] >= excess:
            return k
    return len(shares)


def fit_chat(
    messages: Sequence[Message],
    n_ctx: int,
    reply_tokens: int,
    measure: Callable[[list[Message]], tuple[int, Payload]],
    count: Callable[[str], int],
    step: int | None = None,
) -> Fitted[Payload]:
    """Drop the oldest turns until `measure(messages)` tokens + `reply_tokens` (at most half of
    `n_ctx`) fit `n_ctx`.

    `measure` renders and tokenizes a chat: its prompt's token count and whatever the caller
    wants back for the chat that is kept; `count` counts a message content's tokens. When even
    the system prompts and the newest turn leave less than `reply_tokens`, every droppable turn
    goes and the result is the chat that is left: the caller decides (the prompt alone may not
    fit: refuse; else the reply gets what is left of the context).
    """
    messages = list(messages)
    reply_tokens = min(reply_tokens, n_ctx // MAX_REPLY_FRACTION)
    num_tokens, payload = measure(messages)
    if num_tokens + reply_tokens <= n_ctx:
        return Fitted(messages, 0, num_tokens, payload)
    turns = droppable_turns([m[0] for m in messages])
    if not turns:
        return Fitted(messages, 0, num_tokens, payload)
    shares = [sum(count(messages[i][1]) for i in turn) for turn in turns]
    step = step or max(1, n_ctx // STEP_FRACTION)
    k = choose_cut(shares, num_tokens + reply_tokens - n_ctx, step)
    num_measured = 1
    while True:
        kept = _without(messages, turns[:k])
        num_tokens, payload = measure(kept)
        num_measured += 1
        over = num_tokens + reply_tokens - n_ctx
        if over <= 0 or k == len(turns):
            return Fitted(kept, sum(map(len, turns[:k])), num_tokens, payload)
        # the shares were short of what the turns took: the next cut that drops `over` more
        if num_measured > MAX_MEASUREMENTS:
            k = len(turns)
        else:
            k = choose_cut(shares, sum(shares[:k]) + over, step, at_least=k)


def _without(messages: list[Message], turns: Sequence[Sequence[int]]) -> list[Message]:
    dropped = {i for turn in turns for i in turn}
    return [m for i, m in enumerate(messages) if i not in dropped]
