"""Pricing of one step in compiled code: ``RooflineCostModel.step_cost`` over arrays.

The token- and sequence-count rows come from ``sim.compiled.pricing.Prices`` (priced by the
Python cost model); the attention kernels are priced here from the packed calibrated tables,
with the arithmetic of ``sim.cost.pricing.attention_point_time`` and ``sim.cost.eta``.
"""

from __future__ import annotations

import math

from sim.compiled import pricing as P
from sim.compiled.jit import compiled


@compiled
def _cell(x, knots, off, n):
    """(left knot, right knot, weight of the right one) of ``x`` among ``n`` log2 knots at
    ``knots[off:]``, clamped (``sim.cost.eta.scalar_cell``)."""
    last = n - 1
    lx = math.log2(x) if x > 0 else knots[off]
    if lx <= knots[off] or last == 0:
        return 0, min(1, last), 0.0
    if lx >= knots[off + last]:
        return last - 1, last, 1.0
    i = 0
    while knots[off + i + 1] <= lx:  # bisect_right − 1
        i += 1
    return i, i + 1, (lx - knots[off + i]) / (knots[off + i + 1] - knots[off + i])


@compiled
def _eta(e, x, etas):
    """Efficiency ``e`` of the packed ``etas`` at the shape variables ``x`` (``AXES``)."""
    scale, first, last, axes, koff, klen, foff, fcols, knots, f = etas
    if first[e] == last[e]:
        return scale[e]
    log = 0.0
    for t in range(first[e], last[e]):
        i, i1, u = _cell(x[axes[t, 0]], knots, koff[t, 0], klen[t, 0])
        b = foff[t]
        if axes[t, 1] < 0:
            val = f[b + i] * (1 - u) + f[b + i1] * u
        else:
            j, j1, v = _cell(x[axes[t, 1]], knots, koff[t, 1], klen[t, 1])
            c = fcols[t]
            val = ((1 - u) * ((1 - v) * f[b + i * c + j] + v * f[b + i * c + j1])
                   + u * ((1 - v) * f[b + i1 * c + j] + v * f[b + i1 * c + j1]))
        log = log + val
    return scale[e] * math.exp(log)


@compiled
def _attention(prefill, flops, nbytes, q, S, prm, etas, x):
    """(time, compute-bound?) of one attention kernel (``attention_point_time``)."""
    s = max(float(S), 1.0)
    kvh = max(prm[P.KV_HEADS], 1.0)
    hd = prm[P.HEAD_DIM]
    kv = max(nbytes / s, 1.0)
    x[0] = max(q, 1.0)
    x[1] = s
    x[2] = s * kvh
    x[3] = hd
    x[4] = kv
    x[5] = max(kv / (kvh * hd), 1.0)
    x[6] = max(flops / max(nbytes, 1.0), 1e-3)
    x[7] = 1.0
    e = 0 if prefill else 2
    t_compute = flops / (prm[P.PEAK_FLOPS] * _eta(e, x, etas))
    t_memory = nbytes / (prm[P.PEAK_BW] * _eta(e + 1, x, etas))
    k = P.PRE_LAUNCH if prefill else P.DEC_LAUNCH
    t = max(t_compute, t_memory) + prm[k]
    if prm[k + 1]:
        units = x[2] * math.ceil(x[0] / prm[k + 2])
        t = t + prm[k + 1] * units / prm[P.NUM_SMS]
    return t, t_compute >= t_memory


@compiled
def price_step(nb, bnew, bctx, tok, head_tok, head_seq, prm, etas, x, out):
    """(time, compute, memory, comm, host) of the batch into ``out`` (``step_cost``)."""
    heads, kvh, hd = prm[P.HEADS], prm[P.KV_HEADS], prm[P.HEAD_DIM]
    kvb, act = prm[P.KV_BYTES], prm[P.ACT]
    T = 0
    pf = pb = pq = 0.0
    npre = 0
    nnew = 0  # prompts starting in the step (``sim.cost.host.new_requests``)
    ctx_total = 0
    ndec = 0
    for j in range(nb):
        T += bnew[j]
        if bnew[j] == 1 and bctx[j] > 0:
            ctx_total += bctx[j]
            ndec += 1
        else:  # a prefill chunk (``prefill_attention_work``), summed as the model sums them
            qf, cf = float(bnew[j]), float(bctx[j])
            pf += 4.0 * heads * hd * (qf * (cf + (qf + 1) / 2.0))
            pb += (cf + qf) * 2.0 * kvh * hd * kvb + 2.0 * qf * heads * hd * act
            pq += qf
            npre += 1
            if bctx[j] == 0:
                nnew += 1
    att0 = att1 = att2 = 0.0
    if npre:
        t, cb = _attention(True, pf, pb, pq / npre, npre, prm, etas, x)
        if cb:
            att0 += t
        else:
            att1 += t
    if ndec:  # ``decode_attention_work``
        keys = float(ctx_total) + ndec * 0.0 + ndec
        f = 4.0 * heads * hd * keys
        b = keys * 2.0 * kvh * hd * kvb + 2.0 * ndec * heads * hd * act
        t, cb = _attention(False, f, b, 1.0, ndec, prm, etas, x)
        if cb:
            att0 += t
        else:
            att1 += t
    L = prm[P.LAYERS]
    h0, h1, h2 = head_tok[T, 0], head_tok[T, 1], head_tok[T, 2]
    for j in range(P.MAX_SEQ_OPS):
        h0 += head_seq[nb, j, 0]
        h1 += head_seq[nb, j, 1]
        h2 += head_seq[nb, j, 2]
    compute = h0 + (tok[T, 0] + L * att0)
    memory = h1 + (tok[T, 1] + L * att1)
    comm = h2 + (tok[T, 2] + L * att2) + 0.0
    host = (prm[P.HOST_S] + prm[P.HOST_PER_SEQ_S] * nb + prm[P.HOST_PER_NEW_S] * nnew
            + prm[P.HOST_PER_TOKEN_S] * T)
    gpu = compute + memory + comm
    kernels = 0.0  # no graph: the host launches each kernel (``launches``)
    if prm[P.LAUNCH_S] > 0.0:
        if npre == 0:
            kernels = prm[P.KERNELS_DECODE] * tok[T, P.DISPATCH_DECODE]
        else:
            kernels = prm[P.KERNELS_MIXED if ndec else P.KERNELS_PREFILL] * tok[
                T, P.DISPATCH_PREFILL]
    launch = kernels * prm[P.LAUNCH_S]
    if prm[P.OVERLAP]:  # scheduled and launched while the GPU runs: what outlasts it shows
        host = max(0.0, host + launch - gpu)
    else:
        host = host + max(0.0, launch - gpu)
    out[0] = gpu + host
    out[1], out[2], out[3], out[4] = compute, memory, comm, host
