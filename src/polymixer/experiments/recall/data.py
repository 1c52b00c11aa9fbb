"""Multi-query associative recall (MQAR), the recall probe of sub-quadratic mixers, as Zoology defines it.

Every example opens with ``num_kv_pairs`` key-value pairs, with keys drawn from [1, V/2) and values from [V/2, V),
distinct within the example. Each key then appears once more, as a query, at an even offset after the pairs. The
offsets follow Zoology's power law p(g) ∝ g^(a−1) with a = 0.01, so most queries sit close to the context. The label
at a query's position is its key's value, and every other label is −100 (ignored). The filler positions hold random
tokens (Zoology's ``random_non_queries``).

Arora, Eyuboglu et al., "Zoology: Measuring and improving recall in efficient language models", ICLR 2024.
Examples are generated on the fly from a seed, so a batch is a pure function of (seed, step).
"""

from __future__ import annotations

from typing import Sequence, Tuple, Union

import numpy as np
import torch

from ...models.recall import IGNORE

__all__ = ["IGNORE", "ZOOLOGY_MIXTURE", "mqar", "mqar_mixture", "check_mqar"]

PAD = 0  # the input token after a shorter example's end (its labels there are IGNORE)

# Zoology's MQAR training set: (seq_len, num_kv_pairs, examples) — 100,000 short easy examples and 20,000 of each
# harder one, shuffled together and right-padded to the longest; every test point is scored on the model trained on
# all of it
ZOOLOGY_MIXTURE: Tuple[Tuple[int, int, int], ...] = (
    (64, 4, 100_000), (128, 8, 20_000), (256, 16, 20_000), (256, 32, 20_000), (256, 64, 20_000))


def check_mqar(seq_len: int, num_kv_pairs: int, vocab_size: int) -> None:
    """The constraints of the construction, as ValueErrors naming the numbers."""
    for name, v in (("seq_len", seq_len), ("num_kv_pairs", num_kv_pairs), ("vocab_size", vocab_size)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be a positive int, got {v!r}")
    if seq_len % 2:
        raise ValueError(f"seq_len must be even, got {seq_len}")
    if 4 * num_kv_pairs > seq_len:
        raise ValueError(f"{num_kv_pairs} pairs need seq_len ≥ 4 × {num_kv_pairs} = {4 * num_kv_pairs}, got "
                         f"{seq_len}")
    if vocab_size // 2 - 1 < num_kv_pairs:
        raise ValueError(f"vocab_size {vocab_size} holds {vocab_size // 2 - 1} distinct keys, fewer than "
                         f"{num_kv_pairs} pairs")


def _distinct(rng: np.random.Generator, n: int, low: int, high: int, k: int) -> np.ndarray:
    """(n, k) draws without replacement from [low, high), one independent draw per row."""
    return np.argsort(rng.random((n, high - low)), axis=1)[:, :k] + low


def mqar(num_examples: int, seq_len: int, num_kv_pairs: int, vocab_size: int,
         seed: Union[int, np.random.Generator, Tuple[int, ...]] = 0, power_a: float = 0.01,
         random_non_queries: bool = True) -> Tuple[torch.Tensor, torch.Tensor]:
    """(inputs, labels), both (num_examples, seq_len) int64; labels are −100 except at the ``num_kv_pairs`` query
    positions of each row."""
    check_mqar(seq_len, num_kv_pairs, vocab_size)
    if not power_a > 0:
        raise ValueError(f"power_a must be positive, got {power_a}")
    rng = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)
    n, K, L, V = num_examples, num_kv_pairs, seq_len, vocab_size
    keys = _distinct(rng, n, 1, V // 2, K)
    values = _distinct(rng, n, V // 2, V, K)
    space = (L - 2 * K) // 2
    logp = np.log(power_a * np.arange(1, space + 1) ** (power_a - 1))
    # K distinct offsets drawn one after another with probabilities ∝ p (the Gumbel top-K trick)
    gaps = np.argsort(-(logp + rng.gumbel(size=(n, space))), axis=1)[:, :K]
    seq = np.zeros((n, L + 1), dtype=np.int64)
    seq[:, 0:2 * K:2], seq[:, 1:2 * K:2] = keys, values
    rows = np.arange(n)[:, None]
    seq[rows, 2 * K + 2 * gaps] = keys
    labels = np.full((n, L + 1), IGNORE, dtype=np.int64)
    labels[rows, 2 * K + 2 * gaps + 1] = values
    inputs, labels = seq[:, :-1], labels[:, 1:]
    if random_non_queries:
        filler = inputs == 0
        inputs[filler] = rng.integers(0, V, size=int(filler.sum()))
    return torch.from_numpy(np.ascontiguousarray(inputs)), torch.from_numpy(np.ascontiguousarray(labels))


def mqar_mixture(num_examples: int, seq_len: int, points: Sequence[Tuple[int, int, float]], vocab_size: int,
                 seed: Union[int, np.random.Generator, Tuple[int, ...]] = 0, power_a: float = 0.01,
                 random_non_queries: bool = True) -> Tuple[torch.Tensor, torch.Tensor]:
    """(inputs, labels), both (num_examples, seq_len): each row an MQAR example of one of ``points`` — (its
    seq_len, its pairs, its weight) — drawn with probability ∝ weight, right-padded to ``seq_len`` (inputs
    :data:`PAD`, labels −100), the rows shuffled: Zoology's training mixture (:data:`ZOOLOGY_MIXTURE`)."""
    if not points:
        raise ValueError("a mixture needs at least one (seq_len, num_kv_pairs, weight) point")
    for L, K, w in points:
        check_mqar(L, K, vocab_size)
        if L > seq_len:
            raise ValueError(f"a mixture point of {L} tokens does not fit the {seq_len} tokens of the rows")
        if not w > 0:
            raise ValueError(f"a mixture point's weight must be positive, got {w!r} for ({L}, {K})")
    rng = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)
    weights = np.array([float(w) for _, _, w in points])
    counts = rng.multinomial(num_examples, weights / weights.sum())
    inputs = torch.full((num_examples, seq_len), PAD, dtype=torch.int64)
    labels = torch.full((num_examples, seq_len), IGNORE, dtype=torch.int64)
    start = 0
    for (L, K, _), n in zip(points, counts.tolist()):
        if n:
            inputs[start:start + n, :L], labels[start:start + n, :L] = mqar(
                n, L, K, vocab_size, seed=rng, power_a=power_a, random_non_queries=random_non_queries)
            start += n
    order = torch.from_numpy(rng.permutation(num_examples))
    return inputs[order], labels[order]
