"""Pairing tensors by shape, name, block number and order: the judgement behind
:func:`tfckpt.interop.matching.match`, on names and shapes alone (no values, no files).

Two tensors can pair when their shapes hold the same elements in the same order, size-1
axes aside (a ``squeeze``, or a ``reshape``), or when they are the same matrix transposed
(a ``permute``, axes [1, 0]). A candidate pair is scored in [0, 1] by

- name: the words of both names (split at ``/ . : -``, ``_``, case changes and digits)
  with synonyms read alike (query → q, attention → attn, LayerNorm and ln → norm, wte →
  word embed ...), rare words weighing more, and the role of the last word (kernel, w,
  g, gamma, scale, embeddings → weight; b, beta → bias; moving_mean → mean ...);
- block: the numbers in names (``layer_3``, ``h3``, ``block_003``, ``layer.3``), each as its
  rank among the numbers found after the same text (of its segment, else of the segment
  before), so that 0- and 1-based numberings align;
- order: a tensor's place among those of its shape in the order stored, weighted by how
  well both sides' orders agree on the pairs that the rest decides alone (Kendall's
  tau), so that it counts only where the two were stored alike.

In each group of compatible shapes the assignment with the largest total score is taken
(the Hungarian method, :func:`assign`). A pair's confidence is its score times how
clearly it beats the nearest change (taking a free name instead, or swapping targets with
another pair): a margin of :data:`CLEAR` or more is clear; the pair's ``why`` names the
rival when it is not.

A square matrix may or may not be meant transposed; shapes cannot tell. It is transposed
as the non-square pairs of its kind are: of the same leaf words (kernel -> weight), else
of the same target leaf (``dense.weight``), else the other matrices inside blocks;
without any, it is kept as stored, at half the confidence.

What cannot be told. A shape is necessary, never sufficient: tensors of one shape (the
four [h, h] attention matrices of a layer) are told apart by names and block numbers
alone, and where names say nothing, by the order stored, which is right only when both
sides store alike; the confidence says which it was (``decided by order``, or ``close
to`` the rival when it was a guess). Numbers after random text are no block numbers.
One tensor is never split or joined (a fused qkv [h, 3h] does not pair with three
[h, h]), nor are other layouts found (convolution kernels HWIO → OIHW). No value is
read: two tensors whose names were swapped cannot be noticed.
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass

import numpy as np

from tfckpt.format import dtypes as _dt

# Words read alike; a segment (between / . : -) is looked up whole first.
_SYNONYMS = {
    "attention": "attn", "selfattention": "attn", "query": "q", "key": "k", "value": "v",
    "layernorm": "norm", "layer_norm": "norm", "ln": "norm", "rms_norm": "norm",
    "normalization": "norm", "embeddings": "embed", "embedding": "embed", "emb": "embed",
    "wte": "word embed", "wpe": "position embed", "pos": "position", "enc": "encoder",
    "dec": "decoder", "layer": "block", "layers": "block", "blocks": "block", "h": "block",
    "l": "block", "intermediate": "ffn", "mlp": "ffn", "feedforward": "ffn",
    "densereludense": "ffn", "linear": "dense", "output": "out", "o": "out",
}  # fmt: skip
# The role of a name's last word (or whole last segment).
_LEAVES = {
    "weight": "weight", "weights": "weight", "kernel": "weight", "w": "weight", "g": "weight",
    "gamma": "weight", "scale": "weight", "embeddings": "weight", "embedding": "weight",
    "bias": "bias", "biases": "bias", "b": "bias", "beta": "bias", "moving_mean": "mean",
    "running_mean": "mean", "moving_variance": "var", "running_var": "var",
}  # fmt: skip
_ROLES: dict[str | None, int] = {r: k for k, r in enumerate(sorted(set(_LEAVES.values())))}
NAME, BLOCK, ORDER = 0.55, 0.30, 0.15  # the weights of a pair's score
CLEAR = 0.1  # a margin over the nearest change that makes a pair clear
_TAU_PAIRS = 1000  # at most this many pairs measure how far the orders agree


@dataclass(frozen=True, slots=True)
class Tensor:
    """A tensor of either side: its name (a TF2 tensor's readable one), shape, dtype (None
    when unknown, as in a weight list) and place in the order stored."""

    name: str
    shape: tuple[int, ...]
    dtype: str | None
    order: int


@dataclass(frozen=True, slots=True)
class Pair:
    """A suggestion: ``source`` becomes ``target``, with ``permute`` (axes, or None) and
    then ``squeeze`` (size-1 axes dropped) or ``reshape`` (the target's shape); ``why``
    says what decided it and, when it was close, against what."""

    source: Tensor
    target: Tensor
    confidence: float
    permute: tuple[int, ...] | None
    squeeze: bool
    reshape: tuple[int, ...] | None
    why: str

    @property
    def transform(self) -> str:
        """``transpose``, ``squeeze``, ``reshape``, joined by ``+``; ``-`` for none."""
        done = [("transpose", self.permute), ("squeeze", self.squeeze), ("reshape", self.reshape)]
        return "+".join(w for w, on in done if on) or "-"


def pair(sources: list[Tensor], targets: list[Tensor]) -> tuple[list[Pair], float]:
    """The pairs of the best assignment in each group of compatible shapes (see the
    module's text): first without order, to learn from the pairs the rest decides
    whether both sides store alike, then with order as far as they do. The pairs, and
    that trust in the order (0 to 1).

    >>> pairs, _ = pair([Tensor("dense/kernel", (3, 4), "float32", 0)],
    ...                 [Tensor("fc.weight", (4, 3), None, 0)])
    >>> pairs[0].permute, pairs[0].why
    ((1, 0), 'shape [3,4]->[4,3] transposed; name 0.35; no other candidate')
    """
    scorer = _Scorer(sources, targets)
    groups: dict[tuple, tuple[list[Tensor], list[Tensor]]] = defaultdict(lambda: ([], []))
    for side, tensors in ((0, sources), (1, targets)):
        for t in tensors:
            groups[_shape_key(t.shape)][side].append(t)
    todo = [g for g in groups.values() if g[0] and g[1]]
    first = [c for ss, ts in todo for c in _assigned(ss, ts, scorer, 0.0)]
    trust = _agreement([(c[0].order, c[1].order) for c in first if c[3] >= CLEAR])
    if trust:
        first = [c for ss, ts in todo for c in _assigned(ss, ts, scorer, trust)]
    return _oriented(first, scorer, trust), trust


def _assigned(ss: list[Tensor], ts: list[Tensor], scorer: _Scorer, trust: float) -> list[tuple]:
    """(source, target, score, margin, rival, margin without order) of the best
    assignment of a group (see :func:`_margins`)."""
    base = scorer.matrix(ss, ts)
    same, near = _order([s.order for s in ss], [t.order for t in ts])
    w = ORDER * trust
    # Order breaks exact ties even untrusted, too little to weigh in a margin.
    score = np.where(base < 0, -1.0, (1 - w) * base + w * same + 1e-6 * near)
    rows, cols = assign(score)
    margin, rival = _margins(score, rows, cols, ss, ts)
    alone = _margins(base, rows, cols, ss, ts)[0] if w else margin
    return [
        (ss[i], ts[j], float(score[i, j]), float(margin[k]), rival[k], float(alone[k]))
        for k, (i, j) in enumerate(zip(rows, cols))
        if base[i, j] >= 0  # else the dtypes' kinds differ
    ]


def _margins(score: np.ndarray, rows: np.ndarray, cols: np.ndarray, ss, ts):
    """Per pair of an assignment, what the total loses by the nearest change (taking a
    free target or source instead, or swapping targets with another pair; inf when
    there is none), and the name that change brings."""
    d = score[rows, cols]
    margin = np.full(len(rows), np.inf)
    rival: list[str | None] = [None] * len(rows)

    def lower(k: int, loss: float, name: str) -> None:
        if loss < margin[k]:
            margin[k], rival[k] = loss, name

    free_t = np.setdiff1d(np.arange(len(ts)), cols)
    free_s = np.setdiff1d(np.arange(len(ss)), rows)
    for k, (i, j) in enumerate(zip(rows, cols)):
        if len(free_t):
            best = free_t[np.argmax(score[i, free_t])]
            lower(k, d[k] - score[i, best], ts[best].name)
        if len(free_s):
            best = free_s[np.argmax(score[free_s, j])]
            lower(k, d[k] - score[best, j], f"source {ss[best].name}")
    if len(rows) > 1:
        sub = score[np.ix_(rows, cols)]
        loss = d[:, None] + d[None, :] - sub - sub.T
        np.fill_diagonal(loss, np.inf)
        for k, b in enumerate(loss.argmin(axis=1)):
            lower(k, float(loss[k, b]), ts[cols[b]].name)
    return margin, rival


def _agreement(places: list[tuple[int, int]]) -> float:
    """How far the source's and the target's orders agree on pairs of ``places``:
    Kendall's tau, shrunk towards 0 for few pairs, and 0 when negative."""
    if len(places) < 2:
        return 0.0
    a = np.array(sorted(places), dtype=np.float64)
    a = a[np.linspace(0, len(a) - 1, min(len(a), _TAU_PAIRS)).astype(int)]
    sign = np.sign(a[:, 0, None] - a[None, :, 0]) * np.sign(a[:, 1, None] - a[None, :, 1])
    agree, disagree = (sign > 0).sum() / 2, (sign < 0).sum() / 2
    return max(0.0, float(agree - disagree) / float(agree + disagree + 10))


def _oriented(chosen: list[tuple], scorer: _Scorer, trust: float) -> list[Pair]:
    """The pairs with their transforms and confidences: a square matrix transposed as
    the non-square pairs of its kind are (:func:`_kinds`)."""
    votes: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for s, t, *_ in chosen:
        sq_s, sq_t = _squeezed(s.shape), _squeezed(t.shape)
        if len(sq_s) == 2 and sq_s[0] != sq_s[1]:
            for kind in _kinds(s, t, scorer):
                votes[kind][sq_s != sq_t] += 1
    out = []
    for s, t, score, margin, rival, alone in chosen:
        sq_s, sq_t = _squeezed(s.shape), _squeezed(t.shape)
        transposed, factor = sq_s != sq_t, 1.0
        how = " transposed" if transposed else ""
        if len(sq_s) == 2 and sq_s[0] == sq_s[1]:
            told = next((k for k in _kinds(s, t, scorer) if k in votes), None)
            if told is None:
                factor, how = 0.5, " square, kept as stored: no non-square pair of its kind"
            else:
                straight, turned = votes[told]
                transposed, factor = turned > straight, max(straight, turned) / (straight + turned)
                verb = "transposed" if transposed else "kept as stored"
                how = f" square, {verb} as {max(straight, turned)} of {straight + turned} {told}"
        perm, squeeze, reshape = _transform(s.shape, t.shape, transposed)
        why = [f"shape {_shape(s.shape)}" + ("" if s.shape == t.shape else f"->{_shape(t.shape)}")]
        why[0] += how
        why.append(f"name {scorer.name(s, t):.2f}")
        if scorer.coords(s, 0) or scorer.coords(t, 1):
            why.append(f"block {scorer.block(scorer.coords(s, 0), scorer.coords(t, 1)):.2f}")
        clear = min(1.0, margin / CLEAR)
        if rival is None:
            why.append("no other candidate")
        elif alone < CLEAR <= margin:
            why.append(f"decided by order (both store alike to {trust:.2f})")
        elif clear < 1:
            why.append(f"close to {rival} (by {margin:.3f})")
        confidence = max(0.0, min(1.0, score * clear * factor))
        out.append(Pair(s, t, confidence, perm, squeeze, reshape, "; ".join(why)))
    return out


def _kinds(s: Tensor, t: Tensor, scorer: _Scorer) -> list[str]:
    """What a matrix pair is like, most telling first: its leaf words, the target's last
    two words, whether the target is in a block."""
    ls, lt = _segments(s.name), _segments(t.name)
    inside = "matrices in blocks" if scorer.coords(t, 1) else "matrices outside blocks"
    return [f"{ls[-1]} -> {lt[-1]} pairs", f"-> *.{'.'.join(lt[-2:])} pairs", inside]


def _transform(src: tuple[int, ...], dst: tuple[int, ...], transposed: bool):
    """(permutation or None, squeeze, reshape or None) that make ``src`` into ``dst``."""
    perm, shape = None, src
    if transposed:
        a, b = [k for k, d in enumerate(src) if d != 1]
        p = list(range(len(src)))
        p[a], p[b] = b, a
        perm, shape = tuple(p), tuple(src[k] for k in p)
    if shape == dst:
        return perm, False, None
    if 1 not in dst:
        return perm, True, None
    return perm, False, dst


class _Scorer:
    """Scores of candidate pairs, from what is worked out once per name: its words
    (weighted by how rare they are), leaf role and block numbers (per side)."""

    def __init__(self, sources: list[Tensor], targets: list[Tensor]):
        self._words = {t.name: _words(t.name) for t in [*sources, *targets]}
        df: dict[str, int] = defaultdict(int)
        for path, _ in self._words.values():
            for w in path:
                df[w] += 1
        self._vocab = {w: k for k, w in enumerate(df)}
        self._weight = np.array([np.log1p(len(self._words) / df[w]) for w in df])
        self._coords = (_coords([s.name for s in sources]), _coords([t.name for t in targets]))
        self._blocks: dict[tuple, float] = {}

    def coords(self, t: Tensor, side: int) -> tuple:
        return self._coords[side].get(t.name, ())

    def _vectors(self, tensors: list[Tensor]) -> np.ndarray:
        m = np.zeros((len(tensors), len(self._vocab)))
        for k, t in enumerate(tensors):
            m[k, [self._vocab[w] for w in self._words[t.name][0]]] = 1
        return m * self._weight

    def names(self, ss: list[Tensor], ts: list[Tensor]) -> np.ndarray:
        """Name scores: 0.35 for the leaves' roles (half when one is unknown), 0.65 for
        the weighted share of words in common (Dice)."""
        a, b = self._vectors(ss), self._vectors(ts)
        common = (a > 0).astype(np.float64) @ b.T
        total = a.sum(axis=1)[:, None] + b.sum(axis=1)[None, :]
        dice = np.divide(2 * common, total, out=np.zeros_like(common), where=total > 0)
        la = np.array([_ROLES.get(self._words[s.name][1], -1) for s in ss])
        lb = np.array([_ROLES.get(self._words[t.name][1], -1) for t in ts])
        unknown = (la[:, None] < 0) | (lb[None, :] < 0)
        leaf = np.where(unknown, 0.5, (la[:, None] == lb[None, :]).astype(np.float64))
        return 0.35 * leaf + 0.65 * dice

    def name(self, s: Tensor, t: Tensor) -> float:
        return float(self.names([s], [t])[0, 0])

    def block(self, a: tuple, b: tuple) -> float:
        """1 where the block numbers agree by rank (and where neither side has any)."""
        if (a, b) not in self._blocks:
            if not a or not b:
                value = float(not a and not b)
            else:
                hits = 0.0
                for (ra, na), (rb, nb) in zip(a, b):
                    far = abs(ra / (na - 1) - rb / (nb - 1)) * max(na, nb)
                    hits += float(ra == rb) if na == nb else max(0.0, 1 - far)
                value = hits / max(len(a), len(b))
            self._blocks[(a, b)] = value
        return self._blocks[(a, b)]

    def matrix(self, ss: list[Tensor], ts: list[Tensor]) -> np.ndarray:
        """Each pair's score by names and blocks, in [0, 1]; -1 where the dtypes' kinds
        differ."""
        # Few distinct block numbers: scored once per pair of them.
        ca, ia = _distinct([self.coords(s, 0) for s in ss])
        cb, ib = _distinct([self.coords(t, 1) for t in ts])
        blocks = np.array([[self.block(a, b) for b in cb] for a in ca])[np.ix_(ia, ib)]
        base = (NAME * self.names(ss, ts) + BLOCK * blocks) / (NAME + BLOCK)
        ka = np.array([_kind(s.dtype) or "" for s in ss])
        kb = np.array([_kind(t.dtype) or "" for t in ts])
        differ = (ka[:, None] != kb[None, :]) & (ka[:, None] != "") & (kb[None, :] != "")
        return np.where(differ, -1.0, base)


def assign(score: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Rows and columns paired so that the total score is the largest, every row paired
    when there are no more rows than columns (else every column): the Hungarian method
    with potentials, O(n² m), its inner loop over the columns in numpy.

    >>> assign(np.array([[1.0, 3.0], [2.0, 1.0]]))
    (array([0, 1]), array([1, 0]))
    """
    flip = score.shape[0] > score.shape[1]
    n, m = (score.T if flip else score).shape
    cost = np.zeros((n, m + 1))  # column 0 stands for the row being placed
    cost[:, 1:] = -(score.T if flip else score)
    u, v = np.zeros(n + 1), np.zeros(m + 1)
    owner = np.zeros(m + 1, dtype=np.int64)  # the row (from 1) each column serves, 0: none
    way = np.zeros(m + 1, dtype=np.int64)
    for i in range(1, n + 1):
        owner[0], j0 = i, 0
        low = np.full(m + 1, np.inf)
        used = np.zeros(m + 1, dtype=bool)
        while True:
            used[j0] = True
            row = owner[j0]
            reduced = cost[row - 1] - u[row] - v
            better = ~used & (reduced < low)
            better[0] = False
            low[better] = reduced[better]
            way[better] = j0
            free = np.where(used, np.inf, low)
            free[0] = np.inf
            j1 = int(np.argmin(free))
            delta = free[j1]
            u[owner[used]] += delta
            v[used] -= delta
            low[~used] -= delta
            j0 = j1
            if owner[j0] == 0:
                break
        while j0:
            owner[j0] = owner[way[j0]]
            j0 = way[j0]
    cols = np.nonzero(owner[1:])[0]
    rows = owner[1:][cols] - 1
    if flip:
        rows, cols = cols, rows
    by_row = np.argsort(rows)
    return rows[by_row], cols[by_row]


def _segments(name: str) -> list[str]:
    return [s for s in re.split(r"[/.:\-]+", name.lower()) if s] or [""]


def _words(name: str) -> tuple[frozenset[str], str | None]:
    """A name's words with synonyms read alike, digits left out; its leaf's role."""
    words: list[str] = []
    segments = [s for s in re.split(r"[/.:\-]+", name) if s]
    leaf = None
    for k, segment in enumerate(segments):
        lower, last = segment.lower().strip("_"), k == len(segments) - 1
        if last and lower in _LEAVES:
            leaf = _LEAVES[lower]
            continue
        if lower in _SYNONYMS:
            words += _SYNONYMS[lower].split()
            continue
        parts = [p.lower() for p in re.findall(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+", segment)]
        if last and parts and parts[-1] in _LEAVES:
            leaf = _LEAVES[parts.pop()]
        for p in parts:
            words += _SYNONYMS.get(p, p).split()
    return frozenset(words), leaf


def _coords(names: list[str]) -> dict[str, tuple[tuple[int, int], ...]]:
    """Each name's block numbers: a number, where names hold several after the same
    text (its segment's, else the segment before: ``layer_3``, ``h3``, ``layer.3``), as
    (its rank there, how many)."""
    found: dict[str, list[tuple[str, int]]] = {}
    seen: dict[str, set[int]] = defaultdict(set)
    for name in names:
        marks = []
        segments = re.split(r"[/.:\-]+", name)
        for k, segment in enumerate(segments):
            before, last = "", 0
            for m in re.finditer(r"\d+", segment):
                before += segment[last : m.start()]
                stem = before or (segments[k - 1] if k else "") + "/"
                seen[stem].add(int(m.group()))
                marks.append((stem, int(m.group())))
                before, last = before + "#", m.end()
        found[name] = marks
    ranks = {stem: sorted(values) for stem, values in seen.items() if len(values) > 1}
    return {
        name: tuple((ranks[s].index(v), len(ranks[s])) for s, v in marks if s in ranks)
        for name, marks in found.items()
    }


def _distinct(keys: list[tuple]) -> tuple[list[tuple], np.ndarray]:
    """The distinct ``keys`` in first-seen order, and where each of ``keys`` is among them."""
    index: dict[tuple, int] = {}
    where = [index.setdefault(k, len(index)) for k in keys]
    return list(index), np.array(where, dtype=np.int64)


def _order(a: list[int], b: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """How alike the places of two groups' tensors are in the order stored: 1 for the
    same rank, less by one rank apart (0 from there on); and, for breaking ties, 1
    less the distance of their places from 0 to 1."""
    pa, pb = (np.argsort(np.argsort(x)) / max(len(x) - 1, 1) for x in (a, b))
    far = np.abs(pa[:, None] - pb[None, :])
    ranks = far * (max(len(a), len(b), 2) - 1)  # apart, in ranks of the larger group
    return np.clip(1 - ranks, 0, 1), 1 - far


def _squeezed(shape: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(d for d in shape if d != 1)


def _shape_key(shape: tuple[int, ...]) -> tuple[int, ...]:
    """Shapes of one key can pair: equal without size-1 axes, or a matrix transposed."""
    sq = _squeezed(shape)
    return min(sq, sq[::-1]) if len(sq) == 2 else sq


def _kind(dtype: str | None) -> str | None:
    if dtype is None:
        return None
    kind = _dt.lookup(dtype).kind
    return "int" if kind == "uint" else kind


def _shape(shape) -> str:
    return "[" + ",".join(map(str, shape)) + "]"
