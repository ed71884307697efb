"""The conversation's history for speculative decoding: the indexes of a user's finished replies,
so that the next turn drafts from them and indexes only its new tokens.

Pure Python, no I/O (localserve.engine.speculative's `NgramDrafter` chained to a parent). Only
the same user's, bounded per user and in positions everyone's together.

Tested in tests/unit/engine/test_speculative.py.
"""

from __future__ import annotations

from localserve.engine.speculative import NgramDrafter

HISTORY_DEPTH = 4  # turns a conversation's index chains before it is indexed afresh
HISTORY_PER_USER = 4  # conversations remembered per user
HISTORY_TOKENS = 1 << 17  # positions indexed in the history, everyone's together (~50 MB)
MIN_SHARED = 16  # tokens a new request must share with a remembered one to draft from it


def shared_prefix(a: list[int], b: list[int]) -> int:
    """How many leading tokens two token lists share (binary search over slice comparisons:
    C speed, for prompts of thousands of tokens)."""
    lo, hi = 0, min(len(a), len(b))
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


class DraftHistory:
    """The indexes of finished replies, per user: a new request of the same conversation (its
    tokens start as a remembered one's) drafts from them, and indexes only its new tokens.

    Only the same user's: the prefix isolation rule holds for drafts too (how fast a draft is
    accepted would tell whether someone else's text continues the same way). Bounded: the
    HISTORY_PER_USER latest conversations per user, HISTORY_TOKENS positions everyone's
    together (the least recently used users' go first); a chain of HISTORY_DEPTH turns is
    indexed afresh at the next turn."""

    def __init__(self, per_user: int = HISTORY_PER_USER, max_tokens: int = HISTORY_TOKENS):
        self.per_user = per_user
        self.max_tokens = max_tokens
        self._users: dict[str, list[NgramDrafter]] = {}  # least recently used user first
        self.num_tokens = 0

    def drafter_for(self, user: str, tokens: list[int]) -> NgramDrafter:
        """A drafter for a new sequence of `user`: chained to the remembered conversation it
        continues (the one sharing the most leading tokens, at least MIN_SHARED and some of its
        reply: a request asked again, the same prompt, is not a next turn, and drafting it
        from the last answer would make a seeded reply's steps, and so its numerics, differ
        from the first time's), if any."""
        best, shared = None, MIN_SHARED - 1
        for kept in self._users.get(user, ()):
            n = shared_prefix(kept.tokens, tokens)
            if n > shared and n > kept.prompt_len:
                best, shared = kept, n
        if best is None or best.depth + 1 >= HISTORY_DEPTH:
            return NgramDrafter()
        return NgramDrafter(best, shared)

    def keep(self, user: str, drafter: NgramDrafter) -> None:
        """A finished sequence's drafter: its conversation's latest turn (it replaces the turn
        it continues)."""
        before = self._users.pop(user, [])
        kept = [d for d in before if d is not drafter.parent and d is not drafter]
        kept.append(drafter)
        while len(kept) > self.per_user:
            kept.pop(0)
        self._users[user] = kept  # now the most recently used
        # this user's change only (a finish is on the engine thread: no walk of everyone's)
        self.num_tokens += sum(d.size for d in kept) - sum(d.size for d in before)
        while self.num_tokens > self.max_tokens and self._users:
            oldest = next(iter(self._users))
            ds = self._users[oldest]
            self.num_tokens -= ds.pop(0).size
            if not ds:
                del self._users[oldest]

    def users(self) -> list[str]:
        return list(self._users)
