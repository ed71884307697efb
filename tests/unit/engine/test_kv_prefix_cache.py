"""Prefix caching on the fake runner: reuse, sharing, isolation, eviction and honest accounting.

The fake cache shares copied cells the way llama.cpp's unified cache does, so `num_used` (each
cell once) can be checked against it after every step. The real-model checks are in
e2e/test_llama_runner.py and e2e/test_websocket_server.py.
"""

from __future__ import annotations

import random

from localserve.config import SchedulerConfig
from localserve.engine.events import Preempted
from localserve.engine.kv import MIN_REUSE_TOKENS
from localserve.engine.sampling_params import SamplingParams
from tests.support.harness import run_checked

GREEDY = SamplingParams(temperature=0, max_tokens=8)


def words(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(10, 1000) for _ in range(n)]


def add(h, rid, tokens, user="u", max_tokens=8, system=0, everyone=False):
    params = SamplingParams(temperature=0, max_tokens=max_tokens)
    h.engine.add_request(rid, tokens, params, user, system, everyone)


def prefill_tokens(h, rid: str) -> int:
    """Prompt tokens the request had computed (every token it fed but its decode steps)."""
    steps = h.runner.steps
    fed = sum(
        n for s in steps for r, n in zip(s.request_ids, s.num_tokens, strict=True) if r == rid
    )
    return fed - (h.done(rid).completion_tokens - 1)


def test_next_turn_prefills_only_its_new_tokens(make_harness):
    h = make_harness(n_ctx=4096, n_batch=512)
    history = words(300, 1)
    add(h, "t1", history, max_tokens=20)
    run_checked(h)
    # the client resends the reply; its tokens are in the cached prefix
    reply = h.kv.prefixes[0].tokens[len(history) :]
    assert len(reply) == 19  # the last sampled token was never fed back
    second = history + reply + words(40, 2)
    add(h, "t2", second, max_tokens=5)
    run_checked(h)
    done = h.done("t2")
    assert done.cached_tokens == 319 and done.prompt_tokens == 359
    assert prefill_tokens(h, "t2") == 40
    counters = h.engine.metrics.counters
    assert counters.prefix_hits == 1 and counters.cached_tokens == 319


def test_reuse_gives_the_same_output_as_a_full_prefill(make_harness):
    prompt = words(200, 3)
    cold = make_harness(SchedulerConfig(prefix_caching=False))
    add(cold, "a", prompt, max_tokens=30)
    cold.run()
    warm = make_harness()
    add(warm, "warmup", prompt[:150] + words(20, 4), max_tokens=3)
    warm.run()
    add(warm, "a", prompt, max_tokens=30)
    run_checked(warm)
    assert warm.done("a").cached_tokens == 150
    assert warm.text("a") == cold.text("a")


def test_an_identical_prompt_recomputes_only_its_last_token(make_harness):
    h = make_harness()
    prompt = words(100, 5)
    add(h, "a", prompt)
    run_checked(h)
    add(h, "b", prompt)
    run_checked(h)
    assert h.done("b").cached_tokens == 99 and prefill_tokens(h, "b") == 1
    assert h.text("a") == h.text("b")


def test_another_users_prefix_is_never_reused(make_harness):
    h = make_harness()
    prompt = words(200, 6)
    add(h, "a", prompt, user="alice")
    run_checked(h)
    add(h, "b", prompt + words(10, 7), user="bob")
    run_checked(h)
    assert h.done("b").cached_tokens == 0 and prefill_tokens(h, "b") == 210
    add(h, "c", prompt + words(10, 7), user="alice")
    run_checked(h)
    assert h.done("c").cached_tokens == 200


def test_sharing_across_users_when_enabled(make_harness):
    h = make_harness(SchedulerConfig(share_prefixes="all"))
    prompt = words(200, 6)
    add(h, "a", prompt, user="alice")
    run_checked(h)
    add(h, "b", prompt + words(10, 7), user="bob")
    run_checked(h)
    assert h.done("b").cached_tokens == 200


