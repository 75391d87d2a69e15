"""Converters of the recurrent operators RNN, GRU and LSTM, unrolled over their sequence (shapes are static).

The input's projection for every step is one matmul (X @ W^T over the whole sequence); each step then adds the
previous state's projection (H @ R^T), applies the gates' activations and updates the state, as elementwise
operators that fusion groups. Projections are gate-major, (gates, batch, hidden): a gate is a leading part of its
step's projection, one run of memory that the graph reads as a view (a (batch, G hidden) projection's gates are
strided columns, each copied by a kernel every step).

A reverse direction reads each sequence's valid steps backwards: a gather along the time axis reverses them (and,
the same permutation, its outputs back). With sequence_lens, a batch entry past its length keeps its state and
outputs zeros, as onnxruntime gives.
"""
from __future__ import annotations

import numpy as np

from .. import ops
from ..tensor import constant
from .errors import OnnxImportError
from .node import Node, converts

GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}
DEFAULT_ACTIVATIONS = {"RNN": ("Tanh",), "GRU": ("Sigmoid", "Tanh"), "LSTM": ("Sigmoid", "Tanh", "Tanh")}
# activation -> (function of (x, alpha, beta), alpha's default, beta's default): None where the function takes
# none. activation_alpha / activation_beta are consumed in order by the functions that take them, defaults as
# onnxruntime's (rnn_helpers.cc)
ACTIVATIONS = {
    "relu": (lambda x, a, b: ops.relu(x), None, None),
    "tanh": (lambda x, a, b: ops.tanh(x), None, None),
    "sigmoid": (lambda x, a, b: ops.sigmoid(x), None, None),
    "affine": (lambda x, a, b: ops.add(ops.mul(x, a), b), 0.0, 0.0),
    "leakyrelu": (lambda x, a, b: ops.elementwise("leaky_relu", x, alpha=a), 0.01, None),
    "thresholdedrelu": (lambda x, a, b: ops.where(ops.greater(x, a), x, 0.0), 0.0, None),
    "scaledtanh": (lambda x, a, b: ops.mul(ops.tanh(ops.mul(x, b)), a), 0.0, 0.0),
    "hardsigmoid": (lambda x, a, b: ops.clip(ops.add(ops.mul(x, a), b), 0.0, 1.0), 0.2, 0.5),
    "elu": (lambda x, a, b: ops.elementwise("elu", x, alpha=a), 1.0, None),
    "softsign": (lambda x, a, b: ops.div(x, ops.add(ops.elementwise("abs", x), 1.0)), None, None),
    "softplus": (lambda x, a, b: ops.elementwise("softplus", x), None, None),
}


@converts("RNN", "GRU", "LSTM", attrs=("activation_alpha", "activation_beta", "activations", "clip", "direction",
                                       "hidden_size", "input_forget", "layout", "linear_before_reset"))
def recurrent(node: Node) -> list:
    """RNN, GRU and LSTM (every direction, activation, clip, sequence_lens, initial states, peepholes,
    input_forget, linear_before_reset, layout): Y, Y_h (and LSTM's Y_c), 16-bit inputs computed in f32."""
    kind, x = node.op_type, node.input(0)
    if not x.dtype.is_float:
        raise node.error(f"needs a float tensor, got {x.dtype.name}", OnnxImportError)
    wide = "float64" if x.dtype.name == "f64" else "float32"
    batch_first = node.attr("layout", 0) == 1
    x = ops.cast(ops.transpose(x, (1, 0, 2)) if batch_first else x, wide)      # (seq, batch, input)
    seq, batch, _ = x.shape
    directions = {"forward": (False,), "reverse": (True,), "bidirectional": (False, True)}.get(
        node.attr("direction", "forward"))
    if directions is None:
        raise node.error(f"direction must be forward, reverse or bidirectional, got {node.attr('direction')!r}",
                         OnnxImportError)
    hidden = node.attr("hidden_size")
    w = ops.cast(node.input(1), wide)
    if hidden is None:
        hidden = w.shape[1] // GATES[kind]
    lengths = _lengths(node, seq, batch)
    functions = _activations(node, kind, len(directions))
    states = [_initial(node, k, wide, batch_first) for k in ((5, 6) if kind == "LSTM" else (5,))]
    outputs, finals = [], []
    for d, backwards in enumerate(directions):
        weights = _direction_weights(node, kind, d, hidden, wide)
        start = [None if s is None else ops.reshape(ops.slice(s, [d], [d + 1]), (batch, hidden)) for s in states]
        steps = ops.gather_elements(x, _reversal(seq, batch, x.shape[2], lengths)) if backwards else x
        ys, final = _unrolled(kind, node, steps, weights, start, functions[d], lengths, hidden)
        y = ops.concat([ops.unsqueeze(t, 0) for t in ys], 0)       # (seq, batch, hidden)
        if backwards:
            y = ops.gather_elements(y, _reversal(seq, batch, hidden, lengths))
        outputs.append(y)
        finals.append(final)
    y = ops.concat([ops.unsqueeze(t, 1) for t in outputs], 1)          # (seq, directions, batch, hidden)
    y_states = [ops.concat([ops.unsqueeze(f[k], 0) for f in finals], 0) for k in range(len(finals[0]))]
    if batch_first:
        y = ops.transpose(y, (2, 0, 1, 3))
        y_states = [ops.transpose(s, (1, 0, 2)) for s in y_states]
    dtype = node.input(0).dtype
    return [ops.cast(t, dtype) for t in [y, *y_states]]


