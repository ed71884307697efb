"""Every number the diagnosis judges by, in one place; docs/diagnosis.md explains each use.

Tested in tests/unit/tui/diagnosis/test_diagnosis.py.
"""

from __future__ import annotations

# how the history is read
TREND_LOOKBACK_S = 45.0  # compare the newest p50 with one at least this much older
TREND_MIN_SPAN_S = 15.0  # less history than this: no trend, only levels
COUNTER_WINDOW_S = 60.0  # "in the last minute" for preemptions, rejections, prefix reuse
RISING_RATIO = 1.5  # rising = now >= RISING_RATIO x then ...
TTFT_RISE_MIN_S = 0.25  # ... and at least this much more (TTFT)
ITL_RISE_MIN_S = 0.010  # ... and at least this much more (ITL)

# TTFT and the queue
TTFT_HIGH_S = 2.0  # TTFT p50 this high is a problem even when flat
TTFT_BAD_S = 10.0  # TTFT p50 (or the oldest wait) this high: level bad
QUEUE_WAIT_HIGH_S = 2.0  # a waiting request has waited this long: TTFT problem, queue evidence
QUEUE_DOMINANT_SHARE = 0.5  # mean queue time / mean TTFT at or above: time in queue dominates
TTFT_PENDING_S = 1.0  # a request prefilling this long keeps a TTFT warning about now
ADMISSION_STALL_S = 2.0  # waiting with nothing running this long: admission blocked

# capacity and prefill
KV_FULL_SHARE = 0.9  # live committed / total KV cells at or above: the cache is nearly full
LONG_PROMPT_TOKENS = 1024  # a prompt this long, prefilling, makes the steps prefill-heavy
PREFILL_BOUND_SHARE = 0.5  # prefill share of step time at or above: prefill dominates steps

# ITL
ITL_PREFILL_SHARE = 0.3  # prefill share of step time at or above: named as an ITL cause
DECODE_STEP_OF_TARGET = 0.75  # decode part of a step >= this x ITL target: decoders contend
ENGINE_SHARE_HIGH = 0.3  # time outside llama_decode at or above: named as an ITL cause
ITL_BAD_FACTOR = 2.0  # ITL p50 >= this x target: level bad
STRETCHED_SHARE = 0.3  # recent steps the TTFT target stretched, at or above: named as the cause

# the machine
OTHERS_CORES_SHARE = 0.5  # others' runnable threads, as a share of the cores, at or above: busy
SLOWDOWN_HIGH = 1.5  # recent steps this many times their shape's best: slowed with a busy host
SLOWDOWN_ALONE = 2.0  # ... and this many times: slowed even without a host reading (a GPU)
SLOWDOWN_BAD = 3.0  # level bad

# who holds the server
HOLDER_SHARE = 0.5  # one user's share of the running sequences, live cells or queue, at or above
HOLDER_FAIR_FACTOR = 1.5  # ... and at least this many times their fair share (1 / the people
# sharing them, at most one each: with 2 slots and 10 people, a slot's holder has a fair half)
HOLDER_MIN_SEQS = 2  # ... with at least this many of them

# the answer
HEADLINE_MAX = 100  # characters
DETAIL_MAX = 200  # characters per detail line
LEVELS = ("ok", "info", "warn", "bad")  # in order of severity
