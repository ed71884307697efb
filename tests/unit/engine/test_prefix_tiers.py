"""The prefix cache's host tier on the fake runner: saves, restores, isolation, the eviction
rule, failures and budgets.

The fake runner saves a sequence's state as its cells' tokens and checks, at every row, that the
cells a row attends to hold the sequence's own tokens: a restore of the wrong prefix (another
person's, a stale one) fails the step. The real model's restores are checked in
tests/e2e/test_prefix_tiers_llama.py; the disk tier in tests/unit/runners/test_prefix_disk.py.
"""

from __future__ import annotations

import random

from localserve.config import SchedulerConfig
from localserve.engine.events import Done
from localserve.engine.prefix_tiers import (
    CHEAP_TOKENS,
    MIN_SAVE_TOKENS,
    HostTier,
    SavedPrefix,
    covers,
    victim_order,
)
from localserve.engine.runner import apply_cell_ops
from localserve.engine.sampling_params import SamplingParams
from localserve.runners.fake import FakeRunner
from tests.support.harness import run_checked

BYTES = FakeRunner.STATE_BYTES_PER_TOKEN
MIB = 1 << 20


def words(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(10, 1000) for _ in range(n)]


def ask(h, rid: str, tokens: list[int], user: str, max_tokens: int = 8) -> Done:
    h.engine.add_request(rid, tokens, SamplingParams(temperature=0, max_tokens=max_tokens), user)
    h.step()
    seq = h.engine._seqs[rid]
    run_checked(h)
    done = h.done(rid)
    assert done is not None and done.finish_reason == "length", done
    # the prompt and the reply (its last token was never fed back): the next turn's start
    h.histories = {**getattr(h, "histories", {}), user: seq.tokens[:-1]}
    return done


def history(h, user: str) -> list[int]:
    """What the user's last turn left (prompt and reply): the start of their next prompt."""
    return h.histories[user]


def fed(h, rid: str) -> int:
    """Tokens the request fed to the model (prompt chunks and decode rows)."""
    return sum(
        n
        for s in h.runner.steps
        for r, n in zip(s.request_ids, s.num_tokens, strict=True)
        if r == rid
    )


# --- the host tier alone ---------------------------------------------------------------------


def test_a_short_prefix_is_not_saved_and_a_long_one_is_estimated_then_measured():
    host = HostTier(MIB, bytes_per_token=100)
    assert host.new_save(list(range(MIN_SAVE_TOKENS - 1)), "a") is None
    entry = host.new_save(list(range(MIN_SAVE_TOKENS)), "a")
    assert entry is not None and entry.nbytes == 100 * MIN_SAVE_TOKENS
    assert host.pending_bytes == entry.nbytes
    entry.data = bytes(50 * MIN_SAVE_TOKENS)  # what the runner copied out
    assert host.settle() == [entry]
    assert host.used_bytes == entry.nbytes == 50 * MIN_SAVE_TOKENS
    assert host.bytes_per_token == 50 and host.pending_bytes == 0


def test_a_failed_save_leaves_nothing_behind():
    host = HostTier(MIB, bytes_per_token=BYTES)
    entry = host.new_save(list(range(200)), "a")
    entry.data = b""
    assert host.settle() == [] and host.entries == [] and host.used_bytes == 0
    assert host.counters.failures == 1
    never_ran = host.new_save(list(range(300)), "a")  # the step failed before its operations
    assert host.settle() == [] and never_ran not in host.entries


def test_a_newer_turn_of_the_same_conversation_replaces_the_older():
    host = HostTier(MIB, bytes_per_token=1)
    first = host.new_save(list(range(200)), "a")
    other = host.new_save(list(range(200)), "b")  # another person's: kept
    second = host.new_save(list(range(300)), "a")
    assert host.entries == [other, second] and first not in host.entries
    assert host.used_bytes == 500


def test_the_host_tier_keeps_one_prefix_per_person_before_a_second_of_anyones():
    host = HostTier(1000, bytes_per_token=1)
    a_old = host.new_save(words(300, 1), "a")
    b = host.new_save(words(300, 2), "b")
    a_new = host.new_save(words(300, 3), "a")  # a second conversation of a's (not an extension)
    c = host.new_save(words(300, 4), "c")  # over budget: a's older one goes, not b's (older)
    assert a_old not in host.entries and {b, a_new, c} <= set(host.entries)
    assert host.counters.evictions == 1
    d = host.new_save(words(300, 5), "d")  # everyone's latest: the least recently used goes
    assert b not in host.entries and {a_new, c, d} <= set(host.entries)
    assert host.used_bytes <= host.budget_bytes