def _lengths(node: Node, seq: int, batch: int) -> np.ndarray:
    """sequence_lens (a constant; default every batch entry the whole sequence)."""
    given = node.const(4, required=False) if node.num_inputs > 4 else None
    if given is None:
        return np.full(batch, seq, np.int64)
    lengths = np.asarray(given).reshape(-1).astype(np.int64)
    if lengths.shape != (batch,) or (lengths < 0).any() or (lengths > seq).any():
        raise node.error(f"sequence_lens {lengths.tolist()} must hold {batch} lengths between 0 and {seq}",
                         OnnxImportError)
    return lengths


def _activations(node: Node, kind: str, directions: int) -> list:
    """Per direction, the (function, alpha, beta) of each of the operator's activation slots."""
    names = node.attr("activations", list(DEFAULT_ACTIVATIONS[kind]) * directions)
    per = len(DEFAULT_ACTIVATIONS[kind])
    if len(names) != per * directions:
        raise node.error(f"activations {names} need {per} names a direction ({directions})", OnnxImportError)
    alphas, betas = list(node.attr("activation_alpha", [])), list(node.attr("activation_beta", []))
    chosen = []
    for name in names:
        if name.lower() not in ACTIVATIONS:
            raise node.error(f"activation {name!r} is not one of {', '.join(ACTIVATIONS)} (any case)")
        fn, alpha, beta = ACTIVATIONS[name.lower()]
        alpha = (alphas.pop(0) if alphas else alpha) if alpha is not None else None
        beta = (betas.pop(0) if betas else beta) if beta is not None else None
        chosen.append((fn, alpha, beta))
    return [chosen[d * per:(d + 1) * per] for d in range(directions)]


def _initial(node: Node, k: int, wide: str, batch_first: bool):
    """Input k (initial_h, initial_c) as (directions, batch, hidden), or None where it is absent."""
    s = node.input(k, required=False) if node.num_inputs > k else None
    if s is None:
        return None
    return ops.cast(ops.transpose(s, (1, 0, 2)) if batch_first else s, wide)


def _direction_weights(node: Node, kind: str, d: int, hidden: int, wide: str) -> dict:
    """Direction d's W^T and R^T gate-major, (G, input, hidden) and (G, hidden, hidden), biases Wb, Rb (G, 1,
    hidden) and LSTM's peepholes (3 hidden)."""
    def row(k):                 # input k's direction d, or None
        t = node.input(k, required=False) if node.num_inputs > k else None
        return None if t is None else ops.cast(ops.reshape(ops.slice(t, [d], [d + 1]), t.shape[1:]), wide)
    g = GATES[kind] * hidden
    w, r, b = row(1), row(2), row(3)
    if w.shape[0] != g or r.shape != (g, hidden):
        raise node.error(f"W {node.input(1).shape} and R {node.input(2).shape} need {g} rows (hidden_size "
                         f"{hidden}, {GATES[kind]} gates)", OnnxImportError)
    gates = GATES[kind]

    def gate_major(t):          # (G hidden, n) -> (G, n, hidden): gate k's rows, transposed
        return ops.transpose(ops.reshape(t, (gates, hidden, t.shape[1])), (0, 2, 1))
    biases = (None, None) if b is None else tuple(
        ops.reshape(ops.slice(b, [k * g], [(k + 1) * g]), (gates, 1, hidden)) for k in (0, 1))
    peepholes = row(7) if kind == "LSTM" else None
    return {"w": gate_major(w), "r": gate_major(r), "wb": biases[0], "rb": biases[1], "p": peepholes}


def _reversal(seq: int, batch: int, width: int, lengths: np.ndarray):
    """The gather_elements indices (seq, batch, width) that reverse each batch entry's first lengths[b] steps."""
    t = np.arange(seq)[:, None]
    index = np.where(t < lengths[None, :], lengths[None, :] - 1 - t, t)
    return constant(np.broadcast_to(index[:, :, None], (seq, batch, width)).astype(np.int64))


def _unrolled(kind: str, node: Node, x, weights: dict, start: list, functions: list, lengths: np.ndarray,
              hidden: int) -> tuple:
    """The step outputs (each (batch, hidden)) and the final states of one direction over x (seq, batch, input)."""
    seq, batch, _ = x.shape
    gates_x = _input_projection(x, weights["w"])
    if weights["wb"] is not None:
        gates_x = ops.add(gates_x, weights["wb"])
    h = start[0] if start[0] is not None else constant(np.zeros((batch, hidden), np.float32), gates_x.dtype)
    c = None
    if kind == "LSTM":
        c = start[1] if start[1] is not None else constant(np.zeros((batch, hidden), np.float32), gates_x.dtype)
    clip = node.attr("clip")
    ys = []
    for t in range(seq):
        gx = ops.reshape(ops.slice(gates_x, [t], [t + 1]), gates_x.shape[1:])
        step = _STEPS[kind](node, gx, h, c, weights, functions, clip, hidden)
        alive = t < lengths         # (batch,): entries still inside their sequence
        if alive.all():
            h, c = step
            ys.append(h)
            continue
        mask = constant(alive[:, None])
        h = ops.where(mask, step[0], h)
        c = None if c is None else ops.where(mask, step[1], c)
        ys.append(ops.where(mask, step[0], 0.0))
    return ys, [h] if c is None else [h, c]


