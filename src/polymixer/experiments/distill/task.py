"""Distillation of an attention language model into a PoM / hybrid one: ``polymixer distill lm``.

As the linear-attention conversion literature does it (attention transfer, then fine-tuning):

1. **Attention transfer** — the student is :func:`~polymixer.pomify.pomify` applied to a copy of the teacher. Only
   the new mixers train: each learns to reproduce the output of the attention layer it replaced, from the teacher's
   own input to that layer (every replaced layer in one teacher pass; loss = the mean over layers of the squared
   error divided by the mean square of the teacher's output, so every layer counts alike). Run folder
   ``<out>/stage1``; what it saves is the new mixers alone.
2. **Fine-tuning** — the whole student on the language-modelling loss, optionally plus ``kl`` × KL(teacher ‖
   student) of the next-token distributions at ``kl_temperature``. Run folder ``<out>``.

Both stages are runs of the shared training loop (checkpoints, exact resume, progress bar, torchrun). The teacher
is a polymixer run or a transformers folder: a polymixer model exported to transformers is distilled as a polymixer
model (the result is a polymixer run that ``generate``, ``eval lm`` and ``export hf`` take); transformers' GPT-2 and
Llama-family teachers give a converted transformers model, also saved with ``save_pretrained`` in ``<out>/hf``
(load it with :func:`polymixer.pomify.load_pomified`).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import hashlib
import json
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ...layers.attention import Attention
from ..data.faults import SampleFaults
from ...tokenizer import Tokenizer, load_tokenizer
from ..lm.bpe import run_tokenizer
from ..lm.data import prepare_corpus
from ...models.lm import GPT
from ...pomify import pomify, replaced_layers
from ...checkpoint import load_model, read_config, resolve_checkpoint
from ..train.loop import TrainConfig, add_train_config_arguments, train, train_config_from_args
from ..lm.task import LMTask, evaluate_lm
from ...ranges import Range
from ..tasks.common import float_in, int_at_least

__all__ = ["DistillConfig", "Teacher", "load_teacher", "MixerBank", "AttentionTransferTask", "DistillLMTask",
           "distill_lm"]


ATTENTION_LR_SCALE = 0.1


@dataclass
class DistillConfig:
    """What the student is and how the two stages train (stage 2 takes the run's :class:`TrainConfig`)."""

    pattern: str = "hybrid"  # over P / L / A, tiled; "hybrid" = LP…, "pom" = all PoM
    window: Optional[int] = None
    degree: Optional[int] = None
    expand: Optional[float] = None
    sel_heads: Optional[int] = None
    init: bool = True  # new mixers start from the attention they replace (False: random)
    stage1_steps: int = 50
    stage1_lr: float = 1e-3
    kl: float = 1.0
    kl_temperature: float = 1.0


# ----------------------------------------------------------------------------------------------------------------
# Teachers
# ----------------------------------------------------------------------------------------------------------------


@dataclass
class Teacher:
    model: nn.Module  # polymixer GPT, or a transformers causal LM
    kind: str  # "polymixer" | "hf"
    tokenizer: Tokenizer
    source: str
    block_size: int
    meta: Dict[str, Any]

    def logits(self, idx: Tensor, sep_token: Optional[int]) -> Tensor:
        return lm_logits(self.model, idx, sep_token)


def lm_logits(model: nn.Module, idx: Tensor, sep_token: Optional[int]) -> Tensor:
    """Logits of a polymixer GPT (documents packed at ``sep_token``) or of a transformers causal LM."""
    if isinstance(model, GPT):
        return model(idx, sep_token=sep_token)[0]
    return model(input_ids=idx, use_cache=False).logits


def load_teacher(path: str, device: Optional[torch.device] = None, block_size: Optional[int] = None) -> Teacher:
    """A polymixer run / checkpoint, or a transformers folder (a polymixer model exported to transformers comes
    back as polymixer's GPT; GPT-2 and Llama-family models stay transformers models)."""
    p = Path(path)
    if not is_transformers_folder(p):
        ck = resolve_checkpoint(p)
        cfg = read_config(ck)
        if cfg.get("family") != "lm":
            raise ValueError(f"{path} holds a {cfg.get('family')!r} model; the teacher must be a language model")
        model = load_model(ck, device=device, family="lm")
        tok = run_tokenizer(cfg.get("data", {}))
        return Teacher(model.eval(), "polymixer", tok, str(path), block_size or model.config.block_size,
                       {"preset": cfg.get("preset"), "data": cfg.get("data", {}), "step": cfg.get("step")})
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ...hf import PolymixerForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(p).to(device or "cpu").eval()
    if isinstance(hf, PolymixerForCausalLM):
        tok = load_tokenizer("bytes") if hf.config.tokenizer == "bytes" else None
        if tok is None:
            tok = HFTokenizer(AutoTokenizer.from_pretrained(p), _tok_name(p))
        return Teacher(hf.model, "polymixer", tok, str(path), block_size or hf.config.block_size, {"data": {}})
    tok = HFTokenizer(AutoTokenizer.from_pretrained(p), _tok_name(p))
    ctx = getattr(hf.config, "max_position_embeddings", None) or 1024
    return Teacher(hf, "hf", tok, str(path), block_size or min(256, ctx), {"data": {}})


class HFTokenizer:
    """A transformers tokenizer behind polymixer's :class:`~polymixer.tokenizer.Tokenizer` protocol (corpora, bits per
    byte), for teachers that come as transformers folders."""

    def __init__(self, tok: Any, name: str) -> None:
        self.tok = tok
        self.name = name
        self.vocab_size = len(tok)
        eot = tok.eos_token_id
        if eot is None:
            raise ValueError(f"the tokenizer of {name} has no end-of-text (eos) token")
        self.eot_id = int(eot)

    def encode(self, text: str) -> List[int]:
        return list(self.tok(text, add_special_tokens=False)["input_ids"])

    def encode_bytes(self, data: bytes) -> np.ndarray:
        return np.asarray(self.encode(data.decode("utf-8", errors="replace")), dtype=np.int64)

    def decode(self, ids: Sequence[int]) -> str:
        return self.tok.decode(list(ids))

    def token_bytes(self) -> np.ndarray:
        out = np.zeros(self.vocab_size, dtype=np.int64)
        special = set(self.tok.all_special_ids)
        for i in range(self.vocab_size):
            out[i] = 0 if i in special else len(self.tok.decode([i]).encode("utf-8"))
        return out


def is_transformers_folder(path: Path) -> bool:
    """A folder written by transformers' save_pretrained (its config.json names a model_type; polymixer's
    checkpoints name a family)."""
    f = Path(path) / "config.json"
    return f.is_file() and "model_type" in json.loads(f.read_text())


def _tok_name(path: Path) -> str:
    files = sorted(f for f in path.glob("*token*") if f.is_file()) + sorted(path.glob("vocab*")) + \
        sorted(path.glob("merges*"))
    h = hashlib.sha1()
    for f in files:
        h.update(f.read_bytes())
    return "hf-" + h.hexdigest()[:12]


def make_student(teacher: Teacher, cfg: DistillConfig) -> nn.Module:
    """pomify applied to a copy of the teacher."""
    return pomify(copy.deepcopy(teacher.model).train(), cfg.pattern, window=cfg.window, degree=cfg.degree,
                  expand=cfg.expand, sel_heads=cfg.sel_heads, init=cfg.init)


# ----------------------------------------------------------------------------------------------------------------
# Stage 1: attention transfer
# ----------------------------------------------------------------------------------------------------------------


@contextlib.contextmanager
def capture(modules: Dict[int, nn.Module]) -> Iterator[Dict[int, List[Tuple[tuple, dict, Tensor]]]]:
    """Record every call of the given modules: {index: [(args, kwargs, output tensor), …]}."""
    calls: Dict[int, List[Tuple[tuple, dict, Tensor]]] = {i: [] for i in modules}

    def hook(i: int):
        def fn(module: nn.Module, args: tuple, kwargs: dict, output: Any) -> None:
            out = output[0] if isinstance(output, tuple) else output
            calls[i].append((args, kwargs, out.detach()))
        return fn

    handles = [m.register_forward_hook(hook(i), with_kwargs=True) for i, m in modules.items()]
    try:
        yield calls
    finally:
        for h in handles:
            h.remove()


class MixerBank(nn.Module):
    """The student's new mixers (what stage 1 trains and saves); ``forward`` is the layer-matching loss."""

    def __init__(self, mixers: Dict[int, nn.Module]) -> None:
        super().__init__()
        if not mixers:
            raise ValueError("the pattern replaces no attention layer: nothing to distil")
        self.mixers = nn.ModuleDict({str(i): m for i, m in mixers.items()})
        self._slow = {f"mixers.{i}.{n}" for i, m in self.mixers.items() for mod_name, mod in m.named_modules()
                      if isinstance(mod, Attention) for n, _ in mod.named_parameters(prefix=mod_name)}

    def train(self, mode: bool = True) -> "MixerBank":
        """Stage 1 regresses onto the (deterministic, eval-mode) teacher's outputs: the mixers always run without
        dropout."""
        super().train(mode)
        self.mixers.eval()
        return self

    def lr_scale(self, name: str) -> float:
        """Local attention starts as an exact copy of the teacher's layer and its attention logits are sensitive:
        it trains at ``ATTENTION_LR_SCALE`` × the rate of the new PoM layers (measured: one step at the full rate
        can multiply its error tenfold)."""
        return ATTENTION_LR_SCALE if name in self._slow else 1.0

    def layer_errors(self, calls: Dict[int, List[Tuple[tuple, dict, Tensor]]]) -> Dict[int, Tensor]:
        """Per layer: squared error of the mixer on the teacher's inputs ÷ the mean square of the teacher's output."""
        errors = {}
        for key, mixer in self.mixers.items():
            num = den = 0.0
            for args, kwargs, target in calls[int(key)]:
                kw = {k: v for k, v in kwargs.items() if k not in ("past_key_values", "use_cache", "cache_position")}
                y = mixer(*args, **kw)
                y = y[0] if isinstance(y, tuple) else y
                num = num + (y.float() - target.float()).pow(2).sum()
                den = den + target.float().pow(2).sum()
            errors[int(key)] = num / den.clamp_min(1e-12)
        return errors

    def forward(self, calls: Dict[int, List[Tuple[tuple, dict, Tensor]]]) -> Tensor:
        errors = self.layer_errors(calls)
        return torch.stack(list(errors.values())).mean()


class _WindowsTask(LMTask):
    """The language-modelling task's windows and batches, with a teacher, a student and the student's validation
    loss (shared by both stages). Documents are packed (never attend into one another) for polymixer models;
    transformers models see raw windows."""

    def __init__(self, teacher: Teacher, student: nn.Module, corpus: Any, batch_size: int, seed: int,
                 eval_windows: int, pack: bool, faults: Optional[SampleFaults] = None) -> None:
        super().__init__(corpus, teacher.tokenizer.token_bytes(), teacher.block_size, batch_size, seed,
                         pack and teacher.kind == "polymixer", eval_windows, faults=faults)
        self.teacher, self.student = teacher, student
        self.sep = self.eot if self.pack else None

    def evaluate_student(self) -> Dict[str, float]:
        view = self.student if isinstance(self.student, GPT) else CausalLMView(self.student)
        return evaluate_lm(view, self.val_windows, self.token_bytes, self.sep, self.eval_windows)


class AttentionTransferTask(_WindowsTask):
    """Stage 1: the loop trains a :class:`MixerBank` on the teacher's layer inputs and outputs."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.pairs = replaced_layers(self.student, self.teacher.model)

    def teacher_calls(self, x: Tensor) -> Dict[int, List[Tuple[tuple, dict, Tensor]]]:
        with torch.no_grad(), capture({i: t for i, (_, t) in self.pairs.items()}) as calls:
            self.teacher.logits(x, self.sep)
        return calls

    def loss(self, model: nn.Module, batch: tuple) -> Tensor:
        return model(self.teacher_calls(batch[0]))

    @torch.no_grad()
    def evaluate(self, model: nn.Module, step: int, out_dir: Path) -> Dict[str, float]:
        bank = getattr(model, "module", model)
        was = bank.training
        bank.eval()
        errs: Dict[int, float] = {}
        for n, (x, _) in enumerate(self.val_windows.fixed(min(self.eval_windows, 64), 16)):
            for i, e in bank.layer_errors(self.teacher_calls(x.to(self.teacher_device))).items():
                errs[i] = errs.get(i, 0.0) + float(e)
        bank.train(was)
        metrics = {f"transfer_layer{i}": v / (n + 1) for i, v in sorted(errs.items())}
        metrics["transfer"] = float(np.mean(list(metrics.values())))
        return {**self.evaluate_student(), **metrics}

    @property
    def teacher_device(self) -> torch.device:
        return next(self.teacher.model.parameters()).device


# ----------------------------------------------------------------------------------------------------------------
# Stage 2: fine-tuning
# ----------------------------------------------------------------------------------------------------------------


class CausalLMView(nn.Module):
    """A transformers causal LM behind polymixer's LM call ``model(idx, targets) → (logits, loss)``."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, idx: Tensor, targets: Optional[Tensor] = None, sep_token: Optional[int] = None) -> tuple:
        logits = self.model(input_ids=idx, use_cache=False).logits
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=-1)
        return logits, loss


