"""The engine core: sequences, the KV-cell pool, the scheduler, the step loop, events and
metrics. No asyncio, no sockets, no llama.cpp: a `Runner` does the tensor work.

- `sequence.py`: a request's life inside the engine: tokens, KV position, status, timings.
- `sampling_params.py`: a request's sampling parameters, checked.
- `text_stream.py`: a sequence's text as it streams: UTF-8 decoding, stop strings.
- `kv.py`: the KV cells as a capacity pool: sequence ids, cached prefixes.
- `prefix_tiers.py`: the prefix cache below the cells: saved KV state in host memory, the disk
  tier's interface, the rule of what leaves a tier first, restores paced within a step.
- `budget.py`: the adaptive prefill budget of a step that also carries decodes.
- `speculative.py`: n-gram drafts: more than one token per sequence per step.
- `draft_history.py`: a conversation's earlier turns as draft sources, per user.
- `embedding.py`: embedding requests: their checks, their queue and each step's packing of inputs.
- `batch.py`: one step's batch, and what the runner sampled of it.
- `waiting_line.py`: who enters next: preempted first, users in turn under their cap (the one
  copy of that policy, for the scheduler and the predicted waits).
- `scheduler.py`: the continuous-batching scheduler: what goes into the next step.
- `waits.py`: the waiting requests' places and predicted waits: the scheduler played forward.
- `slowdown.py`: the steps against this machine's own best: the sign of a busy machine.
- `runner.py`: the one seam to the hardware: what the engine needs of a model runner.
- `engine.py`: the scheduler and the runner on one thread: requests in, events out.
- `events.py`: what the engine tells the world, one list of events per step.
- `metrics.py`: metrics with vLLM's definitions, recorded on the engine thread.
- `stats.py`: summary statistics the metrics and the load generator share.
- `snapshot.py`: one look at the engine, built on its thread between steps.
- `client.py`: the engine's interface (`EngineClient`) and its commands.
"""
