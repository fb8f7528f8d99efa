"""A compiled replica's state rows and the queue and KV-block operations its policies share.

``q`` is a replica's row of integer state (fields below), ``qf`` its row of floats, ``cfg``
the pool's config row; a replica's waiting queue is a linked list through ``wnext`` (one
entry per request: a request waits on one replica at a time), or under a keyed order a heap
(``sim.compiled.keyed_queue``). The operations are
``PagedKVCache.allocate``/``allocate_all``/``free`` (with vLLM's prefix cache where it is on:
``sim.compiled.prefix_cache``) and ``TokenBudgetScheduler._preempt``/``_admit`` (recompute)
over those arrays; ``t`` is the compiled request table (``sim.compiled.core``).
"""

from __future__ import annotations

import math

from sim.compiled import prefix_cache as PC
from sim.compiled.jit import compiled

# fields of a replica's integer state row
# (CHUNKED: SGLang's request being prefilled in chunks, -1: none; ALIVE: 1 while the router
# may send it requests, 0 for an autoscaler's replica off, starting or draining)
FREE, NRUN, WHEAD, WTAIL, WCOUNT, PHASE, NB, QLEN, OUT, STARTED, CHUNKED, ALIVE = range(12)
NUM_FIELDS = 12
# fields of a replica's float state row: step start, step end, SGLang's new_token_ratio, when
# it last came to hold no request and the stamp of that step's event (an autoscaler's drain
# ends then)
START, END, RATIO, EMPTIED, EMPTIED_STAMP = range(5)
NUM_FLOATS = 5
WAITING, RUNNING, FINISHED, REJECTED = 1, 2, 3, 4  # sim.state's status codes
# the replica config row: max_num_batched_tokens, max_num_seqs, long_prefill_token_threshold,
# chunked prefill, block size, blocks, policy, TensorRT-LLM's GUARANTEED_NO_EVICT, chunk_size,
# the waiting queue's order (sim.compiled.keyed_queue: FCFS, PRIORITY, DEADLINE)
POLICY, NO_EVICT, CHUNK, ORDER = 6, 7, 8, 9
VLLM, SARATHI, TRTLLM, SGLANG, ORCA = 0, 1, 2, 3, 4  # policy codes (sim.compiled.core.POLICIES)


@compiled
def wait_append(q, wnext, rid):
    """Queue ``rid`` at the back of the replica's waiting queue."""
    if q[WCOUNT]:
        wnext[q[WTAIL]] = rid
    else:
        q[WHEAD] = rid
    q[WTAIL] = rid
    q[WCOUNT] += 1


@compiled
def wait_appendleft(q, wnext, rid):
    """Queue ``rid`` at the front of the replica's waiting queue."""
    if q[WCOUNT] == 0:
        q[WTAIL] = rid
    wnext[rid] = q[WHEAD]
    q[WHEAD] = rid
    q[WCOUNT] += 1


@compiled
def wait_popleft(q, wnext):
    """Take the front of the replica's waiting queue."""
    rid = q[WHEAD]
    q[WCOUNT] -= 1
    if q[WCOUNT]:
        q[WHEAD] = wnext[rid]
    return rid


@compiled
def allocate(rid, n, t, q, bs):
    """``PagedKVCache.allocate``: blocks for ``n`` more tokens; False when full."""
    held = t[5]
    need = (t[2][rid] + n + bs - 1) // bs - held[rid]
    if need <= 0:
        return True
    if need > q[FREE]:
        return False
    held[rid] += need
    PC.take(t, q, t[PC.INDEX][rid], need, FREE)
    return True


@compiled
def free(rid, t, q):
    """``PagedKVCache.free`` of one request: its blocks back (cached ones stay cached)."""
    held = t[5]
    q[FREE] += held[rid] + PC.release(t, rid)
    held[rid] = 0


@compiled
def want_of(rid, num_tokens, computed, threshold):
    w = num_tokens[rid] - computed[rid]
    return min(w, threshold) if threshold > 0 else w


@compiled
def unmatch(rid, hit, t, q):
    """``TokenBudgetScheduler._unmatch``: a request matched to ``hit`` cached tokens was not
    admitted after all: its references go, it holds nothing."""
    if hit:
        free(rid, t, q)
        t[2][rid] = 0


@compiled
def release(victim, t, q):
    """Recompute preemption of ``victim`` (``kv.free`` and ``RequestTable.preempt``): its
    blocks freed, its KV to be recomputed; the caller queues it again."""
    free(victim, t, q)
    t[2][victim] = 0
    t[11][victim] += 1
    t[6][victim] = WAITING


@compiled
def preempt(victim, t, q, wnext):
    """``TokenBudgetScheduler._preempt`` by recompute, the victim back at the queue's front."""
    release(victim, t, q)
    wait_appendleft(q, wnext, victim)


@compiled
def fit_preempting_last(rid, n, run, nrun, t, q, wnext, bs):
    """Blocks for ``n`` more tokens of ``rid``, preempting the last of ``run[:nrun]`` until
    they fit or ``rid`` itself was the victim: (whether they fit, the running count left)."""
    while not allocate(rid, n, t, q, bs):
        victim = run[nrun - 1]
        nrun -= 1
        preempt(victim, t, q, wnext)
        if victim == rid:
            return False, nrun
    return True, nrun


@compiled
def allocate_decodes(run, nrun, t, q, bs):
    """``PagedKVCache.allocate_all`` of one token for each of ``run[:nrun]`` one token short
    of all it knows (a decode): all of their blocks, or none and False."""
    num_tokens, computed, held = t[1], t[2], t[5]
    blocks = 0
    for j in range(nrun):
        r = run[j]
        if num_tokens[r] - computed[r] == 1:
            blocks += max((computed[r] + bs) // bs - held[r], 0)
    if blocks > q[FREE]:
        return False
    for j in range(nrun):
        r = run[j]
        if num_tokens[r] - computed[r] == 1:
            held[r] = max(held[r], (computed[r] + bs) // bs)
    if blocks:
        PC.take(t, q, t[PC.INDEX][run[0]], blocks, FREE)
    return True


@compiled
def admit(rid, now, t, cached):
    """``TokenBudgetScheduler._admit``: running; on its first schedule, ``cached`` of its
    prompt tokens were served from the prefix cache."""
    t[6][rid] = RUNNING
    if math.isnan(t[7][rid]):
        t[7][rid] = now
        t[PC.CACHED][rid] = cached