def _input_projection(x, w):
    """Every step's input projection, (seq, G, batch, hidden), of x (seq, batch, input) by gate-major W^T (G, input,
    hidden). At batch 1 one product of the steps' rows, (seq, input) @ (input, G hidden), is that layout already: its
    rows share W's panels, where a product per step and gate read them again (an LSTM's 32 steps of 64 inputs,
    hidden 128: 39 -> 14 us in a replay). Larger batches stay batched by gate: there the one product's (seq, batch,
    G, hidden) would need a transpose."""
    seq, batch, width = x.shape
    gates, _, hidden = w.shape
    if batch != 1:
        return ops.matmul(ops.unsqueeze(x, 1), w)
    flat = ops.reshape(ops.transpose(w, (1, 0, 2)), (width, gates * hidden))
    return ops.reshape(ops.matmul(ops.reshape(x, (seq, width)), flat), (seq, gates, 1, hidden))


def _gate(gates, k: int):
    """Gate k of a gate-major projection (G, batch, hidden), or of gate-major weights."""
    return ops.reshape(ops.slice(gates, [k], [k + 1]), gates.shape[1:])


def _recurrence(h, weights: dict, gates: int | None = None):
    """H @ R^T (+ Rb), gate-major, of R's first `gates` gates (default all)."""
    r, rb = weights["r"], weights["rb"]
    if gates is not None and gates < r.shape[0]:
        r, rb = ops.slice(r, [0], [gates]), None if rb is None else ops.slice(rb, [0], [gates])
    gates_h = ops.matmul(h, r)
    return gates_h if rb is None else ops.add(gates_h, rb)


def _activate(function: tuple, x, clip):
    """An activation slot's function of x, clipped first where the operator's clip says."""
    fn, alpha, beta = function
    if clip is not None:
        x = ops.clip(x, -float(clip), float(clip))
    return fn(x, alpha, beta)


def _rnn_step(node, gx, h, c, weights, functions, clip, hidden):
    """H = f(X W^T + H R^T + Wb + Rb)."""
    return _activate(functions[0], _gate(ops.add(gx, _recurrence(h, weights)), 0), clip), None


def _gru_step(node, gx, h, c, weights, functions, clip, hidden):
    """z, r = f(...); candidate g(X Wh^T + (r H) Rh^T + Rbh + Wbh), or with linear_before_reset
    g(X Wh^T + r (H Rh^T + Rbh) + Wbh); H = (1 - z) candidate + z H."""
    f, g = functions
    reset_after = node.attr("linear_before_reset", 0)
    gh = _recurrence(h, weights, None if reset_after else 2)      # (else h's gate is (r H) R^T, below)
    z = _activate(f, ops.add(_gate(gx, 0), _gate(gh, 0)), clip)
    r = _activate(f, ops.add(_gate(gx, 1), _gate(gh, 1)), clip)
    if reset_after:
        candidate = ops.add(_gate(gx, 2), ops.mul(r, _gate(gh, 2)))
    else:
        rh = ops.matmul(ops.mul(r, h), _gate(weights["r"], 2))
        if weights["rb"] is not None:
            rh = ops.add(rh, _gate(weights["rb"], 2))
        candidate = ops.add(_gate(gx, 2), rh)
    candidate = _activate(g, candidate, clip)
    return ops.add(ops.mul(ops.sub(1.0, z), candidate), ops.mul(z, h)), None


def _lstm_step(node, gx, h, c, weights, functions, clip, hidden):
    """i, f = f(... + P c), cell candidate g(...), C = f C + i candidate, o = f(... + P C), H = o h(C); gates in
    the order i, o, f, c; with input_forget, f = 1 - i."""
    f, g, hh = functions
    gates = ops.add(gx, _recurrence(h, weights))
    p = weights["p"]

    def peep(k, state):         # gate k's pre-activation, plus its peephole times the cell (P holds i, o, f)
        pre = _gate(gates, k)
        return pre if p is None else ops.add(pre, ops.mul(ops.slice(p, [k * hidden], [(k + 1) * hidden]), state))

    i = _activate(f, peep(0, c), clip)
    forget = ops.sub(1.0, i) if node.attr("input_forget", 0) else _activate(f, peep(2, c), clip)
    cell = ops.add(ops.mul(forget, c), ops.mul(i, _activate(g, _gate(gates, 3), clip)))
    o = _activate(f, peep(1, cell), clip)
    return ops.mul(o, _activate(hh, cell, None)), cell


_STEPS = {"RNN": _rnn_step, "GRU": _gru_step, "LSTM": _lstm_step}
