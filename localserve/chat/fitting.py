"""Long chats made to fit the context: drop the oldest turns, in steps that keep a cached prefix.

A chat whose prompt and reply do not fit the model's context (`n_ctx`) loses its oldest turns,
whole — a user message with the replies that answered it — until the prompt plus the reply's
`max_tokens` fits. System messages are never dropped (wherever they stand), nor is the newest
turn (the last user message and what follows it). Room is kept for at most half the context's
worth of reply (MAX_REPLY_FRACTION): a max_tokens larger than that (an app asking for 4,096 of a
4,096-token context) would otherwise leave out the whole chat for a reply that is rarely that
long; such a reply may still run on to the end of the context.

What a turn takes (its share): its messages' content tokens plus, for each message, what the
format wraps it in ("User: " and a line break, a template's turn markers). That overhead is
measured from the chat itself: the whole chat's tokens, less those of the chat without its
droppable turns (its system prompts and newest turn), less the droppable contents' tokens, per
droppable message, rounded to a whole token (so that it, and the cut points with it, stay the
same as the chat grows). A chat of many one-word messages, where the overhead is most of the
prompt, is then estimated as well as one of long messages.

Where it cuts: not at the fewest turns that fit, which would move the cut at every new turn and
so change the prompt right after the system prompt each time, spoiling the engine's prefix cache
for the whole rest of the chat. The possible cuts are fixed points of the chat itself: the first
turn boundary past each multiple of `step` tokens of the droppable turns' shares, counted from
the chat's start. The cut is the first of those points whose chat fits. As the chat grows by new
turns those points stay where they are, so successive turns cut at the same place and share
their prompt's prefix with the previous turn's prompt and reply, until the chat has grown by
about `step` tokens more; then the cut moves to the next point, leaving that much headroom again.

What it costs: the whole chat is measured (rendered and tokenized) once, as every chat is; only
a chat that does not fit is measured again without its droppable turns (the least there is to
send: when even that leaves no room for the reply, every droppable turn goes and nothing more is
counted or measured), and then has each droppable message's content tokenized once more. The
first cut point that fits lies between those two; it is searched for by measuring cuts:
GUIDED_GUESSES guesses from the shares, scaled to the measured cuts on either side (the first
guess is nearly always the point, the second then checks that the point before it does not
fit), then halving. A chat is measured at most MAX_MEASUREMENTS times (4 for the usual long
chat); should they run out first (a chat of hundreds of cut points whose shares are far off),
the cut is the one measured that fits with the most turns kept.

Pure logic over token counts: the caller measures (renders and tokenizes) and counts.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Callable, Sequence
from typing import Generic, NamedTuple, TypeVar

Payload = TypeVar("Payload")
Message = tuple  # (role, content, ...): a pair, or chat/messages.py's PromptMessage

STEP_FRACTION = 4  # the cut moves in steps of n_ctx // STEP_FRACTION tokens of shares
MAX_REPLY_FRACTION = 2  # room is kept for at most n_ctx // MAX_REPLY_FRACTION reply tokens
MAX_MEASUREMENTS = 10  # a chat is measured at most this often (whole, least, then the search)
GUIDED_GUESSES = 2  # cuts guessed from the shares before the search halves what is left


class Fitted(NamedTuple, Generic[Payload]):
    """The chat as it will be sent: its messages, how many were left out, and the measurement
    of what is left (the caller's payload, e.g. its rendered text and tokens)."""

    messages: list[Message]
    num_dropped_messages: int  # messages left out, oldest first
    num_tokens: int  # the prompt's tokens as measured
    payload: Payload


class Cut(NamedTuple, Generic[Payload]):
    """A cut as measured: how many of the oldest turns it drops, what its chat's prompt takes."""

    num_turns: int
    num_tokens: int
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


def turn_shares(contents: Sequence[Sequence[int]], num_tokens: int) -> list[int]:
    """Each droppable turn's share, given its messages' content tokens and what the droppable
    turns take in the prompt together: the contents plus the same overhead for every message
    (what is left of `num_tokens` per message, to a whole token)."""
    num_messages = sum(map(len, contents))
    overhead = round((num_tokens - sum(map(sum, contents))) / max(1, num_messages))
    return [sum(c) + max(0, overhead) * len(c) for c in contents]


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


def guess_cut(between: Sequence[int], dropped: Sequence[int], budget: int, over: Cut, fits: Cut):
    """The first of the cut points `between` two measured cuts (one `over` the budget, one that
    `fits`) that fits by the shares' estimate, scaled to what those two cuts measured; the last
    of them when none does. `dropped[k]`: the shares of the k oldest turns."""
    span = dropped[fits.num_turns] - dropped[over.num_turns]
    gain = over.num_tokens - fits.num_tokens  # tokens that dropping the span saved
    if span <= 0 or gain <= 0:  # nothing to scale by: the middle one
        return between[len(between) // 2]
    need = dropped[over.num_turns] + (over.num_tokens - budget) * span / gain
    i = bisect.bisect_left(between, need, key=dropped.__getitem__)
    return between[min(i, len(between) - 1)]


def search_cut(
    points: Sequence[int],
    shares: Sequence[int],
    budget: int,
    over: Cut,
    fits: Cut,
    measure_cut: Callable[[int], Cut],
    num_left: int = MAX_MEASUREMENTS - 2,
) -> Cut:
    """The first of the cut `points` whose chat's prompt fits `budget` tokens, found between a
    cut measured over it and one that fits, by at most `num_left` more measurements
    (`measure_cut`): GUIDED_GUESSES guesses from the shares, then halving. When they run out,
    the measured cut that fits with the fewest turns dropped."""
    dropped = [0, *itertools.accumulate(shares)]
    for n in range(num_left):
        lo = bisect.bisect_right(points, over.num_turns)
        between = points[lo : bisect.bisect_left(points, fits.num_turns)]
        if not between:
            break
        guessed = n < GUIDED_GUESSES
        k = (
            guess_cut(between, dropped, budget, over, fits)
            if guessed
            else between[len(between) // 2]
        )
        cut = measure_cut(k)
        over, fits = (over, cut) if cut.num_tokens <= budget else (cut, fits)
    return fits


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
    budget = n_ctx - min(reply_tokens, n_ctx // MAX_REPLY_FRACTION)
    num_tokens, payload = measure(messages)
    turns = droppable_turns([m[0] for m in messages])
    if num_tokens <= budget or not turns:
        return Fitted(messages, 0, num_tokens, payload)

    def measure_cut(k: int) -> Cut:
        return Cut(k, *measure(_without(messages, turns[:k])))

    whole, cut = Cut(0, num_tokens, payload), measure_cut(len(turns))
    if cut.num_tokens <= budget:  # something fits: the first cut point that does
        contents = [[count(messages[i][1]) for i in turn] for turn in turns]
        shares = turn_shares(contents, whole.num_tokens - cut.num_tokens)
        points = cut_points(shares, step or max(1, n_ctx // STEP_FRACTION))
        cut = search_cut(points, shares, budget, whole, cut, measure_cut)
    dropped = turns[: cut.num_turns]
    return Fitted(_without(messages, dropped), sum(map(len, dropped)), cut.num_tokens, cut.payload)


def _without(messages: list[Message], turns: Sequence[Sequence[int]]) -> list[Message]:
    dropped = {i for turn in turns for i in turn}
    return [m for i, m in enumerate(messages) if i not in dropped]
