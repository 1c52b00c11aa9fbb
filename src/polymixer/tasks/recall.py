"""MQAR training through the shared loop: batches generated from (seed, step), accuracy on a fixed test set and on
a validation set drawn independently of it (rates and forms are chosen on the validation accuracy)."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any, Dict, Tuple

import torch
from torch import Tensor, nn

from ..data.recall import IGNORE, check_mqar, mqar
from ..models import create_model
from ..train.loop import TrainConfig, train

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
    as many drawn from a third (``val_accuracy``, which picks rates and forms, so the reported figure picks nothing)."""

    unit = "seq"

    def __init__(self, seq_len: int, num_kv_pairs: int, vocab_size: int, batch_size: int, seed: int,
                 test_examples: int = 1000) -> None:
        check_mqar(seq_len, num_kv_pairs, vocab_size)
        self.seq_len, self.num_kv_pairs, self.vocab_size = seq_len, num_kv_pairs, vocab_size
        self.batch_size, self.seed = batch_size, seed
        self.test = mqar(test_examples, seq_len, num_kv_pairs, vocab_size, seed=(seed, 2**31 - 1))
        self.valid = mqar(test_examples, seq_len, num_kv_pairs, vocab_size, seed=(seed, 2**31 - 2))

    def batch(self, step: int, share: int, shares: int, device: torch.device) -> Tuple[Tensor, Tensor]:
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
                 **overrides: Any) -> Dict[str, Any]:
    """Train an ``mqar-*`` preset (overrides: fields of RecallConfig, e.g. seq_len, mixer, value_dim) on MQAR."""
    torch.manual_seed(train_cfg.seed)
    model = create_model(preset, **overrides)
    c = model.config
    task = RecallTask(c.seq_len, num_kv_pairs, c.vocab_size, train_cfg.batch_size, train_cfg.seed, test_examples)
    meta = {"family": "recall", "preset": preset, "model": asdict(c),
            "task": {"num_kv_pairs": num_kv_pairs, "seq_len": c.seq_len, "vocab_size": c.vocab_size,
                     "test_examples": test_examples}, "state_floats": model.state_floats()}
    return {**train(model, task, train_cfg, meta), "model": model}
