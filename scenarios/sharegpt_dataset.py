"""Per-request lengths of ``vllm bench serve --dataset-name sharegpt`` when only the mean
lengths are known.

``vllm bench serve --dataset-name sharegpt`` sends each conversation's first human turn as
the prompt and asks for as many tokens as the first reply had (``max_tokens``), keeping only
pairs that pass ``is_valid_sequence`` (``vllm/benchmarks/datasets.py``): prompt and reply of
at least 4 tokens, a prompt of at most 1,024 and a pair of at most 2,048. The lengths vary
widely, and a burst of such requests lasts until its longest reply is decoded, at the small
batch that is left by then: replaying every request at the mean lengths finishes them all in
lockstep and so overstates a burst's throughput (and hides the spread of TPOT).

Given only the means (the gpustack set, ``../shared/data/gpustack_h100``, or a user's run
without ``--save-detailed``), the lengths are drawn from the distribution that assumes nothing
beyond a positive length with a known mean, the exponential (maximum entropy), each pair passed
through the client's filter, with scales solved so that the kept prompts and replies have the
given means. Nothing is fitted to measured latencies; it is an approximation of an unknown
sample. Used by ``workload.sharegpt`` (``conf/workload/sharegpt.yaml``) and by the replays of
``python -m calibration validate gpustack_csv=…``.
"""

from __future__ import annotations

import numpy as np

MIN_LEN = 4  # is_valid_sequence: min_len
MAX_PROMPT = 1024  # max_prompt_len
MAX_TOTAL = 2048  # max_total_len
_DRAWS_PER_REQUEST = 32  # enough that the filter leaves n pairs at every reachable mean
_ITERATIONS = 60
# means the draw reaches for any seed (checked over seeds and sample sizes by the tests):
# a prompt of 8 to 400 tokens (the filter keeps prompts up to 1,024, so near 514, the uniform
# limit, a sample of 1,000 misses the mean at some seeds), a reply of 8 to 500, together at
# most 800 (pairs up to 2,048). vLLM's ShareGPT samples have about 215 and 200. The documents'
# output means count generated tokens (EOS can end a reply before max_tokens): the filter is
# applied to them as if they were the replies' lengths.
MEAN_BOUNDS = ((2 * MIN_LEN, 400), (2 * MIN_LEN, 500), 800)


def client_filter(prompts: np.ndarray, replies: np.ndarray) -> np.ndarray:
    """Which (prompt, reply) pairs ``vllm bench serve``'s ShareGPT sampler keeps."""
    return ((prompts >= MIN_LEN) & (replies >= MIN_LEN) & (prompts <= MAX_PROMPT)
            & (prompts + replies <= MAX_TOTAL))


def sharegpt_lengths(n: int, mean_prompt: float, mean_reply: float,
                     rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """``n`` prompt and reply lengths (int64) that pass the client's filter and have the given
    means within half a token (a token or 5% for a sample too small for that): exponential draws
    (from ``rng``) whose scales are solved for the kept means. ``ValueError`` if no such draw
    exists (``reachable`` says which means do)."""
    if not reachable(mean_prompt, mean_reply):
        raise ValueError(f"mean lengths ({mean_prompt}, {mean_reply}) that the client's filter "
                         f"cannot keep: {bounds_text()}")
    unit_prompt = rng.standard_exponential(_DRAWS_PER_REQUEST * n)
    unit_reply = rng.standard_exponential(_DRAWS_PER_REQUEST * n)
    scale_p, scale_r = mean_prompt, mean_reply
    best, best_miss = None, np.inf
    for _ in range(_ITERATIONS):
        prompts, replies = _kept(unit_prompt, unit_reply, scale_p, scale_r, n)
        got_p, got_r = prompts.mean(), replies.mean()
        if abs(got_p - mean_prompt) < 0.5 and abs(got_r - mean_reply) < 0.5:
            return prompts, replies
        miss = max(abs(got_p - mean_prompt) / _slack(mean_prompt),
                   abs(got_r - mean_reply) / _slack(mean_reply))
        if miss < best_miss:
            best, best_miss = (prompts, replies), miss
        scale_p *= mean_prompt / got_p
        scale_r *= mean_reply / got_r
    # a few requests cannot always land within half a token (their mean moves in steps of
    # 1/n, and the scale updates can swing between two samples): within _slack they stand
    if best_miss > 1:
        raise ValueError(f"mean lengths ({mean_prompt}, {mean_reply}) not reached under the "
                         f"client's filter with {n} requests; draw more requests")
    return best


def _slack(mean: float) -> float:
    """How far a small sample's mean may miss ``mean``: a token or 5%, the larger."""
    return max(1.0, 0.05 * mean)


def _kept(unit_prompt, unit_reply, scale_p, scale_r, n):
    """The first ``n`` pairs at these scales that pass the filter."""
    prompts = np.rint(unit_prompt * scale_p).astype(np.int64)
    replies = np.rint(unit_reply * scale_r).astype(np.int64)
    keep = np.flatnonzero(client_filter(prompts, replies))[:n]
    if len(keep) < n:
        raise ValueError(f"the filter kept {len(keep)} of {len(prompts)} draws, fewer than {n}")
    return prompts[keep], replies[keep]


def reachable(mean_prompt: float, mean_reply: float) -> bool:
    """Whether filtered exponential draws can have these means (``MEAN_BOUNDS``)."""
    (p_low, p_high), (r_low, r_high), pair = MEAN_BOUNDS
    return (p_low <= mean_prompt <= p_high and r_low <= mean_reply <= r_high
            and mean_prompt + mean_reply <= pair)


def bounds_text() -> str:
    """``MEAN_BOUNDS`` in words, for messages."""
    (p_low, p_high), (r_low, r_high), pair = MEAN_BOUNDS
    return (f"prompt mean in [{p_low}, {p_high}], reply mean in [{r_low}, {r_high}], "
            f"together at most {pair} tokens")
