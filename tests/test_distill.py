"""Distillation (attention transfer, then fine-tuning) through the shared loop, the command and its bench."""

from __future__ import annotations

import json

import pytest
import torch

from polymixer.experiments.cli import main
from polymixer.experiments.lm.data import prepare_corpus
from polymixer.tokenizer import ByteTokenizer
from polymixer.experiments.distill.task import (
    AttentionTransferTask, DistillConfig, DistillLMTask, MixerBank, load_teacher, make_student,
)
from polymixer.experiments.lm.task import train_lm
from polymixer.checkpoint import load_model, resolve_checkpoint
from polymixer.experiments.train.loop import TrainConfig

MODEL = dict(n_layer=2, n_embd=32, n_head=2, block_size=32, window=8, sel_heads=2)


pytestmark = pytest.mark.usefixtures("polymixer_cache")


@pytest.fixture(scope="module")
def teacher_run(tmp_path_factory, corpus_dir):
    out = tmp_path_factory.mktemp("teacher") / "run"
    cfg = TrainConfig(steps=30, batch_size=8, lr=3e-3, warmup=3, eval_every=30, ckpt_every=30, out=str(out),
                      progress=False)
    train_lm("tiny-attention", cfg, [str(corpus_dir)], eval_windows=8, **MODEL)
    return out


def _stage1_step_lowers_loss(teacher, corpus_dir, pattern, tmp_path):
    """One step of stage 1 as distill lm takes it (the shared loop, its optimizer, warm-up and lr scales)."""
    from polymixer.experiments.train.loop import train

    corpus = prepare_corpus([str(corpus_dir)], teacher.tokenizer, progress=False)
    student = make_student(teacher, DistillConfig(pattern=pattern))
    frozen = {k: v.clone() for k, v in student.state_dict().items()}
    task = AttentionTransferTask(teacher, student, corpus, 8, 0, 8, True)
    bank = MixerBank({i: s for i, (s, _) in task.pairs.items()})
    batch = task.batch(0, 0, 1, torch.device("cpu"))
    with torch.no_grad():
        before = float(task.loss(bank, batch))
    cfg = TrainConfig(steps=1, batch_size=8, lr=DistillConfig().stage1_lr, warmup=10, eval_every=10, ckpt_every=10,
                      out=str(tmp_path / "s1"), progress=False)
    task.evaluate = lambda *a: {}
    train(bank, task, cfg, {"family": "distill-transfer", "model": {}})
    with torch.no_grad():
        assert float(task.loss(bank, batch)) < before
    # only the new mixers changed
    new = {id(p) for p in bank.parameters()}
    names = {n for n, p in student.named_parameters() if id(p) in new}
    for k, v in student.state_dict().items():
        if k not in names:
            assert torch.equal(v, frozen[k]), k


def test_one_stage1_step_lowers_the_layer_matching_loss(teacher_run, corpus_dir, tmp_path):
    _stage1_step_lowers_loss(load_teacher(str(teacher_run)), corpus_dir, "LP", tmp_path)


def test_one_stage1_step_lowers_the_layer_matching_loss_transformers(tmp_path, corpus_dir):
    tf = pytest.importorskip("transformers")
    from polymixer.hf import hf_tokenizer

    m = tf.GPT2LMHeadModel(tf.GPT2Config(n_layer=2, n_embd=32, n_head=4, vocab_size=257, n_positions=64,
                                         bos_token_id=256, eos_token_id=256))
    with torch.no_grad():  # peaked attention (a random GPT-2 averages almost uniformly: PoM's init would be exact)
        for blk in m.transformer.h:
            blk.attn.c_attn.weight[:, :64] *= 8
    m.save_pretrained(tmp_path / "gpt2")
    hf_tokenizer().save_pretrained(tmp_path / "gpt2")
    teacher = load_teacher(str(tmp_path / "gpt2"), block_size=32)
    assert teacher.kind == "hf" and teacher.tokenizer.encode("ab") == [97, 98]
    _stage1_step_lowers_loss(teacher, corpus_dir, "PL", tmp_path)


def test_kl_to_an_identical_teacher_is_zero(teacher_run, corpus_dir):
    teacher = load_teacher(str(teacher_run))
    corpus = prepare_corpus([str(corpus_dir)], ByteTokenizer(), progress=False)
    task = DistillLMTask(teacher, teacher.model, corpus, 8, 0, 8, True, kl=2.0)
    batch = task.batch(0, 0, 1, torch.device("cpu"))
    ce = teacher.model(*batch, sep_token=task.sep)[1]
    torch.testing.assert_close(task.loss(teacher.model, batch), ce)
    with pytest.raises(ValueError, match="kl"):
        DistillLMTask(teacher, teacher.model, corpus, 8, 0, 8, True, kl=-1.0)


