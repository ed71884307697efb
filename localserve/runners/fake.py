"""A deterministic fake of the runner, for testing the scheduler and engine logic.

It keeps llama.cpp's rules that matter to the engine: a sequence's tokens must continue at
exactly pos_max + 1, the cache has `n_ctx` cells (KVCacheFull when a batch does not fit, state
unchanged), a cell copied to another sequence is shared, not duplicated (it is freed when its
last sequence lets go), and more than n_batch tokens or max_num_seqs logit rows would abort the
real process (here an AssertionError). Each step advances a fake clock by a linear cost model,
so timing logic is testable without sleeping. `embed` gives each input a unit vector of
`n_embd` dims drawn from a seed that is its tokens' checksum (the same input, the same vector,
whatever else is in the batch), asserts the embedding context's limits (n_batch tokens and
n_seq_max inputs, as the real one's aborts) and costs `embed_cost` on the clock.

Its "model" picks each next token from the previous token and the position; with `repeats` it
instead repeats its prompt, each token followed by what followed it there (but for every
`repeats`-th position), so n-gram drafts are mostly right; with `sampled` its rows are
distributions drawn from by the request's own numpy sampler (`runners.sampling.Sampler`,
seeded), for tests of the sampled path. A drafted row is verified as the llama.cpp runner
verifies it (`verify_draft`).

Tested in tests/unit/engine/test_scheduler.py and tests/unit/engine/test_engine.py.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from localserve.engine.batch import Batch, Sampled
from localserve.engine.runner import DecodeError, KVCacheFull, RunTimings, apply_cell_ops
from localserve.engine.sampling_params import SamplingParams
from localserve.engine.speculative import verify_draft
from localserve.protocol.snapshot import ModelInfo
from localserve.runners.grammar import Constrained, GrammarEngine, sample_constrained
from localserve.runners.sampling import Sampler, SamplingError

EOG = 1
BOS = 2
FIRST_WORD = 10


@dataclass
class FakeClock:
    now: float = 1000.0

    def __call__(self) -> float:
        return self.now


@dataclass
class RunRecord:
    """What one fake decode ran."""

    num_decode: int
    num_prefill: int
    seq_ids: list[int]
    request_ids: list[str]
    num_tokens: list[int] = field(default_factory=list)  # per item


@dataclass
class FakeRunner:
    n_ctx: int = 4096
    n_seq_max: int = 8  # sequence ids
    max_num_seqs: int | None = None  # running sequences (n_outputs_max); None = n_seq_max
    n_batch: int = 512
    n_vocab: int = 1000
    clock: FakeClock = field(default_factory=FakeClock)
    step_cost: tuple[float, float, float] = (0.010, 0.002, 0.001)  # base, per decode, per prefill
    eog_every: int | None = None  # sample EOG when (last token + position) % eog_every == 0
    steps: list[RunRecord] = field(default_factory=list)
    timings: RunTimings = field(default_factory=RunTimings)
    supports_prefix_reuse: bool = True
    failing_requests: set[str] = field(default_factory=set)  # their sampling fails (a fault)
    template_source: str | None = None  # a chat template's text, for the formats it shows
    max_draft_rows: int = 0  # logit rows a step may add for drafts (0: no speculative decoding)
    repeats: int = 0  # > 0: the model repeats its prompt, but for every repeats-th position
    sampled: bool = False  # rows are distributions over 4 tokens, drawn by the request's sampler
    # embeddings: vector length, the embedding step's limits (tokens, inputs), its cost (base,
    # per token), an embedding-only model, and a token whose input makes the embed decode fail
    n_embd: int = 64
    max_embed_tokens: int = 512
    max_embed_step_inputs: int = 64
    max_embed_inputs: int = 2048
    embed_cost: tuple[float, float] = (0.002, 0.002)
    is_embedding_only: bool = False
    failing_embed_token: int | None = None
    embed_calls: list[list[int]] = field(default_factory=list)  # tokens per input, per call
    # sliding-window layers' span (0: none): as llama.cpp, a saved state keeps only the last
    # swa_window positions of those layers, and a row needing an older one fails the step
    swa_window: int = 0

    def __post_init__(self) -> None:
        self.max_num_seqs = self.max_num_seqs or self.n_seq_max
        self.cells: dict[int, dict[int, int]] = {}  # seq id -> {position: cell}
        self.refs: dict[int, int] = {}  # cell -> sequences holding it
        self.cell_tokens: dict[int, int] = {}  # cell -> the token computed there
        self.windowless: set[int] = set()  # restored cells without their sliding-window part
        self.failing_restores = False  # every restore is refused (as llama.cpp may)
        self._next_cell = 0
        self.num_samplers = 0
        self._grammar: GrammarEngine | None = None  # made at the first constrained request
        self.info = ModelInfo(
            model="fake",
            backend="CPU",
            n_ctx=self.n_ctx,
            n_seq_max=self.n_seq_max,
            n_batch=self.n_batch,
            n_vocab=self.n_vocab,
            n_layer=1,
            n_gpu_layers=0,
            n_threads=1,
            chat_template="fake",
            max_num_seqs=self.max_num_seqs,
            max_draft_rows=self.max_draft_rows,
            n_embd=self.n_embd,
            is_embedding_only=self.is_embedding_only,
            max_embed_tokens=self.max_embed_tokens,
            max_embed_inputs=self.max_embed_inputs,
            max_embed_step_inputs=self.max_embed_step_inputs,
        )

    # --- text ------------------------------------------------------------------------------

    def tokenize(self, text: str, add_special: bool = True) -> list[int]:
        words = [FIRST_WORD + sum(w.encode()) % (self.n_vocab - FIRST_WORD) for w in text.split()]
        return ([BOS] if add_special else []) + words

    def apply_chat_template(
        self, messages: list[dict], tools: list[dict] | None = None, **template_kwargs
    ) -> str:
        """`<role> text ` per message (and `<tools> names ` first when tools are offered)."""
        names = [t.get("function", {}).get("name", "?") for t in tools or ()]
        head = f"<tools> {' '.join(names)} " if names else ""
        return head + "".join(f"<{m['role']}> {_text(m)} " for m in messages) + "<model> "

    def piece(self, token: int) -> bytes:
        return b"" if token < FIRST_WORD else f"w{token} ".encode()

    def is_eog(self, token: int) -> bool:
        return token == EOG

    def new_sampler(self, params: SamplingParams) -> Any:
        self.num_samplers += 1
        if params.constraint is None:
            return Sampler(params) if self.sampled else {"seed": params.seed}
        if self._grammar is None:
            self._grammar = GrammarEngine(self._grammar_tokenizer, self.n_vocab)
        return self._grammar.new_sampler({"seed": params.seed}, params.constraint)

    def _grammar_tokenizer(self):
        """llguidance's tokenizer over the fake's pieces ("w123 "; EOG is its end)."""
        import llguidance
        from llguidance._tokenizer import TokenizerWrapper

        pieces = [
            self.piece(t) if t >= FIRST_WORD else b"\xff<t%d>" % t for t in range(self.n_vocab)
        ]

        class _Words:
            eos_token_id, bos_token_id, tokens = EOG, BOS, pieces
            special_token_ids = list(range(FIRST_WORD))

            def __call__(self, data: bytes) -> list[int]:
                return self.tokenize(data)

            def tokenize(self, data: bytes | str) -> list[int]:
                text = data.decode(errors="replace") if isinstance(data, bytes) else data
                return [int(w[1:]) for w in text.split() if w[:1] == "w" and w[1:].isdigit()]

        return llguidance.LLTokenizer(TokenizerWrapper(_Words()))

    def free_sampler(self, sampler: Any) -> None:
        if sampler is not None:
            self.num_samplers -= 1

    # --- the step --------------------------------------------------------------------------

    def run(self, batch: Batch) -> list[Sampled]:
        self.timings = RunTimings()
        restore_s = apply_cell_ops(self, batch.cell_ops)
        if not batch.items:
            return []
        assert batch.num_tokens <= self.n_batch, "llama.cpp would abort: n_tokens > n_batch"
        rows = [item for item in batch.items if item.wants_logits]
        max_rows = self.max_num_seqs + self.max_draft_rows
        assert batch.num_logit_rows <= max_rows, "llama.cpp would abort: outputs > n_outputs_max"
        if self.num_cells_in_use + batch.num_tokens > self.n_ctx:
            raise KVCacheFull("fake: no free cells")
        for seq, start, k, _, draft in batch.items:
            tokens = [seq.tokens[start], *draft] if draft else seq.tokens[start : start + k]
            self._check_history(seq, start)
            self._place(seq.seq_id, start, k, tokens)
        a, b, c = self.step_cost
        num_rows = batch.num_decode_tokens + batch.num_draft_tokens
        decode_s = a + b * num_rows + c * batch.num_prefill_tokens
        self.timings = RunTimings(decode_s=decode_s, restore_s=restore_s)
        self.clock.now += decode_s
        self.steps.append(
            RunRecord(
                batch.num_decode_tokens,
                batch.num_prefill_tokens,
                [item.seq.seq_id for item in batch.items],
                [item.seq.request_id for item in batch.items],
                [item.num_tokens for item in batch.items],
            )
        )
        for item in rows:  # as the llama.cpp runner: masks computed while it "decodes"
            if isinstance(item.seq.sampler, Constrained):
                item.seq.sampler.prepare()
        sampled = []
        for item in rows:
            if item.draft:
                sampled += verify_draft(item.draft, lambda j, i=item: self._sample(i, j))
            else:
                sampled.append(self._sample(item))
        return sampled

    def embed(self, inputs: list[list[int]]) -> np.ndarray:
        num_tokens = sum(map(len, inputs))
        assert num_tokens <= self.max_embed_tokens, "llama.cpp would abort: n_tokens > n_batch"
        assert len(inputs) <= self.max_embed_step_inputs, "more inputs than the context's seqs"
        self.embed_calls.append([len(tokens) for tokens in inputs])
        base, per_token = self.embed_cost
        embed_s = base + per_token * num_tokens
        self.clock.now += embed_s
        self.timings = self.timings._replace(embed_s=embed_s)
        if any(self.failing_embed_token in tokens for tokens in inputs):
            raise DecodeError("fake: the embedding decode failed")
        return np.stack([fake_vector(tokens, self.n_embd) for tokens in inputs])

    def _check_history(self, seq, start: int) -> None:
        """A row attends to the cells of positions [0, start): they must hold the sequence's
        own tokens (a prefix reused, copied or restored from another text would not)."""
        held = self.cells.get(seq.seq_id, {})
        cached = [self.cell_tokens.get(held.get(pos, -1)) for pos in range(start)]
        if cached != seq.tokens[:start]:
            wrong = next(p for p in range(start) if cached[p] != seq.tokens[p])
            raise AssertionError(
                f"fake: seq {seq.seq_id}'s cache differs from its tokens at {wrong}"
            )
        if self.swa_window:  # the window of the row's first token must be whole
            seen = range(max(0, start - self.swa_window + 1), start)
            lost = [pos for pos in seen if held.get(pos) in self.windowless]
            assert not lost, f"fake: seq {seq.seq_id} needs sliding-window cells {lost[:3]}..."

    def _place(self, seq_id: int, start: int, k: int, tokens: list[int]) -> None:
        """New cells for positions [start, start + k), which must continue the sequence."""
        held = self.cells.setdefault(seq_id, {})
        expected = max(held) + 1 if held else 0
        if start != expected:
            raise ValueError(f"seq {seq_id}: batch starts at {start}, cache at {expected}")
        for pos, token in zip(range(start, start + k), tokens, strict=True):
            held[pos] = self._next_cell
            self.refs[self._next_cell] = 1
            self.cell_tokens[self._next_cell] = token
            self._next_cell += 1

    def _sample(self, item, row: int | None = None) -> Sampled:
        """The token after the item's last token, or after its `row`-th token (a draft)."""
        seq = item.seq
        if seq.request_id in self.failing_requests:
            return Sampled(seq, error="fake: the logits are not finite")
        if row is None:
            last, position = seq.tokens[-1], item.start + item.num_tokens
        else:  # row 0 follows the sequence's last token, row j the draft's j-th
            last = seq.tokens[item.start] if row == 0 else item.draft[row - 1]
            position = item.start + row + 1
        token = self._next_token(last, position, seq)
        sampler, is_last = item.seq.sampler, False
        if isinstance(sampler, Constrained):  # its own token if allowed, else the first allowed
            logits = np.zeros(self.n_vocab, dtype=np.float32)
            logits[token] = 1.0
            try:
                token, is_last = sample_constrained(sampler, logits)
            except SamplingError as e:
                return Sampled(item.seq, error=str(e))
        return Sampled(item.seq, token, self.piece(token), token == EOG, is_last=is_last)

    def _next_token(self, last: int, position: int, seq=None) -> int:
        """The model's token at `position` after `last` (with `sampled`, drawn by the
        sequence's sampler from a distribution that favours that token)."""
        if self.eog_every and (last + position) % self.eog_every == 0:
            return EOG
        token = FIRST_WORD + (last * 31 + position * 17 + 7) % (self.n_vocab - FIRST_WORD)
        if self.repeats and seq is not None and position % self.repeats:
            token = _following(seq.tokens[1 : seq.num_prompt_tokens], last)
        if self.sampled and seq is not None and isinstance(seq.sampler, Sampler):
            logits = np.full(self.n_vocab, -np.inf, dtype=np.float32)
            others = [FIRST_WORD + (token + i * 7) % (self.n_vocab - FIRST_WORD) for i in (1, 2, 3)]
            logits[others] = 0.0  # each a ninth as likely as `token`
            logits[token] = np.log(9.0, dtype=np.float32)
            return seq.sampler.sample(logits)
        return token

    # --- memory ----------------------------------------------------------------------------

    @property
    def num_cells_in_use(self) -> int:
        """Distinct cells holding tokens (a shared cell counts once), as llama.cpp counts."""
        return len(self.refs)

    def free_seq(self, seq_id: int) -> None:
        self.trim_seq(seq_id, 0)
        self.cells.pop(seq_id, None)

    def trim_seq(self, seq_id: int, num_tokens: int) -> bool:
        held = self.cells.get(seq_id, {})
        for pos in [p for p in held if p >= num_tokens]:
            self._unref(held.pop(pos))
        return True

    def copy_seq(self, src: int, dst: int, num_tokens: int) -> None:
        target = self.cells.setdefault(dst, {})
        for pos, cell in self.cells.get(src, {}).items():
            if pos < num_tokens and target.get(pos) != cell:
                assert pos not in target, "fake: copying over a position the target holds"
                target[pos] = cell
                self.refs[cell] += 1

    def _unref(self, cell: int) -> None:
        self.refs[cell] -= 1
        if not self.refs[cell]:
            del self.refs[cell]
            self.cell_tokens.pop(cell, None)
            self.windowless.discard(cell)

    # a saved state: a header (magic, positions) and, per position, its token, padded to
    # STATE_BYTES_PER_TOKEN as a real state is to its layers' K and V
    STATE_BYTES_PER_TOKEN = 64
    kv_bytes_per_token = STATE_BYTES_PER_TOKEN  # the engine's first estimate of a state's size
    _MAGIC = b"FAKEKV01"

    def save_seq(self, seq_id: int) -> bytes:
        held = self.cells.get(seq_id, {})
        if not held or sorted(held) != list(range(len(held))):
            return b""
        tokens = [self.cell_tokens[held[pos]] for pos in range(len(held))]
        pad = bytes(self.STATE_BYTES_PER_TOKEN - 4)
        body = b"".join(t.to_bytes(4, "little") + pad for t in tokens)
        return self._MAGIC + len(tokens).to_bytes(4, "little") + body

    def restore_seq(self, seq_id: int, data: bytes) -> bool:
        self.free_seq(seq_id)
        size = self.STATE_BYTES_PER_TOKEN
        if self.failing_restores or data[:8] != self._MAGIC:
            return False
        n = int.from_bytes(data[8:12], "little")
        if len(data) != 12 + n * size or self.num_cells_in_use + n > self.n_ctx:
            return False
        tokens = [int.from_bytes(data[12 + i * size : 16 + i * size], "little") for i in range(n)]
        self._place(seq_id, 0, n, tokens)
        if self.swa_window:  # only the window's last positions came back for those layers
            held = self.cells[seq_id]
            self.windowless.update(held[pos] for pos in range(max(0, n - self.swa_window)))
        return True

    def seq_num_cells(self, seq_id: int) -> int:
        return len(self.cells.get(seq_id, ()))

    def close(self) -> None:
        if self._grammar is not None:
            self._grammar.close()
        self.cells.clear()
        self.refs.clear()


def fake_vector(tokens: list[int], n_embd: int) -> np.ndarray:
    """The fake's vector for an input: a unit vector seeded by its tokens' checksum."""
    seed = zlib.crc32(np.asarray(tokens, dtype=np.int64).tobytes())
    v = np.random.default_rng(seed).standard_normal(n_embd).astype(np.float32)
    return v / np.linalg.norm(v)


def _following(prompt: list[int], last: int) -> int:
    """The token after `last`'s first occurrence in the prompt (after its end, or after a
    token it does not hold, its start)."""
    try:
        i = prompt.index(last)
    except ValueError:
        return prompt[0]
    return prompt[(i + 1) % len(prompt)]


def _text(message: dict) -> str:
    content = message.get("content")
    if isinstance(content, list):  # [{type: text, text}] parts
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return content or ""