def test_prefix_caching_off_reuses_nothing_and_keeps_nothing(make_harness):
    h = make_harness(SchedulerConfig(prefix_caching=False))
    prompt = words(200, 8)
    add(h, "a", prompt)
    run_checked(h)
    assert h.kv.num_used == 0 and h.kv.prefixes == []
    add(h, "b", prompt)
    run_checked(h)
    assert h.done("b").cached_tokens == 0


def test_shared_system_prompt_is_prefilled_once_and_its_cells_shared(make_harness):
    h = make_harness(n_ctx=4096, n_seq_max=8)
    system = words(300, 9)
    add(h, "first", system + words(20, 10), user="u0", system=300, everyone=True)
    run_checked(h)
    roots = [p for p in h.kv.prefixes if p.is_system]
    assert len(roots) == 1 and roots[0].owner is None and len(roots[0].tokens) == 300
    for i in range(1, 5):
        add(h, f"r{i}", system + words(20, 10 + i), user=f"u{i}", system=300, everyone=True)
    h.step()  # all four admitted: each copies the root
    running = h.engine.scheduler.running
    assert len(running) == 4 and all(s.num_system == 300 for s in running)
    assert h.kv.num_used == h.runner.num_cells_in_use
    run_checked(h)
    for i in range(1, 5):
        assert h.done(f"r{i}").cached_tokens == 300
        assert prefill_tokens(h, f"r{i}") == 20
    assert sum(p.is_system for p in h.kv.prefixes) == 1


def test_a_users_own_system_prompt_is_shared_only_with_that_user(make_harness):
    h = make_harness()
    system = words(100, 11)
    add(h, "a1", system + words(30, 12), user="alice", system=100)
    run_checked(h)
    add(h, "b1", system + words(30, 13), user="bob", system=100)
    run_checked(h)
    assert h.done("b1").cached_tokens == 0  # bob prefilled it himself; his own root now
    add(h, "a2", system + words(30, 14), user="alice", system=100)
    run_checked(h)
    assert h.done("a2").cached_tokens == 100
    owners = sorted(p.owner for p in h.kv.prefixes if p.is_system)
    assert owners == ["alice", "bob"]


def test_cached_prefixes_are_evicted_before_any_live_sequence_is_preempted(make_harness):
    # 1024 cells: five finished conversations fill most of it, then four live requests need it
    h = make_harness(SchedulerConfig(kv_watermark=0.0), n_ctx=1024, n_seq_max=12, max_num_seqs=4)
    for i in range(5):
        add(h, f"old{i}", words(150, 20 + i), user=f"u{i}")
    run_checked(h)
    assert len(h.kv.prefixes) == 5 and h.kv.num_cached > 700
    for i in range(4):
        add(h, f"new{i}", words(150, 40 + i), user=f"v{i}", max_tokens=40)
    run_checked(h)
    assert not any(isinstance(e, Preempted) for e in h.events)
    assert h.engine.metrics.counters.preemptions == 0
    assert h.kv.num_evictions >= 3
    assert all(h.done(f"new{i}").completion_tokens == 40 for i in range(4))


def test_eviction_is_least_recently_used_first(make_harness):
    h = make_harness(SchedulerConfig(kv_watermark=0.0), n_ctx=512, n_seq_max=6, max_num_seqs=2)
    prompts = {u: words(100, 50 + i) for i, u in enumerate("abc")}
    for u, p in prompts.items():
        add(h, f"{u}1", p, user=u)
        run_checked(h)
    add(h, "a2", prompts["a"] + words(5, 60), user="a")  # touches a's prefix: now the newest
    run_checked(h)
    add(h, "big", words(260, 61), user="d")  # needs cells: b's prefix goes first, then c's
    run_checked(h)
    left = {p.owner for p in h.kv.prefixes}
    assert "b" not in left and "a" in left


def test_sequence_ids_of_cached_prefixes_are_given_up_for_admission(make_harness):
    h = make_harness(n_seq_max=4, max_num_seqs=4)
    for i in range(4):
        add(h, f"old{i}", words(40, 80 + i), user=f"u{i}")
    run_checked(h)
    assert h.kv.num_free_seq_ids == 0 and len(h.kv.prefixes) == 4
    for i in range(3):
        add(h, f"new{i}", words(40, 90 + i), user=f"v{i}")
    run_checked(h)
    assert all(h.done(f"new{i}").finish_reason == "length" for i in range(3))
    assert h.kv.num_evictions == 3


