"""The continuous-batching scheduler: which tokens go to the accelerator in the next step.

Pure Python, no I/O, no llama.cpp. Every step rebuilds the batch:
1. cancelled sequences leave and free their cells;
2. decode first: one token for every running sequence past its prompt, growing its cells,
   evicting cached prefixes, then preempting the newest running sequence (by recompute), when
   the pool is out;
3. admission: the waiting line (localserve.engine.waiting_line: preempted first, then round-robin
   across users within the per-user cap) lets its head in while its prompt fits in uncommitted
   cells above the watermark; a sequence that starts with a cached prefix it may see reuses
   those cells and prefills only the rest (localserve.engine.kv);
4. prefill: chunks of prompts within `max_num_batched_tokens`, and while anyone decodes within
   the adaptive budget that keeps the step near the ITL target (localserve.engine.budget); users
   who got the least prefill recently go first, and within a user the shortest remaining prompt. A
   prompt admitted in this step that fits whole has the step's prefill to itself (never two such
   steps in a row): its first token waits for a short step, not for a chunk of a paste.
   When several users' long prompts compete, or other users wait for room, the budget grows to
   what gives every prompt being prefilled its first token within `ttft_target_ms` of its
   arrival (earliest deadline first): past that point queue time, not smoothness, is what users
   feel. One user's pastes alone never stretch the others' steps.
5. drafts (speculative decoding, localserve.engine.speculative): decoding sequences whose
   last tokens occurred before in their own text (or the same user's earlier turns of the
   conversation, `DraftHistory`) carry the tokens that followed, verified in this step's
   batch, in what the step has left within the ITL target (stretched only where every stream
   of the step drafts), the batch and the free cells, dealt round-robin across users, only
   where a drafted row is expected to return more tokens than its price buys without drafts;
   a constrained reply's draft is cut where its grammar would refuse it.
Embedding requests (localserve.engine.embedding) take whole inputs from the step's prompt budget
(half of it while prompts are being prefilled), round robin over users, before the prefill
chunks take the rest. The `static` policy admits only when the running set is empty.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

from localserve.config import SchedulerConfig
from localserve.engine.batch import Batch, BatchItem, Sampled, by_sequence
from localserve.engine.budget import DraftRowCost, StepCostModel, deadline_rate, waiting_for_room
from localserve.engine.draft_history import DraftHistory
from localserve.engine.embedding import EmbeddingQueue, schedule_embeddings
from localserve.engine.kv import KVPool
from localserve.engine.prefix_tiers import CopyPace
from localserve.engine.sampling_params import SamplingParams
from localserve.engine.sequence import FinishReason, Sequence, Status
from localserve.engine.speculative import (
    PREFILL_STRETCH,
    Candidate,
    DraftCosts,
    DraftStats,
    Everyone,
    num_accepted,
    plan_drafts,
)
from localserve.engine.waiting_line import Entry, WaitingLine
from localserve.engine.waits import NEWCOMER, Prediction, ReplyLengths, bounds, predict_waits

PROBE_SHARE = 0.02  # of the step time: what probes alone in a step may cost
SERVED_DECAY = 0.5  # per step: how fast a user's recent prefill share is forgotten


class Scheduler:
    """Moves sequences between waiting and running and decides each step's batch."""

    def __init__(
        self,
        config: SchedulerConfig,
        kv: KVPool,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        clock: Callable[[], float] = time.monotonic,
        max_draft_rows: int = 0,
        embeddings: EmbeddingQueue | None = None,
    ) -> None:
        """`max_draft_rows`: logit rows a step may add for drafts (the runner's room for
        them; 0 = no speculative decoding); `embeddings`: the embedding requests' queue."""
        self.config = config
        self.kv = kv
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.clock = clock
        self.cost = StepCostModel()
        self.embeddings = embeddings or EmbeddingQueue(max_num_batched_tokens, max_num_seqs)
        self.running: list[Sequence] = []  # admission order: newest last
        self.line: WaitingLine[Sequence] = WaitingLine(config.max_running_per_user)
        self._served: dict[str, float] = {}  # recent prefill tokens per user (decaying)
        self._cancelled: list[Sequence] = []
        self._quick_step = False  # the last step's prefill was only newly admitted prompts
        self.last_prefill_budget = max_num_batched_tokens
        self._itl_budget = max_num_batched_tokens  # the last step's, before TTFT deadlines
        on = config.speculative != "off" and config.max_draft_tokens > 0
        self.max_draft_rows = max_draft_rows if on else 0
        self._draft_turn = 0  # which user's drafts are dealt first (rotates every step)
        self._probe_credit = 0.0  # seconds of step time probes alone in a step may take
        self.draft_history = DraftHistory()  # finished replies' indexes, per user
        self.draft_cost = DraftRowCost()  # what draft rows add to a step
        self.drafts_everyone = Everyone()  # everyone's recent acceptance: a newcomer's prior
        self._cache_was_full = False  # the last step found no cells: the next one drafts nothing
        self.copies = CopyPace()  # saved prefixes copied in and out of the cells

    # --- requests in and out -------------------------------------------------------------

    def add(self, seq: Sequence) -> None:
        """Queue a new sequence."""
        self.line.add(seq)

    def cancel(self, seq: Sequence) -> None:
        """Mark for removal; takes effect at the next schedule(), also mid-prefill."""
        if not seq.is_finished and not seq.is_cancelled:
            seq.is_cancelled = True
            self._cancelled.append(seq)

    @property
    def num_waiting(self) -> int:
        return len(self.line)

    @property
    def has_work(self) -> bool:
        """Anything to run, cancel or apply (cell operations wait for the next batch)."""
        chats = self.running or self.line or self._cancelled
        return bool(chats or self.kv.has_ops or self.embeddings.has_work)

    def waiting_seqs(self) -> list[Sequence]:
        """Waiting sequences in the order admission would take them (ignoring caps)."""
        return self.line.order()

    def predict_waits(self, lengths: ReplyLengths, newcomer: int = 0) -> dict[str, Prediction]:
        """Every waiting sequence's place in the order it would enter and its predicted wait
        (localserve.engine.waits: these rules played forward on this state); with `newcomer`,
        also that of a new user's prompt of that many tokens arriving now (under NEWCOMER)."""
        ghost = None
        if newcomer:  # a new user's turn comes after every waiting user's next (round-robin)
            ghost = Sequence(NEWCOMER, [0] * newcomer, SamplingParams(), user=NEWCOMER)
        kv = self.kv
        limits = bounds(self.config, kv, self.max_num_seqs, self.max_num_batched_tokens)
        free = kv.num_free + kv.num_cached  # cached prefixes are evicted before anyone waits
        return predict_waits(self.running, self.line, limits, self.cost, lengths, free, ghost)

    # --- one step ------------------------------------------------------------------------

    def schedule(self) -> Batch:
        """Build the next step's batch."""
        now = self.clock()
        batch = Batch(finished=self._reap_cancelled(now))
        batch.embeds_finished = self.embeddings.reap(now)
        self._schedule_decode(batch, now)
        if not batch.preempted:  # cells are short: let running work drain first
            self._admit(batch, now)
        room = self.copies.room(self.kv.op_bytes, self.config.itl_target_ms / 1e3)
        self.kv.emit_saves(room if self.running else None)  # finished turns' copies, if room
        self._schedule_prefill(batch, now)
        if self.max_draft_rows:
            self._schedule_drafts(batch)
        batch.cell_ops = self.kv.take_ops()  # everything decided since the last batch
        return batch

    def postprocess(self, batch: Batch, sampled: list[Sampled], step_s: float) -> None:
        """Account the step: computed cells, sampled tokens, finished and failed sequences."""
        moved = sum(op.saved.nbytes for op in batch.cell_ops if op.saved is not None)
        self.copies.learn(moved, batch.restore_s)
        step_s -= batch.restore_s  # the copies' own time: the step-cost fit learns the rest
        if batch.num_tokens or batch.num_embed_tokens:
            rows, prefill, e = (
                batch.num_decode_tokens,
                batch.num_prefill_tokens,
                batch.num_embed_tokens,
            )
            if batch.num_draft_tokens:  # draft rows are priced apart (DraftRowCost)
                n, b = batch.num_draft_tokens, self.cost.decode_token_s
                extra_s = self.draft_cost.extra_s(n, b)
                if not prefill and not e:  # what the drafts added beyond the decode fit's
                    self.draft_cost.update(n, step_s - self.cost.predict(rows, 0), b)
                step_s -= extra_s  # and the rest teaches the decode fit, as each step does
            if rows or prefill or e:
                self.cost.update(rows, prefill, step_s, e, batch.embed_s)
        drafted = {}
        for item in batch.items:
            if item.draft:
                drafted[id(item.seq)] = item
            else:
                self.kv.computed(item.seq, item.num_tokens)
        now = self.clock()
        for seq, draws in by_sequence(sampled):
            kept = self._append(seq, draws, now)
            batch.kept.append((seq, kept))
            batch.num_generated += kept
            item = drafted.pop(id(seq), None)
            if item is not None:
                self._settle_draft(batch, item, draws, kept)
            if seq.is_finished and seq.finish_reason is not FinishReason.ERROR:
                self._remove_running(seq, keep=True)  # (a failed one is out already)
        for item in drafted.values():  # no draw came back for it (cannot happen; be exact)
            self._settle_draft(batch, item, [], 0)

    def _append(self, seq: Sequence, draws: list[Sampled], now: float) -> int:
        """A sequence's tokens of this step, in order, until it finishes (a stop string, the
        end of generation or max_tokens within a draft leaves the rest unused); a failed draw
        fails that sequence alone. Returns how many tokens it kept."""
        kept = 0
        for s in draws:
            if s.error:  # this sequence alone; the rest go on
                self.fail([seq], f"sampling failed for this request: {s.error}")
                break
            seq.append_token(s.token, s.piece, s.is_eog, now, s.is_last, same_step=kept > 0)
            kept += 1
            if seq.is_finished:
                break
        return kept

    def _settle_draft(self, batch: Batch, item: BatchItem, draws: list[Sampled], kept: int):
        """A drafted row's cells (the kept tokens stand, the rest are trimmed) and what it
        teaches about the sequence's drafts."""
        seq, k = item.seq, len(item.draft)
        if seq.seq_id is not None:
            self.kv.settle_draft(seq, item.num_tokens, kept)
        right = num_accepted(item.draft, draws)  # what the drafter got right
        seq.draft_stats.update(k, right, seq.draft_stats.probing)
        self.drafts_everyone.update(k, right)
        # what the reply got without a step of its own (a stop inside the draft ends it)
        accepted = min(num_accepted(item.draft, draws[:kept]), max(kept - 1, 0))
        seq.num_draft_tokens += k
        seq.num_accepted_tokens += accepted
        batch.num_drafts += 1
        batch.num_accepted_tokens += accepted
        batch.accepted_by_position += [0] * (k - len(batch.accepted_by_position))
        for j in range(accepted):
            batch.accepted_by_position[j] += 1

    def fail(self, seqs: list[Sequence], message: str) -> None:
        """End sequences with an error (an engine fault) and free their cells."""
        now = self.clock()
        for seq in seqs:
            if seq.status is Status.RUNNING:
                self._remove_running(seq)
            seq.finish(FinishReason.ERROR, now, message)

    def on_cache_full(self, batch: Batch) -> list[Sequence]:
        """llama.cpp found no cells for `batch`: believe it, shrink the pool, preempt to fit.

        Nothing in the batch was computed: it is emptied, and the preempted sequences (newest
        first) join `batch.preempted`. Cached prefixes go first: if there were any, nobody is
        preempted and the next step simply tries again.
        """
        victims = []
        self._cache_was_full = True
        self._undraft(batch)
        if not self.kv.evict_all():
            self.kv.shrink(self.kv.num_used + batch.num_tokens - 1)
            while self.running and self.kv.num_committed > self.kv.num_cells:
                victims.append(self.running[-1])
                self._preempt(victims[-1], self.clock())
        batch.preempted += victims
        _empty(batch)
        return victims

    def on_restore_failed(self, batch: Batch, seq_ids: list[int]) -> None:
        """Saved prefixes the runner could not restore: those sequences prefill from the start
        (nothing of the batch was computed: it is emptied, the next step schedules again)."""
        self._undraft(batch)
        for seq in self.running:
            if seq.seq_id in seq_ids:
                self.kv.restore_failed(seq)
        _empty(batch)

    def _undraft(self, batch: Batch) -> None:  # drafts give their cells back: nothing stood
        for item in (i for i in batch.items if i.draft):
            self.kv.settle_draft(item.seq, item.num_tokens, 0)

    def on_failed(self, batch: Batch, message: str) -> None:
        """Decoding `batch` failed: its sequences end with the error (into `batch.finished`)."""
        failed = list({id(item.seq): item.seq for item in batch.items}.values())
        self.fail(failed, message)
        batch.finished += failed
        _empty(batch)

    # --- phases ----------------------------------------------------------------------------

    def _reap_cancelled(self, now: float) -> list[Sequence]:
        reaped, self._cancelled = self._cancelled, []
        for seq in reaped:
            if seq.status is Status.RUNNING:
                self._remove_running(seq, keep=True)  # what it computed may serve a retry
            else:
                self.line.remove(seq)
            seq.finish(FinishReason.CANCELLED, now)
        return reaped

    def _schedule_decode(self, batch: Batch, now: float) -> None:
        # decode: one token per running sequence past its prompt, oldest first
        for seq in list(self.running):
            if seq.status is not Status.RUNNING or seq.is_prefilling or seq.num_computed == 0:
                continue
            while not self.kv.ensure(seq, seq.num_computed + 1):  # evicts cached prefixes first
                victim = self.running[-1]  # newest loses its cells, recomputed later
                self._preempt(victim, now)
                batch.preempted.append(victim)
                if victim is seq:
                    break
            else:
                batch.items.append(BatchItem(seq, seq.num_computed, 1, True))
                batch.num_decode_tokens += 1

    def _admit(self, batch: Batch, now: float) -> None:
        target_s, restores = self.config.itl_target_ms / 1e3, 0  # restores spread over steps

        def fits(seq: Sequence, anyone_running: bool) -> Entry:
            nonlocal restores
            match = self.kv.match(seq)
            saved = match.saved if match is not None else None
            if saved and restores and saved.nbytes > self.copies.room(self.kv.op_bytes, target_s):
                return Entry.WAIT  # the next step restores it
            if not self.kv.try_admit(seq, match, watermark=anyone_running):
                if not anyone_running and len(seq.tokens) > self.kv.num_cells:
                    return Entry.REFUSED  # would never fit, even alone
                return Entry.WAIT
            restores += seq.restored_from is not None
            return Entry.IN

        static = self.config.policy == "static"
        admitted, refused = self.line.admit(self.running, self.max_num_seqs, static, fits)
        for seq in refused:
            message = f"needs {len(seq.tokens)} KV cells; the cache has {self.kv.num_cells}"
            seq.finish(FinishReason.ERROR, now, message)
            batch.finished.append(seq)
        for seq in admitted:
            if seq.restored_from is not None:
                batch.restored.append(seq)
            if seq.num_preemptions == 0:
                seq.cached_tokens = seq.num_computed  # reused from a cached prefix (or restored)
                batch.first_admitted.append(seq)
            seq.status = Status.RUNNING
            seq.mark_scheduled(now)
            batch.admitted.append(seq)

    def _schedule_prefill(self, batch: Batch, now: float) -> None:
        # prefill: chunks within what is left of the step's token budget
        in_batch = {id(item.seq) for item in batch.items}
        prefills = [s for s in self.running if id(s) not in in_batch]
        budget = self._prefill_budget(batch.num_decode_tokens, prefills, now)
        self.last_prefill_budget = budget
        if self.embeddings.has_work:  # whole inputs, in the same step time (half, beside prompts)
            e, c = self.embeddings, self.config
            budget -= schedule_embeddings(e, batch, self.cost, c, bool(prefills), now)
        prefills.sort(key=lambda s: (self._served.get(s.user, 0.0), s.num_remaining))
        self._served = {u: v * SERVED_DECAY for u, v in self._served.items() if v > 1}
        # prompts admitted now that fit whole go first, alone: a new prompt's first token waits
        # for a short step, not for a chunk of someone's paste (never two such steps in a row,
        # so the paste always advances)
        admitted = {id(s) for s in batch.admitted}
        quick = {id(s) for s in prefills if id(s) in admitted and s.num_remaining <= budget}
        if self._quick_step or sum(s.num_remaining for s in prefills if id(s) in quick) > budget:
            quick = set()
        self._quick_step = bool(quick)
        if quick:
            prefills = [s for s in prefills if id(s) in quick]
        for seq in prefills:
            if budget <= 0:
                break
            n = min(seq.num_remaining, budget)
            batch.items.append(BatchItem(seq, seq.num_computed, n, n == seq.num_remaining))
            batch.num_prefill_tokens += n
            budget -= n
            self._served[seq.user] = self._served.get(seq.user, 0.0) + n
        batch.is_stretched = batch.num_prefill_tokens > self._itl_budget

    def _schedule_drafts(self, batch: Batch) -> None:
        """Drafts for this step's decode rows (localserve.engine.speculative.plan_drafts)."""
        decodes = batch.items[: batch.num_decode_tokens]  # scheduled first, one row each
        limit = self.max_num_batched_tokens - batch.num_tokens
        rows = min(self.max_draft_rows, limit, self.kv.spare_cells())
        if self._cache_was_full:  # llama.cpp had fewer cells than counted: none to lend now
            self._cache_was_full, rows = False, 0
        if rows <= 0 or not decodes:
            return
        users = list(dict.fromkeys(item.seq.user for item in decodes))
        turn = self._draft_turn % len(users)
        self._draft_turn += 1
        order = {user: (i - turn) % len(users) for i, user in enumerate(users)}
        proposals = {i: self._draft_candidate(i, item.seq) for i, item in enumerate(decodes)}
        candidates = sorted((c for c, _ in proposals.values() if c), key=lambda c: order[c.user])
        probes: set = set()
        planned = self._plan_drafts(batch, candidates, rows, probes)
        for c in candidates:
            if c.key not in planned:
                decodes[c.key].seq.draft_stats.update(0, 0)  # a step without a draft
        for i, n in planned.items():
            item = decodes[i]
            item.seq.draft_stats.pending = proposals[i][0].forecast_tokens(n)
            item.seq.draft_stats.probing = i in probes
            if not self.kv.ensure(item.seq, item.seq.num_computed + 1 + n):
                continue  # (spare_cells said there was room: cannot happen)
            batch.items[i] = item._replace(num_tokens=1 + n, draft=tuple(proposals[i][1][:n]))
            batch.num_draft_tokens += n

    def _draft_candidate(self, key: int, seq: Sequence) -> tuple[Candidate | None, list[int]]:
        """The sequence's proposed draft, and what the planner needs to know of it."""
        k = self._draft_room(seq)
        if k <= 0:
            return None, []
        if seq.drafter is None:
            seq.drafter = self.draft_history.drafter_for(seq.user, seq.tokens)
            seq.draft_stats = DraftStats(self.config.max_draft_tokens, self.drafts_everyone.prior)
        stats = seq.draft_stats
        draft = seq.drafter.propose(seq.tokens, min(k, stats.cap))
        allowed = getattr(seq.sampler, "allowed_prefix", None)
        if draft and allowed is not None:  # a grammar: only what its matcher would take
            draft = draft[: allowed(draft)]
        if not draft:
            stats.update(0, 0)
            return None, []
        streak = max(stats.streak, seq.drafter.evidence)  # a copying run: as drafts kept
        candidate = Candidate(key, seq.user, stats.rate, len(draft), stats.may_probe,
                              stats.backing_off, streak, stats.calibration)  # fmt: skip
        return candidate, draft

    def _plan_drafts(self, batch: Batch, candidates: list[Candidate], rows: int, probes: set):
        """plan_drafts at the step's prices; probes alone in a step (paying the drafts' whole
        fixed price) take PROBE_SHARE of the time, but for a sequence's first look."""
        rows_now, prefill = batch.num_decode_tokens, batch.num_prefill_tokens
        base_s, b = self.cost.predict(rows_now, prefill), self.cost.decode_token_s
        costs = DraftCosts(
            step_s=base_s,
            num_tokens=rows_now,
            row_s=self.draft_cost.row_s(b),
            limit_s=self.config.itl_target_ms / 1e3,
            max_stretch=PREFILL_STRETCH if prefill else math.inf,
            step_with=lambda n: base_s + self.draft_cost.extra_s(n, b),
        )
        probe_s = self.draft_cost.extra_s(1, b)
        self._probe_credit = min(self._probe_credit + base_s * PROBE_SHARE, 2 * probe_s)
        fresh = any(c.probe and batch.items[c.key].seq.draft_stats.tried == 0 for c in candidates)
        lone = int(fresh or self._probe_credit >= probe_s)
        planned = plan_drafts(candidates, costs, rows, lone, probes)
        if probes and len(probes) == len(planned):
            self._probe_credit -= probe_s
        return planned

    def predict_step(self, batch: Batch) -> float:
        """The step's predicted time: the cost model's, its draft rows priced apart."""
        n, b = batch.num_draft_tokens, self.cost.decode_token_s
        predicted = self.cost.predict(
            batch.num_decode_tokens, batch.num_prefill_tokens, batch.num_embed_tokens
        )
        return predicted + self.draft_cost.extra_s(n, b)

    def _draft_room(self, seq: Sequence) -> int:
        """Draft tokens the sequence may carry: none past max_tokens or the context, and none
        for a seeded sampled reply unless [scheduler] draft_seeded (config.py says why)."""
        p = seq.params
        cap = 0 if p.is_seeded and not self.config.draft_seeded else self.config.max_draft_tokens
        room = min(p.max_tokens - seq.num_output_tokens, seq.max_total_tokens - len(seq.tokens))
        return min(cap, room - 1)

    def _prefill_budget(self, num_decode: int, prefills: list[Sequence], now: float) -> int:
        """The step's prompt tokens: what is left of the batch; while anyone decodes (continuous
        policy) what keeps the step within the ITL target, or meets TTFT deadlines when several
        long prompts compete or requests wait for room."""
        budget = self.max_num_batched_tokens - num_decode
        self._itl_budget = budget
        if not num_decode or self.config.policy != "continuous":
            return budget
        # the step's copies of saved prefixes take their time from the target first
        target = max(self.config.itl_target_ms / 1e3 - self.copies.seconds(self.kv.op_bytes), 0.0)
        floor = self.config.min_prefill_tokens
        itl_budget = self.cost.prefill_budget(num_decode, target, floor, budget)
        self._itl_budget = itl_budget  # what the ITL target alone allows
        # one user's paste (or pastes) never stalls the others' streams; several users' pastes,
        # or others waiting for room, may: TTFT first
        pasting = {s.user for s in prefills if s.num_remaining > itl_budget}
        if len(pasting) > 1 or waiting_for_room(pasting, self.line):
            c = self.config
            rate = deadline_rate(prefills, now, c.ttft_target_ms / 1e3, c.itl_target_ms / 1e3)
            itl_budget = max(itl_budget, self.cost.chunk_for_rate(num_decode, rate, budget))
        return min(budget, itl_budget)

    # --- helpers ---------------------------------------------------------------------------

    def _remove_running(self, seq: Sequence, keep: bool = False, save: bool = False) -> None:
        """Out of the running set; `keep`: its cells stay cached; `keep`, `save`: copied below."""
        self.running.remove(seq)
        self.line.stopped(seq.user)
        self.kv.release(seq, keep, save)
        if seq.drafter is not None and seq.is_finished:  # the conversation's next turn drafts
            seq.drafter.prompt_len = seq.num_prompt_tokens  # from it (the same user's only)
            self.draft_history.keep(seq.user, seq.drafter)

    def _preempt(self, seq: Sequence, now: float) -> None:
        """Out of the cells (their copy to the host tier), back to the head of the line."""
        self._remove_running(seq, save=True)
        seq.mark_preempted(now)
        self.line.requeue(seq)


def _empty(batch: Batch) -> None:
    """Nothing of the batch was computed."""
    batch.items = []
    batch.num_decode_tokens = batch.num_prefill_tokens = batch.num_draft_tokens = 0