def test_the_victim_order_puts_cheap_prefixes_before_costly_ones():
    entries = [
        SavedPrefix(list(range(CHEAP_TOKENS * 2)), "a", 1, last_used=1),
        SavedPrefix(list(range(CHEAP_TOKENS - 1)), "b", 1, last_used=2),
        SavedPrefix(list(range(CHEAP_TOKENS * 2)), "c", 1, last_used=3),
        SavedPrefix(list(range(CHEAP_TOKENS * 2)), "c", 1, last_used=4),
    ]
    order = victim_order(
        entries, lambda e: e.owner, lambda e: e.last_used, lambda e: len(e.tokens) < CHEAP_TOKENS
    )
    # c's older prefix first, then b's (cheap), then the least recently used of the rest
    assert order == [entries[2], entries[1], entries[0], entries[3]]


def test_a_flood_of_people_keeps_the_host_tier_within_its_budget():
    host = HostTier(64 * 1024, bytes_per_token=BYTES)
    for person in range(200):
        entry = host.new_save(words(300 + person % 7, person), f"p{person}")
        entry.data = bytes(len(entry.tokens) * BYTES)
        host.settle()
        assert host.used_bytes == sum(e.nbytes for e in host.entries) <= host.budget_bytes
    assert len({e.owner for e in host.entries}) == len(host.entries) > 1


def test_a_person_sees_only_their_own_saved_prefixes():
    host = HostTier(MIB, bytes_per_token=BYTES)
    tokens = words(400, 1)
    host.new_save(tokens, "alice")
    assert host.match(tokens + [5], "bob", share_all=False, limit=400) is None
    entry, n = host.match(tokens + [5], "alice", share_all=False, limit=400)
    assert n == 400 and entry.owner == "alice"
    assert host.match(tokens + [5], "bob", share_all=True, limit=400)[1] == 400


# --- the engine with a host tier -------------------------------------------------------------


def rotation(h, people: int, rounds: int, first: int = 300) -> dict[str, list[Done]]:
    """Each person starts a conversation, then they take turns, each resending their whole
    history and a short question."""
    dones: dict[str, list[Done]] = {}
    for p in range(people):
        user = f"p{p}"
        dones[user] = [ask(h, f"{user}-0", words(first, p), user)]
    for r in range(1, rounds):
        for p in range(people):
            user = f"p{p}"
            prompt = history(h, user) + words(12, 100 * r + p)
            dones[user].append(ask(h, f"{user}-{r}", prompt, user))
    return dones


def test_people_taking_turns_resume_from_the_host_tier_not_a_full_prefill(make_harness):
    # four conversations of ~300 tokens in a cache of 512 cells: at most one stays in the cells
    h = make_harness(host_cache_bytes=MIB, n_ctx=512, n_seq_max=8)
    dones = rotation(h, people=4, rounds=3)
    for user, turns in dones.items():
        for r, done in enumerate(turns[1:], start=1):
            # everything but the new question (and the last prompt token) came back restored
            assert done.cached_tokens >= done.prompt_tokens - 13, (user, r, done)
            assert fed(h, f"{user}-{r}") <= 13 + done.completion_tokens
    counters = h.kv.host.counters
    assert counters.hits >= 4 * 2 - 1  # every resumed turn but one the cells kept
    assert h.kv.num_evictions > 0  # the cells could not hold them: the tier did


def test_without_the_host_tier_the_same_turns_prefill_everything(make_harness):
    # the control of the test above: the same rotation, no host tier
    h = make_harness(n_ctx=512, n_seq_max=8)
    dones = rotation(h, people=4, rounds=3)
    resumed = [d for turns in dones.values() for d in turns[1:]]
    assert sum(d.cached_tokens for d in resumed) < sum(d.prompt_tokens for d in resumed) / 3


def test_a_restored_turn_replies_as_a_prefilled_one_would(make_harness):
    with_tier = make_harness(host_cache_bytes=MIB, n_ctx=512, n_seq_max=8)
    without = make_harness(n_ctx=512, n_seq_max=8)
    a = rotation(with_tier, people=3, rounds=3)
    b = rotation(without, people=3, rounds=3)
    for user in a:
        for r in range(3):
            rid = f"{user}-{r}"
            assert with_tier.text(rid) == without.text(rid)
            assert a[user][r].prompt_tokens == b[user][r].prompt_tokens