class DistillLMTask(_WindowsTask):
    """Stage 2: next-token cross-entropy of the whole student, plus ``kl`` × KL(teacher ‖ student)."""

    def __init__(self, *args: Any, kl: float = 0.0, kl_temperature: float = 1.0, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if kl < 0 or kl_temperature <= 0:
            raise ValueError(f"kl must be ≥ 0 and kl_temperature > 0, got {kl} and {kl_temperature}")
        self.kl, self.tau = kl, kl_temperature

    def loss(self, model: nn.Module, batch: tuple) -> Tensor:
        x, y = batch
        logits, ce = model(x, y, sep_token=self.sep)
        if self.kl == 0:
            return ce
        with torch.no_grad():
            t = self.teacher.logits(x, self.sep).float() / self.tau
        s = logits.float() / self.tau
        kl = F.kl_div(F.log_softmax(s, -1), F.log_softmax(t, -1), log_target=True, reduction="batchmean")
        return ce + self.kl * self.tau ** 2 * kl / x.shape[1]

    def evaluate(self, model: nn.Module, step: int, out_dir: Path) -> Dict[str, float]:
        return self.evaluate_student()


# ----------------------------------------------------------------------------------------------------------------
# Both stages
# ----------------------------------------------------------------------------------------------------------------


def distill_lm(teacher: str, cfg: DistillConfig, train_cfg: TrainConfig, data: Optional[List[str]] = None,
               val_fraction: float = 0.1, eval_windows: int = 256, pack: bool = True,
               block_size: Optional[int] = None) -> Dict[str, Any]:
    """Convert ``teacher`` with ``cfg.pattern`` and distil it: stage 1 into ``<out>/stage1``, stage 2 into
    ``<out>`` (``train_cfg`` is stage 2's; stage 1 copies it with ``stage1_steps`` and ``stage1_lr``)."""
    if cfg.stage1_steps < 0:
        raise ValueError(f"stage1_steps must be ≥ 0, got {cfg.stage1_steps}")
    t = load_teacher(teacher, block_size=block_size)
    t.model.requires_grad_(False)
    faults = SampleFaults.training(train_cfg.skip_bad_samples)
    corpus = prepare_corpus(data if data is not None else t.meta["data"].get("paths"), t.tokenizer,
                            val_fraction=val_fraction, progress=train_cfg.progress, faults=faults)
    torch.manual_seed(train_cfg.seed)
    student = make_student(t, cfg).requires_grad_(True)
    out = Path(train_cfg.out)
    common = (t, student, corpus, train_cfg.batch_size, train_cfg.seed, eval_windows, pack, faults)
    described = {"teacher": t.source, "teacher_kind": t.kind, **asdict(cfg)}
    results: Dict[str, Any] = {"student": student, "teacher": t}
    if cfg.stage1_steps:
        s1 = replace(train_cfg, steps=cfg.stage1_steps, lr=cfg.stage1_lr, min_lr=cfg.stage1_lr / 10,
                     warmup=max(1, cfg.stage1_steps // 10), eval_every=min(train_cfg.eval_every, cfg.stage1_steps),
                     ckpt_every=min(train_cfg.ckpt_every, cfg.stage1_steps), out=str(out / "stage1"), ema=0.0,
                     init_from=None)
        task1 = AttentionTransferTask(*common)
        bank = MixerBank({i: s for i, (s, _) in task1.pairs.items()})
        results["stage1"] = train(bank, task1, s1, {"family": "distill-transfer", "model": described})
    task2 = DistillLMTask(*common, kl=cfg.kl, kl_temperature=cfg.kl_temperature)
    if isinstance(student, GPT):
        meta = {"family": "lm", "preset": t.meta.get("preset"), "model": asdict(student.config),
                "data": {**t.meta["data"], "paths": data if data is not None else t.meta["data"].get("paths"),
                         "pack": pack, "val_fraction": val_fraction},
                "distill": described}
        model: nn.Module = student
    else:
        meta = {"family": "distill-hf", "model": {**described, "pomify": student.config.polymixer_pomify},
                "data": {"paths": data, "tokenizer": t.tokenizer.name}}
        model = CausalLMView(student)
    results["stage2"] = train(model, task2, train_cfg, meta)
    if not isinstance(student, GPT) and results["stage2"]["rank"] == 0:
        student.save_pretrained(out / "hf")
        hf_tok = getattr(t.tokenizer, "tok", None)
        if hf_tok is not None:
            hf_tok.save_pretrained(out / "hf")
    return results


# ----------------------------------------------------------------------------------------------------------------
# polymixer distill lm
# ----------------------------------------------------------------------------------------------------------------

# the recipe of bench distill: a quarter of the tiny teacher's 1,500 steps in all (50 of them in stage 1)
DEFAULTS = TrainConfig(steps=325, batch_size=32, lr=4e-3, min_lr=4e-4, warmup=32, eval_every=50, ckpt_every=100)


def add_lm_arguments(p: argparse.ArgumentParser) -> None:
    d = DistillConfig()
    p.add_argument("--teacher", required=True, help="polymixer run / checkpoint, or a transformers folder")
    p.add_argument("--pattern", default=d.pattern,
                   help="one letter per layer over P (PoM), L (local attention), A (keep); or 'hybrid' / 'pom'")
    for name, kind in (("window", int_at_least(1)), ("degree", int_at_least(1)),
                       ("expand", float_in(Range(0, low_open=True))), ("sel_heads", int_at_least(1))):
        p.add_argument("--" + name.replace("_", "-"), type=kind, default=None, help="of the new mixers")
    p.add_argument("--random-init", action="store_true", help="new mixers start random, not from the attention")
    p.add_argument("--stage1-steps", type=int_at_least(0), default=d.stage1_steps,
                   help="attention-transfer steps (0: skip)")
    p.add_argument("--stage1-lr", type=float_in(Range(0, low_open=True)), default=d.stage1_lr)
    p.add_argument("--kl", type=float_in(Range(0)), default=d.kl, help="weight of KL(teacher ‖ student) in stage 2")
    p.add_argument("--kl-temperature", type=float_in(Range(0, low_open=True)), default=d.kl_temperature)
    p.add_argument("--data", nargs="*", default=None,
                   help="text files or folders (default: the teacher's corpus, else the Python standard library)")
    p.add_argument("--val-fraction", type=float_in(Range(0, 1, True, True)), default=0.1)
    p.add_argument("--eval-windows", type=int_at_least(1), default=256)
    p.add_argument("--block-size", type=int_at_least(1), default=None,
                   help="window length (default: the teacher's context)")
    p.add_argument("--no-pack", action="store_true", help="let windows attend across end-of-text")
    add_train_config_arguments(p, DEFAULTS, "run folder (default: runs/distill/<pattern>); stage 1 in <out>/stage1")


def main_lm(args: argparse.Namespace) -> int:
    cfg = DistillConfig(pattern=args.pattern, window=args.window, degree=args.degree, expand=args.expand,
                        sel_heads=args.sel_heads, init=not args.random_init, stage1_steps=args.stage1_steps,
                        stage1_lr=args.stage1_lr, kl=args.kl, kl_temperature=args.kl_temperature)
    tcfg = train_config_from_args(args, DEFAULTS, f"runs/distill/{args.pattern}")
    res = distill_lm(args.teacher, cfg, tcfg, args.data, args.val_fraction, args.eval_windows, not args.no_pack,
                     args.block_size)
    if res["stage2"]["rank"] == 0:
        summary = {"run": tcfg.out, "stage1": res.get("stage1", {}).get("metrics"), **res["stage2"]["metrics"]}
        print(json.dumps(summary, indent=2))
    return 0
