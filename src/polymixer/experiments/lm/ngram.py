"""The count-based baseline beside every LM table: an interpolated n-gram model of orders 0 to 5 (0 to 5 tokens of
context) fitted on a corpus's train split, its smoothing chosen on validation, scored on validation and test.

Smoothing: interpolated absolute discounting (Ney, Essen & Kneser 1994). With ``c(h, w)`` the train count of token
``w`` after context ``h`` (the ``k`` tokens before it), ``c(h)`` their sum and ``n(h)`` the number of distinct
tokens seen after ``h``::

    P_k(w | h) = (max(c(h, w) - D_k, 0) + D_k n(h) P_{k-1}(w | h')) / c(h)      (h seen in train)
    P_k(w | h) = P_{k-1}(w | h')                                                 (h never seen)

``h'`` is ``h`` without its oldest token, and below order 0 is the uniform distribution over the vocabulary. For
``0 < D_k <= 1`` every distribution sums to 1 and gives every token a positive probability. Each ``D_k`` is chosen on
the validation split (the lowest validation loss over a grid, order by order); ``D_k = 0`` is the maximum-likelihood
estimate (order 0: the unigram distribution). Counting is sort-based (numpy ``unique`` over int64 keys): a context of
``k`` tokens is numbered by its context of ``k - 1`` tokens and the token before it, so no key grows with the order.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence

import numpy as np

__all__ = ["NGram", "DISCOUNTS", "SMOOTHING", "fit_ngram", "choose_discounts", "ngram_rows"]

# the grid each order's discount is chosen from (finer near 0, where a unigram of a large sample sits)
DISCOUNTS = (0.01, 0.02) + tuple(float(d) for d in np.round(np.arange(0.05, 1.0001, 0.05), 2))
LN2 = math.log(2.0)
SMOOTHING = "interpolated absolute discounting (Ney, Essen & Kneser 1994), one discount per order chosen on validation"


@dataclass
class NGram:
    """Train counts of every order up to ``order`` over a vocabulary of ``vocab`` tokens (see the module)."""

    vocab: int
    order: int
    contexts: List[np.ndarray] = field(default_factory=list)  # [k]: sorted keys (context k-1 id, token before)
    pairs: List[np.ndarray] = field(default_factory=list)  # [k]: sorted keys context id × vocab + next token
    pair_counts: List[np.ndarray] = field(default_factory=list)  # [k]: c(h, w) of each key of pairs[k]
    context_counts: List[np.ndarray] = field(default_factory=list)  # [k]: c(h) by context id
    followers: List[np.ndarray] = field(default_factory=list)  # [k]: n(h) by context id

    def context_ids(self, tokens: np.ndarray) -> List[np.ndarray]:
        """For each order ``k``, the id of the ``k`` tokens before every position of ``tokens`` among the train
        contexts, -1 where that context never occurs in train (positions before the start see a padding token)."""
        tokens = np.asarray(tokens, dtype=np.int64)
        ids = [np.zeros(len(tokens), dtype=np.int64)]
        for k in range(1, self.order + 1):
            prev = ids[-1]
            key = np.maximum(prev, 0) * (self.vocab + 1) + _before(tokens, k, self.vocab)
            ids.append(_find(self.contexts[k], key, prev >= 0))
        return ids

    def probabilities(self, ids: List[np.ndarray], targets: np.ndarray, discounts: Sequence[float]) -> np.ndarray:
        """``P_k(target | context)`` at every order ``k <= len(discounts) - 1``: an array (orders, positions)."""
        targets = np.asarray(targets, dtype=np.int64)
        p = np.full(len(targets), 1.0 / self.vocab)
        out = []
        for k, d in enumerate(discounts):
            p = self.step(k, ids[k], targets, p, d)
            out.append(p)
        return np.stack(out)

    def step(self, k: int, ctx: np.ndarray, targets: np.ndarray, lower: np.ndarray, d: float) -> np.ndarray:
        """Order ``k``'s probabilities from order ``k - 1``'s (``lower``) with discount ``d``."""
        seen = ctx >= 0
        c = np.maximum(ctx, 0)
        pair = _find(self.pairs[k], c * self.vocab + targets, seen)
        c_hw = np.where(pair >= 0, self.pair_counts[k][np.maximum(pair, 0)], 0)
        c_h, n_h = self.context_counts[k][c], self.followers[k][c]
        mixed = (np.maximum(c_hw - d, 0.0) + d * n_h * lower) / np.maximum(c_h, 1)
        return np.where(seen, mixed, lower)

    def distribution(self, context: Sequence[int], discounts: Sequence[float]) -> np.ndarray:
        """``P(w | context)`` for every token ``w`` at the highest order of ``discounts`` (a vector that sums to 1)."""
        stream = np.asarray(list(context) + [0], dtype=np.int64)
        ids = [i[-1:].repeat(self.vocab) for i in self.context_ids(stream)]
        return self.probabilities(ids, np.arange(self.vocab), discounts)[-1]


def _before(tokens: np.ndarray, k: int, pad: int) -> np.ndarray:
    """The token ``k`` places before each position of ``tokens``, ``pad`` (the padding token) before the start."""
    before = np.full(len(tokens), pad, dtype=np.int64)
    if k < len(tokens):
        before[k:] = tokens[:-k]
    return before


def _find(sorted_keys: np.ndarray, keys: np.ndarray, valid: np.ndarray) -> np.ndarray:
    """The index of each key in ``sorted_keys``, -1 where it is absent or not ``valid``."""
    pos = np.searchsorted(sorted_keys, keys)
    inside = pos < len(sorted_keys)
    found = valid & inside
    found[inside] &= sorted_keys[pos[inside]] == keys[inside]
    return np.where(found, pos, -1)


def fit_ngram(tokens: np.ndarray, vocab: int, order: int = 5) -> NGram:
    """Counts of every order ``0..order`` over the train tokens (the ``k`` tokens before each position; before the
    start a padding token)."""
    tokens = np.asarray(tokens, dtype=np.int64)
    if len(tokens) == 0 or tokens.min() < 0 or tokens.max() >= vocab:
        raise ValueError(f"n-gram counts need tokens in [0, {vocab}); got {len(tokens)} tokens")
    if vocab * (len(tokens) + 1) >= 2**62:
        raise ValueError(f"{len(tokens):,} tokens of a vocabulary of {vocab:,} overflow the int64 keys")
    model = NGram(vocab, order)
    ids = np.zeros(len(tokens), dtype=np.int64)
    for k in range(order + 1):
        if k:
            keys, ids = np.unique(ids * (vocab + 1) + _before(tokens, k, vocab), return_inverse=True)
            ids = ids.reshape(-1)
        else:
            keys = np.zeros(1, dtype=np.int64)
        pairs, counts = np.unique(ids * vocab + tokens, return_counts=True)
        n = len(keys)
        model.contexts.append(keys)
        model.pairs.append(pairs)
        model.pair_counts.append(counts)
        model.context_counts.append(np.bincount(ids, minlength=n))
        model.followers.append(np.bincount(pairs // vocab, minlength=n))
    return model


def choose_discounts(model: NGram, tokens: np.ndarray, grid: Sequence[float] = DISCOUNTS,
                     ids: Optional[List[np.ndarray]] = None) -> List[float]:
    """Each order's discount, order by order: the one of ``grid`` with the lowest loss on ``tokens`` (validation)
    given the lower orders' choices (``ids``: the tokens' :meth:`NGram.context_ids`, where already computed)."""
    tokens = np.asarray(tokens, dtype=np.int64)
    ids = model.context_ids(tokens) if ids is None else ids
    lower = np.full(len(tokens), 1.0 / model.vocab)
    chosen: List[float] = []
    for k in range(model.order + 1):
        losses = [-np.log(model.step(k, ids[k], tokens, lower, d)).mean() for d in grid]
        chosen.append(float(grid[int(np.argmin(losses))]))
        lower = model.step(k, ids[k], tokens, lower, chosen[-1])
    return chosen


def _scores(model: NGram, tokens: np.ndarray, ids: List[np.ndarray], token_bytes: np.ndarray,
            discounts: Sequence[float], split: str) -> List[Dict[str, float]]:
    """Loss (nats per token) and bits per byte of every order on ``tokens``, under keys ``<split>_loss`` /
    ``<split>_bpb`` (bytes: ``token_bytes`` of the targets, end-of-text counting none, as the LMs' evaluation)."""
    p = model.probabilities(ids, tokens, discounts)
    nats = -np.log(p).sum(axis=1)
    nbytes = max(1, int(np.asarray(token_bytes)[np.asarray(tokens, dtype=np.int64)].sum()))
    return [{f"{split}_loss": float(n / len(tokens)), f"{split}_bpb": float(n / LN2 / nbytes)} for n in nats]


def ngram_rows(train: np.ndarray, val: np.ndarray, test: Optional[np.ndarray], vocab: int, token_bytes: np.ndarray,
               order: int = 5, grid: Sequence[float] = DISCOUNTS) -> List[Dict[str, float]]:
    """Fit on ``train``, choose the discounts on ``val``, and score every order on ``val`` and ``test`` (None: no
    test split): one row per order with its discount, loss (nats per token), bits per byte and nats per byte."""
    for split, tokens in (("validation", val), ("test", test)):
        if tokens is not None and len(tokens) == 0:
            raise ValueError(f"the {split} split holds no tokens: nothing to choose or score the n-gram model on")
    model = fit_ngram(train, vocab, order)
    ids = {"val": model.context_ids(val), "test": None if test is None else model.context_ids(test)}
    discounts = choose_discounts(model, val, grid, ids["val"])
    rows = [{"order": k, "discount": d, "contexts": int(len(model.context_counts[k]))}
            for k, d in enumerate(discounts)]
    for split, tokens in (("val", val), ("test", test)):
        if tokens is None:
            continue
        for row, s in zip(rows, _scores(model, tokens, ids[split], token_bytes, discounts, split)):
            row.update(s, **{f"{split}_nats_per_byte": s[f"{split}_bpb"] * LN2})
    return rows