def test_another_persons_identical_conversation_never_restores_a_prefix(make_harness):
    h = make_harness(host_cache_bytes=MIB, n_ctx=512, n_seq_max=8)
    tokens = words(300, 1)
    ask(h, "a-0", tokens, "alice")
    ask(h, "evict", words(480, 2), "carol")  # alice's cells leave the pool
    assert not [p for p in h.kv.prefixes if p.owner == "alice"]
    assert [e for e in h.kv.host.entries if e.owner == "alice"]
    done = ask(h, "b-0", history(h, "alice") + [7], "bob")
    assert done.cached_tokens == 0 and h.kv.host.counters.hits == 0
    done = ask(h, "a-1", history(h, "alice") + [7], "alice")  # alice herself does
    assert done.cached_tokens > 300 and h.kv.host.counters.hits == 1


def test_share_all_restores_anyones_prefix(make_harness):
    config = SchedulerConfig(share_prefixes="all")
    h = make_harness(config, host_cache_bytes=MIB, n_ctx=512, n_seq_max=8)
    ask(h, "a-0", words(300, 1), "alice")
    ask(h, "evict", words(480, 2), "carol")
    done = ask(h, "b-0", history(h, "alice") + [7], "bob")
    assert done.cached_tokens > 300


def test_a_refused_restore_is_prefilled_and_replies_the_same(make_harness):
    h = make_harness(host_cache_bytes=MIB, n_ctx=512, n_seq_max=8)
    control = make_harness(n_ctx=512, n_seq_max=8)
    for x in (h, control):
        ask(x, "a-0", words(300, 1), "alice")
        ask(x, "evict", words(480, 2), "carol")
    h.runner.failing_restores = True
    prompt = history(h, "alice") + [7]
    done = ask(h, "a-1", prompt, "alice")
    assert done.cached_tokens == 0 and fed(h, "a-1") == len(prompt) + 7
    assert h.kv.host.counters.failures == 1 and h.kv.host.counters.hits == 0
    ask(control, "a-1", prompt, "alice")
    assert h.text("a-1") == control.text("a-1")


def test_a_preempted_sequence_is_restored_not_recomputed(make_harness):
    # two long replies in 600 cells: the newer is preempted, its cells saved, then restored
    h = make_harness(host_cache_bytes=MIB, n_ctx=600, n_seq_max=4)
    control = make_harness(n_ctx=600, n_seq_max=4)
    for x in (h, control):
        for rid, seed in (("a", 1), ("b", 2)):
            x.engine.add_request(
                rid, words(200, seed), SamplingParams(temperature=0, max_tokens=150), rid
            )
        run_checked(x)
    assert h.engine.metrics.counters.preemptions > 0
    assert h.kv.host.counters.hits > 0
    for rid in ("a", "b"):
        assert h.text(rid) == control.text(rid)
        assert h.done(rid).completion_tokens == 150
    # what the preempted one computed came back: it fed fewer tokens than recomputing it did
    assert fed(h, "b") + fed(h, "a") < fed(control, "b") + fed(control, "a")


def test_restores_are_spread_over_steps_within_the_itl_target(make_harness):
    h = make_harness(host_cache_bytes=MIB, n_ctx=1024, n_seq_max=12)
    for p in range(3):
        ask(h, f"p{p}-0", words(300, p), f"p{p}")
    ask(h, "evict", words(1000, 9), "carol")  # nobody's conversation is in the cells now
    # copies this slow take the whole share of the target each: one restore per step
    h.engine.scheduler.copies.rate = 300 * BYTES / (0.5 * 0.120) / 1.01
    for p in range(3):
        prompt = history(h, f"p{p}") + [7]
        params = SamplingParams(temperature=0, max_tokens=4)
        h.engine.add_request(f"p{p}-1", prompt, params, f"p{p}")
    restored = []
    for _ in range(100):
        h.engine.scheduler.copies.rate = 300 * BYTES / (0.5 * 0.120) / 1.01  # (not learned here)
        batch_restores = h.kv.host.counters.hits
        h.step()
        restored.append(h.kv.host.counters.hits - batch_restores)
        if not h.engine.scheduler.has_work:
            break
    assert sum(restored) == 3 and max(restored) == 1


# --- sliding-window layers: a saved state keeps only their window -----------------------------


