"""MQAR training through the shared loop: batches generated from (seed, step), accuracy on a fixed test set and on
a validation set drawn independently of it (rates and forms are chosen on the validation accuracy)."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any, Dict, Optional, Sequence, Tuple

import torch
from torch import Tensor, nn

from .data import IGNORE, check_mqar, mqar, mqar_mixture
from ...models import create_model, model_config
from ..train.loop import TrainConfig, model_device, train

__all__ = ["RecallTask", "recall_accuracy", "train_recall"]


@torch.no_grad()
def recall_accuracy(model: nn.Module, inputs: Tensor, labels: Tensor, batch: int = 250) -> Tuple[float, float]:
    """(accuracy, loss) over the query positions (labels ≠ −100): the argmax must be the key's value."""
    was = model.training
    model.eval()
    device = next(model.parameters()).device
    right = total = 0
    loss_sum = 0.0
    for i in range(0, inputs.shape[0], batch):
        x, y = inputs[i:i + batch].to(device), labels[i:i + batch].to(device)
        logits, loss = model(x, y)
        sel = y != IGNORE
        right += int((logits.argmax(-1)[sel] == y[sel]).sum())
        n = int(sel.sum())
        total += n
        loss_sum += float(loss) * n
    model.train(was)
    return right / max(total, 1), loss_sum / max(total, 1)


class RecallTask:
    """Next-token cross-entropy at the query positions of fresh MQAR batches (a pure function of the step); the
    evaluation is the accuracy on ``test_examples`` examples drawn from another seed (``accuracy``, reported) and on
    as many drawn from a third (``val_accuracy``, which picks rates and forms, so the reported figure picks nothing).
    With a ``mixture`` of (seq_len, pairs, weight) points, the training batches are drawn from it, right-padded to
    its longest example (Zoology's training set, :func:`~polymixer.experiments.recall.data.mqar_mixture`); the test and
    validation draws stay at (``seq_len``, ``num_kv_pairs``)."""

    unit = "seq"

    def __init__(self, seq_len: int, num_kv_pairs: int, vocab_size: int, batch_size: int, seed: int,
                 test_examples: int = 1000, mixture: Sequence[Tuple[int, int, float]] = ()) -> None:
        check_mqar(seq_len, num_kv_pairs, vocab_size)
        self.seq_len, self.num_kv_pairs, self.vocab_size = seq_len, num_kv_pairs, vocab_size
        self.batch_size, self.seed = batch_size, seed
        self.mixture = tuple(tuple(p) for p in mixture)
        self.train_len = max([seq_len] + [p[0] for p in self.mixture])  # the rows of a training batch
        self.test = mqar(test_examples, seq_len, num_kv_pairs, vocab_size, seed=(seed, 2**31 - 1))
        self.valid = mqar(test_examples, seq_len, num_kv_pairs, vocab_size, seed=(seed, 2**31 - 2))

    def batch(self, step: int, share: int, shares: int, device: torch.device) -> Tuple[Tensor, Tensor]:
        if self.mixture:
            x, y = mqar_mixture(self.batch_size, self.train_len, self.mixture, self.vocab_size, seed=(self.seed, step))
        else:
            x, y = mqar(self.batch_size, self.seq_len, self.num_kv_pairs, self.vocab_size, seed=(self.seed, step))
        n = self.batch_size // shares
        return x[share * n:(share + 1) * n].to(device), y[share * n:(share + 1) * n].to(device)

    def count(self, batch: Tuple[Tensor, Tensor]) -> int:
        return batch[0].shape[0]

    def loss(self, model: nn.Module, batch: Tuple[Tensor, Tensor]) -> Tensor:
        return model(*batch, labelled_only=True)[1]  # the head at the query positions only: the same loss

    def evaluate(self, model: nn.Module, step: int, out_dir: Path) -> Dict[str, float]:
        acc, loss = recall_accuracy(model, *self.test)
        val_acc, val_loss = recall_accuracy(model, *self.valid)
        return {"accuracy": acc, "loss": loss, "val_accuracy": val_acc, "val_loss": val_loss}


def train_recall(preset: str, train_cfg: TrainConfig, num_kv_pairs: int = 16, test_examples: int = 1000,
                 mixture: Sequence[Tuple[int, int, float]] = (), seq_len: Optional[int] = None,
                 **overrides: Any) -> Dict[str, Any]:
    """Train an ``mqar-*`` preset (overrides: fields of RecallConfig, e.g. mixer, value_dim) on MQAR at
    ``seq_len`` (default: the preset's) — or on a ``mixture`` of points (Zoology's training set), the model's
    positions then spanning its longest example, the test still at (``seq_len``, ``num_kv_pairs``)."""
    torch.manual_seed(train_cfg.seed)
    config = model_config(preset, **overrides)
    seq_len = config.seq_len if seq_len is None else seq_len
    task = RecallTask(seq_len, num_kv_pairs, config.vocab_size, train_cfg.batch_size, train_cfg.seed, test_examples,
                      mixture)
    model = create_model(preset, device=model_device(train_cfg), **overrides, seq_len=task.train_len)
    c = model.config
    meta = {"family": "recall", "preset": preset, "model": asdict(c),
            "task": {"num_kv_pairs": num_kv_pairs, "seq_len": seq_len, "vocab_size": c.vocab_size,
                     "test_examples": test_examples, **({"mixture": [list(p) for p in mixture]} if mixture else {})},
            "state_floats": model.state_floats(seq_len)}
    return {**train(model, task, train_cfg, meta), "model": model}