def test_short_prompts_are_not_cached(make_harness):
    h = make_harness()
    add(h, "a", words(MIN_REUSE_TOKENS - 10, 1), max_tokens=4)
    run_checked(h)
    assert h.kv.prefixes == [] and h.kv.num_used == 0


def test_cancelled_and_preempted_work_accounts_correctly_under_churn(make_harness):
    """A random mix of conversations, system prompts, cancels and pressure; the books balance."""
    rng = random.Random(0)
    config = SchedulerConfig(kv_watermark=0.0)
    h = make_harness(config, n_ctx=2048, n_seq_max=10, max_num_seqs=4, n_batch=256)
    system = words(64, 100)
    history: dict[str, list[int]] = {}
    for i in range(40):
        user = f"u{rng.randrange(4)}"
        base = history.get(user, system) if rng.random() < 0.7 else system
        tokens = base + words(rng.randrange(5, 200), 200 + i)
        add(
            h, f"r{i}", tokens, user=user, max_tokens=rng.randrange(2, 40), system=64, everyone=True
        )
        history[user] = tokens
        for _ in range(rng.randrange(0, 6)):
            h.step()
            assert h.kv.num_used == h.runner.num_cells_in_use
        if rng.random() < 0.15:
            h.engine.cancel(f"r{i}")
    run_checked(h)
    assert all(h.done(f"r{i}") is not None for i in range(40))
    h.assert_drained()
    assert h.engine.metrics.counters.prefix_hits > 10


def test_a_request_sharing_part_of_a_root_is_admitted_without_reuse_when_that_fits(make_harness):
    """The matched root's unshared tail must not block a prompt that fits once it is evicted."""
    h = make_harness(SchedulerConfig(kv_watermark=0.0), n_ctx=256)
    system = words(150, 300)
    add(h, "a", system, max_tokens=1, system=150, everyone=True)  # a 150-cell root
    run_checked(h)
    add(h, "b", system[:20] + words(230, 301), max_tokens=1)  # 250 tokens, 20 of them shared
    run_checked(h, max_steps=1000)
    assert h.done("b").finish_reason == "length" and h.done("b").cached_tokens == 0


def test_a_new_conversation_leaves_the_users_other_conversation_cached(make_harness):
    h = make_harness()
    system = words(40, 400)
    first = system + words(200, 401)
    add(h, "c1", first, system=40, everyone=True)
    run_checked(h)
    add(h, "c2", system + words(30, 402), system=40, everyone=True)  # another conversation
    run_checked(h)
    assert h.done("c2").cached_tokens == 40  # the system prompt, copied from its root
    add(h, "c1-next", first + words(20, 403), system=40, everyone=True)
    run_checked(h)
    assert h.done("c1-next").cached_tokens == 240  # the first conversation is still there


def test_conversations_that_share_random_prefixes_in_a_tiny_cache_always_drain(make_harness):
    """Many short schedules in 128 cells: prompts reuse random parts of the previous one."""
    for seed in range(150):
        rng = random.Random(seed)
        h = make_harness(
            SchedulerConfig(kv_watermark=0.0), n_ctx=128, n_seq_max=6, max_num_seqs=2, n_batch=64
        )
        previous: list[int] = []
        for i in range(6):
            base = previous[: rng.randint(0, len(previous))]
            tokens = (base + words(rng.randint(1, 128), seed * 10 + i))[:127]
            system = rng.choice([0, 0, 20, 40]) if len(tokens) > 40 else 0
            add(
                h,
                f"r{i}",
                tokens,
                user=rng.choice("ab"),
                max_tokens=rng.randint(1, 5),
                system=system,
                everyone=rng.random() < 0.5,
            )
            run_checked(h, max_steps=3000)
            previous = tokens
        h.assert_drained()