def test_a_reply_rendered_otherwise_resumes_from_the_prompts_checkpoint(make_harness):
    # a model with a 64-token window: the turn's full state goes on exactly only from its end,
    # so the next prompt, whose reply differs (a client re-rendered it), restores the
    # checkpoint saved at the prompt's end; the fake fails a row whose window is not whole
    h = make_harness(host_cache_bytes=MIB, n_ctx=512, n_seq_max=8, swa_window=64)
    first = words(300, 1)
    ask(h, "a-0", first, "alice", max_tokens=20)
    lengths = sorted(len(e.tokens) for e in h.kv.host.entries)
    assert lengths == [300, 319]  # the checkpoint and the whole turn
    ask(h, "evict", words(480, 2), "carol")
    done = ask(h, "a-1", first + words(30, 3), "alice")  # not the reply the model gave
    assert done.cached_tokens == 300 and h.kv.host.counters.hits == 1
    # the whole turn, when the next prompt has all of it
    ask(h, "evict-2", words(480, 4), "carol")
    prompt = history(h, "alice") + words(10, 5)
    done = ask(h, "a-2", prompt, "alice")
    assert done.cached_tokens == len(prompt) - 10


def test_a_restored_prefix_is_never_cut_where_its_window_is_missing(make_harness):
    h = make_harness(host_cache_bytes=MIB, n_ctx=512, n_seq_max=8, swa_window=64)
    first = words(300, 1)
    ask(h, "a-0", first, "alice")
    ask(h, "evict", words(480, 2), "carol")
    ask(h, "a-1", history(h, "alice") + words(10, 3), "alice")  # restored, finished, cached
    cached = next(p for p in h.kv.prefixes if p.owner == "alice")
    assert cached.exact_from > 200
    # a prompt sharing only its first 250 tokens: the cached cells may not be cut there
    done = ask(h, "a-2", first[:250] + words(20, 4), "alice")
    assert done.cached_tokens == 0 or done.cached_tokens >= cached.exact_from


def test_saves_wait_for_room_in_the_step_but_never_for_an_eviction(make_harness):
    h = make_harness(host_cache_bytes=MIB, n_ctx=1024, n_seq_max=12)
    h.engine.scheduler.copies.rate = 1.0  # no room at all: one save a step, the least there is
    params = SamplingParams(temperature=0, max_tokens=60)
    h.engine.add_request("stream", words(40, 9), params, "zoe")  # decodes throughout
    for p in range(3):
        h.engine.add_request(
            f"p{p}", words(200, p), SamplingParams(temperature=0, max_tokens=2), f"p{p}"
        )
    unsaved, saved = [], []
    for _ in range(12):
        before = h.kv.host.counters.saved
        h.step()
        unsaved.append(len(h.kv._unsaved))
        saved.append(h.kv.host.counters.saved - before)
    assert max(unsaved) >= 2  # three turns ended together: their copies wait ...
    assert max(saved) == 1 and unsaved[-1] == 0  # ... one step each, then all are saved
    assert {e.owner for e in h.kv.host.entries} >= {"p0", "p1", "p2"}
    # a turn whose save still waits is saved before its cells go to someone else
    h.engine.add_request("p3", words(200, 3), SamplingParams(temperature=0, max_tokens=2), "p3")
    while h.done("p3") is None:
        h.step()
    assert h.kv._unsaved and h.kv._unsaved[0].owner == "p3"
    h.engine.add_request("big", words(900, 4), SamplingParams(temperature=0, max_tokens=2), "carol")
    h.step()
    assert not [p for p in h.kv.prefixes if p.owner == "p3"]
    assert [e for e in h.kv.host.entries if e.owner == "p3"]
    run_checked(h)
    saved = next(e for e in h.kv.host.entries if e.owner == "p3")
    done = ask(h, "p3-1", saved.tokens + [7], "p3")
    assert done.cached_tokens == len(saved.tokens) and h.kv.host.counters.hits == 1