def test_distill_command_end_to_end_and_resume(tmp_path, teacher_run, corpus_dir, capsys):
    out = tmp_path / "student"
    args = ["distill", "lm", "--teacher", str(teacher_run), "--pattern", "LP", "--stage1-steps", "4", "--steps", "4",
            "--batch-size", "4", "--eval-every", "2", "--ckpt-every", "2", "--eval-windows", "8", "--kl", "0.5",
            "--out", str(out), "--quiet"]
    assert main(args) == 0
    student = load_model(out)
    assert student.pattern == "LP" and student.config.mixer == "LP"
    assert resolve_checkpoint(out / "stage1").name == "step_00000004"
    hist = json.loads((out / "stage1" / "history.json").read_text())
    assert any("eval_transfer" in r for r in hist)
    # a second invocation finds both stages done and leaves the weights as they are
    assert main(args) == 0
    again = load_model(out)
    assert all(torch.equal(v, again.state_dict()[k]) for k, v in student.state_dict().items())
    assert main(["generate", "--ckpt", str(out), "--prompt", "def", "--max-new-tokens", "4"]) == 0
    assert main(["eval", "lm", "--ckpt", str(out), "--windows", "4", "--lengths", "1"]) == 0
    assert main(["distill", "lm", "--teacher", str(teacher_run), "--pattern", "AA", "--out", str(tmp_path / "x"),
                 "--quiet"]) == 2
    assert "replaces no attention layer" in capsys.readouterr().err


def test_distill_a_transformers_llama_teacher(tmp_path, corpus_dir):
    tf = pytest.importorskip("transformers")
    from polymixer.hf import hf_tokenizer
    from polymixer.pomify import load_pomified

    m = tf.LlamaForCausalLM(tf.LlamaConfig(num_hidden_layers=2, hidden_size=32, num_attention_heads=4,
                                           num_key_value_heads=2, intermediate_size=64, vocab_size=257,
                                           max_position_embeddings=64, bos_token_id=256, eos_token_id=256))
    m.save_pretrained(tmp_path / "llama")
    hf_tokenizer().save_pretrained(tmp_path / "llama")
    out = tmp_path / "student"
    assert main(["distill", "lm", "--teacher", str(tmp_path / "llama"), "--pattern", "PL", "--stage1-steps", "2",
                 "--steps", "2", "--batch-size", "4", "--block-size", "32", "--eval-every", "2", "--eval-windows",
                 "4", "--data", str(corpus_dir), "--out", str(out), "--quiet"]) == 0
    student = load_pomified(out / "hf")
    assert student.config.polymixer_pomify["pattern"] == "PL"
    assert student.generate(torch.tensor([[97, 98]]), max_new_tokens=3, do_sample=False).shape == (1, 5)


def test_bench_distill_toy(tmp_path, corpus_dir):
    import threading

    from polymixer.experiments.distill.bench import DistillBenchConfig, report, run
    from polymixer.experiments.locks import claimed

    cfg = DistillBenchConfig(teacher_steps=12, batch=4, stage1_steps=1, eval_every=1, eval_windows=4,
                             students=("hybrid",), data=(str(corpus_dir),), model_overrides=MODEL,
                             out=str(tmp_path / "bench"))
    # a bench beside this one (other students) is training the teacher: this one waits for it, then goes on
    held, free = threading.Event(), threading.Event()

    def other() -> None:
        with claimed(tmp_path / "bench" / "quality" / "distill-teacher"):
            held.set()
            free.wait(30)

    beside = threading.Thread(target=other)
    beside.start()
    held.wait(30)
    threading.Timer(1.0, free.set).start()
    with pytest.warns(UserWarning, match="distill-teacher: another process is training this run now; waiting"):
        payload = run(cfg, progress=False)
    beside.join()
    rows = payload["quality"]["rows"]
    assert [(r["model"], r["method"]) for r in rows] == [("teacher (attention)", "trained"), ("hybrid", "distilled"),
                                                        ("hybrid", "fine-tuned only"), ("hybrid", "from scratch")]
    assert rows[1]["tokens"] == rows[2]["tokens"] == rows[3]["tokens"] == 3 * 4 * 32  # 25% of 12 steps in all
    text = report(payload)
    assert "distilled hybrid vs teacher val loss" in text and "target ahead" in text
    assert (tmp_path / "bench" / "distill.png").stat().st_size > 10_000
    curve = payload["quality"]["curves"]["distilled hybrid"]
    assert [p["tokens"] for p in curve] == [128, 256, 384]  # stage 1 (1 step), then stage 2
    assert [p["tokens"] for p in payload["quality"]["curves"]["fine-tuned only hybrid"]] == [128, 256, 384]