def test_a_disk_read_that_never_ends_only_delays_its_request(make_harness):
    from concurrent.futures import Future

    from localserve.engine.prefix_tiers import READ_WAIT_S

    class StuckDisk:  # a dead disk: the read is asked for and never answered
        def load(self, user, tokens, share_all, skip, have=0):
            return Future()

        def put(self, entry): ...

        def close(self): ...

    h = make_harness(host_cache_bytes=MIB, disk=StuckDisk(), n_ctx=512, n_seq_max=8)
    h.engine.add_request("a", words(300, 1), SamplingParams(temperature=0, max_tokens=4), "alice")
    h.step()
    assert h.engine.scheduler.num_waiting == 0 and h.done("a") is None  # waiting for the read
    h.runner.clock.now += READ_WAIT_S + 1
    run_checked(h)
    assert h.done("a").finish_reason == "length" and h.done("a").cached_tokens == 0


def _idle_cells_beside_a_stream(h) -> tuple[list[int], Done]:
    """Alice's turn ends while nothing runs (kept in the cells); then bob streams, and alice
    resumes after him. Returns the cells her idle prefix held at each of bob's steps, as the
    fake cache counts them, and her resumed turn."""
    ask(h, "a-0", words(300, 1), "alice")
    alice = next(p for p in h.kv.prefixes if p.owner == "alice")
    assert h.runner.seq_num_cells(alice.seq_id) == 300 + 7  # (the last token is never fed)
    h.engine.add_request("b-0", words(40, 2), SamplingParams(temperature=0, max_tokens=20), "bob")
    held = []
    while h.done("b-0") is None:
        h.step()
        apply_cell_ops(h.runner, h.kv.take_ops())
        held.append(h.runner.seq_num_cells(alice.seq_id) if alice in h.kv.prefixes else 0)
    return held, ask(h, "a-1", history(h, "alice") + words(12, 3), "alice")


def test_a_saved_prefix_leaves_the_cells_while_others_run_and_comes_back_whole(make_harness):
    h = make_harness(host_cache_bytes=MIB, n_ctx=4096, n_seq_max=8)  # room for everyone
    held, resumed = _idle_cells_beside_a_stream(h)
    # bob's steps attend to no cell of alice's (llama.cpp computes masked cells too) ...
    assert len(held) > 5 and max(held) == 0, held
    assert h.kv.host.counters.hits == 1  # ... and her next turn came back in one copy
    assert resumed.cached_tokens >= resumed.prompt_tokens - 13
    assert fed(h, "a-1") <= 13 + resumed.completion_tokens


def test_without_shedding_or_a_host_copy_an_idle_prefix_stays_in_the_cells(make_harness):
    # the controls: the setting off; no host tier (getting it back would be a prefill)
    off = SchedulerConfig(shed_saved_prefixes=False)
    for h in (
        make_harness(off, host_cache_bytes=MIB, n_ctx=4096, n_seq_max=8),
        make_harness(n_ctx=4096, n_seq_max=8),
    ):
        held, resumed = _idle_cells_beside_a_stream(h)
        assert min(held) == 300 + 7, held
        assert h.kv.host.counters.hits == 0  # her next turn took her cells over
        assert resumed.cached_tokens >= resumed.prompt_tokens - 13


def test_a_windowed_turn_leaves_the_cells_only_where_the_host_gives_back_its_prompts_end(
    make_harness,
):
    # a 64-token window: a saved state goes on only from its end, so a turn leaves the cells
    # only once its checkpoint (its prompt's end) is saved too: the same message asked again
    # (or a reply rendered otherwise) restores that, as the cells would have given it
    h = make_harness(host_cache_bytes=MIB, n_ctx=4096, n_seq_max=8, swa_window=64)
    first = words(300, 1)
    ask(h, "a-0", first, "alice", max_tokens=20)
    h.engine.add_request("b-0", words(40, 2), SamplingParams(temperature=0, max_tokens=20), "bob")
    h.step()
    assert not [p for p in h.kv.prefixes if p.owner == "alice"]
    run_checked(h)
    done = ask(h, "a-1", first, "alice")
    assert done.cached_tokens == 299 and h.kv.host.counters.hits == 1
    # what `covers` asks of such a turn's copies, and of a model without a window
    whole = SavedPrefix(words(319, 1), "alice", 0, data=b"x")
    cut = SavedPrefix(whole.tokens[:300], "alice", 0, data=b"x")
    keys = frozenset({whole.key, cut.key})
    assert covers(whole, keys, 300, window=0)
    assert not covers(whole, keys, 300, window=64)  # no checkpoint
    whole.checkpoint = cut
    assert covers(whole, keys, 300, window=64)
    assert not covers(whole, frozenset({whole.key}), 300, window=64)  # the host let it go
    assert not covers(whole, frozenset({cut.key}), 300, window=0)
