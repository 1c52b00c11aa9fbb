"""MQAR data (Zoology's construction), the linear-attention baselines against a float64 oracle, the recall models,
the task through the shared loop, and the bench on a toy."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from polymixer.data.recall import IGNORE, mqar
from polymixer.linear_attention import LinearAttention, taylor_features
from polymixer.models import create_model, list_models
from polymixer.reference import visibility


def test_mqar_follows_zoology():
    n, L, K, V = 50, 64, 8, 512
    x, y = mqar(n, L, K, V, seed=3)
    assert x.shape == y.shape == (n, L) and x.dtype == y.dtype == torch.int64
    for row_x, row_y in zip(x.tolist(), y.tolist()):
        keys, values = row_x[0:2 * K:2], row_x[1:2 * K:2]
        assert len(set(keys)) == K and all(1 <= k < V // 2 for k in keys)
        assert len(set(values)) == K and all(V // 2 <= v < V for v in values)
        asked = [i for i, t in enumerate(row_y) if t != IGNORE]
        assert len(asked) == K and all(i >= 2 * K and (i - 2 * K) % 2 == 0 for i in asked)
        binding = dict(zip(keys, values))
        assert sorted(row_x[i] for i in asked) == sorted(keys)  # every key is asked once
        assert all(row_y[i] == binding[row_x[i]] for i in asked)  # …and answered with its value
    x2, y2 = mqar(n, L, K, V, seed=3)
    assert torch.equal(x, x2) and torch.equal(y, y2)
    assert not torch.equal(mqar(n, L, K, V, seed=4)[0], x)
    # power law (a = 0.01): queries crowd right after the pairs
    gaps = [(i - 2 * K) // 2 for row in mqar(400, 256, 8, 2048, seed=0)[1].tolist() for i, t in enumerate(row)
            if t != IGNORE]
    assert np.median(gaps) < 30


def test_mqar_rejects_impossible_settings():
    with pytest.raises(ValueError, match="seq_len must be even"):
        mqar(2, 63, 4, 512)
    with pytest.raises(ValueError, match="need seq_len ≥ 4 × 20 = 80"):
        mqar(2, 64, 20, 512)
    with pytest.raises(ValueError, match="holds 7 distinct keys"):
        mqar(2, 64, 8, 16)


def _oracle(la, x, vis, key_mask):
    """y_i = W_o Σ_j vis_ij (φ(q_i)·φ(k_j)) v_j / normaliser, per head, in float64; with the token shift, key j and
    value j are w₀ ⊙ W x_j + w₁ ⊙ W x_{j−1} (a padded token counts as zero)."""
    B, N, _ = x.shape
    H, f = la.heads, la.feature_dim
    qk = (x @ la.qk.weight.T).view(B, N, 2, H, f)
    q, k = qk[:, :, 0], qk[:, :, 1]
    v = (x @ la.v.weight.T).view(B, N, H, -1)
    if la.token_shift:
        w = la.shift.double()
        zk, zv = k.reshape(B, N, H * f), v.reshape(B, N, -1)
        prev = torch.zeros_like(torch.cat([zk, zv], -1))
        for j in range(1, N):
            prev[:, j] = torch.cat([zk[:, j - 1], zv[:, j - 1]], -1) * key_mask[:, j - 1, None]
        k = (w[0, :H * f] * zk + w[1, :H * f] * prev[..., :H * f]).view(B, N, H, f)
        v = (w[0, H * f:] * zv + w[1, H * f:] * prev[..., H * f:]).view(B, N, H, -1)
    if la.feature_map == "taylor":
        q, k = taylor_features(q), taylor_features(k)
    scores = torch.einsum("bihf,bjhf->bhij", q, k) * vis[:, None].double()
    o = torch.einsum("bhij,bjhe->bihe", scores, v)
    if la.feature_map == "taylor":
        o = o / (scores.sum(-1).transpose(1, 2).unsqueeze(-1) + 1e-6)
    else:
        o = o / torch.sqrt(o.pow(2).mean(-1, keepdim=True) + 1e-6)
    o = o.reshape(B, N, -1)
    if la.feature_map == "identity":
        o = o * la.norm_weight
    return o @ la.out.weight.T


@pytest.mark.parametrize("feature_map", ["identity", "taylor"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shift", [False, True])
def test_linear_attention_matches_the_oracle(feature_map, causal, shift):
    la = LinearAttention(8, heads=2, feature_dim=3, value_dim=6, feature_map=feature_map, chunk_size=4,
                         token_shift=shift).double()
    if shift:
        with torch.no_grad():
            la.shift.uniform_(-1, 1)
    B, N = 2, 21
    x = torch.randn(B, N, 8, dtype=torch.float64)
    km = torch.ones(B, N, dtype=torch.bool)
    km[1, :5] = False
    y = la(x, mask=km, causal=causal)
    ref = _oracle(la, x, visibility(B, N, N, causal=causal, key_mask=km), km)
    torch.testing.assert_close(y[km], ref[km], rtol=1e-9, atol=1e-10)


def test_taylor_map_is_the_second_order_expansion():
    q, k = torch.randn(5, 7, dtype=torch.float64), torch.randn(5, 7, dtype=torch.float64)
    s = (q * k).sum(-1) / 7 ** 0.5
    torch.testing.assert_close((taylor_features(q) * taylor_features(k)).sum(-1), 1 + s + s * s / 2)
    with pytest.raises(ValueError, match="feature_map must be"):
        LinearAttention(8, feature_map="elu")


def test_recall_models_and_state_sizes():
    assert list_models(family="recall") == ["mqar-attention", "mqar-based", "mqar-linear", "mqar-pom", "mqar-swa",
                                            "mqar-vpom"]
    sizes = {n: create_model(n, vocab_size=64, seq_len=16, d_model=16, value_dim=16, feature_dim=4).state_floats()
             for n in list_models(family="recall")}
    assert sizes["mqar-attention"] == 2 * 16 * 16 and sizes["mqar-swa"] == 2 * 16 * 16  # window 16 ≥ seq_len
    assert sizes["mqar-pom"] == 64 and sizes["mqar-vpom"] == 64 * 16 + 64 + 16
    assert sizes["mqar-linear"] == 4 * 16 and sizes["mqar-based"] == 21 * 16 + 21
    shifted = create_model("mqar-attention", vocab_size=64, seq_len=16, d_model=16, token_shift=True)
    assert shifted.state_floats() == 2 * 16 * 16 + 16  # the KV cache and the previous token
    x = mqar(2, 16, 2, 64, seed=1)[0]
    x2 = x.clone()
    x2[:, 9] = (x2[:, 9] + 1) % 64
    a, b = shifted(x)[0], shifted(x2)[0]  # the shift stays causal
    assert torch.equal(a[:, :9], b[:, :9]) and not torch.equal(a[:, 9:], b[:, 9:])
    m = create_model("mqar-vpom", vocab_size=64, seq_len=16, d_model=16, mixer="LV")
    logits, loss = m(*mqar(3, 16, 2, 64, seed=0))
    assert logits.shape == (3, 16, 64) and torch.isfinite(loss)
    with pytest.raises(ValueError, match="unknown mixer"):
        create_model("mqar-vpom", mixer="VX")


def test_recall_task_trains_through_the_shared_loop(tmp_path):
    from polymixer.tasks.recall import RecallTask, train_recall
    from polymixer.train.loop import TrainConfig

    task = RecallTask(16, 2, 64, 8, seed=0, test_examples=20)
    a, b = task.batch(3, 0, 2, torch.device("cpu")), task.batch(3, 1, 2, torch.device("cpu"))
    whole = task.batch(3, 0, 1, torch.device("cpu"))
    assert torch.equal(torch.cat([a[0], b[0]]), whole[0])  # shares of one pure batch
    cfg = TrainConfig(steps=30, batch_size=16, lr=3e-3, warmup=3, eval_every=30, ckpt_every=30, out=str(tmp_path),
                      progress=False)
    res = train_recall("mqar-attention", cfg, num_kv_pairs=2, test_examples=40, vocab_size=64, seq_len=16,
                       d_model=32)
    losses = [r["loss"] for r in res["history"] if "loss" in r]
    assert losses[-1] < losses[0] and 0.0 <= res["metrics"]["accuracy"] <= 1.0


def test_bench_recall_on_a_toy(tmp_path):
    from polymixer.bench.recall import RecallBenchConfig, report, run

    cfg = RecallBenchConfig(vocab_size=64, d_model=16, steps=3, batch=8, seeds=(0, 1), state_point=(16, 2),
                            state_variants=("attention", "attention-shift", "vpom-1k", "based-1k", "linear-1k", "pom",
                                            "hybrid-LV"),
                            length_points=((16, 2), (32, 4)), length_variants=("vpom-1k",), test_examples=16,
                            out=str(tmp_path))
    payload = run(cfg, progress=False)
    rows = {(r["variant"], r["seq_len"]): r for r in payload["state"]["rows"] + payload["length"]["rows"]}
    assert rows[("vpom-1k", 16)]["seeds"] == 2 and ("vpom-1k", 32) in rows
    assert rows[("vpom-1k", 16)]["low"] <= rows[("vpom-1k", 16)]["median"] <= rows[("vpom-1k", 16)]["high"]
    # a budget other than the default (2,000 steps, lr 1e-3) is part of the run's folder and of every row
    record = tmp_path / "quality" / "recall" / "vpom-1k-L16-K2-s0-3steps-lr0.001" / "result.json"
    assert all(r["steps"] == 3 and r["lr"] == 1e-3 for r in payload["state"]["rows"])
    stamp = record.stat().st_mtime_ns
    run(cfg, progress=False)  # finished runs are read back, not trained again
    assert record.stat().st_mtime_ns == stamp
    from dataclasses import replace

    more = replace(cfg, seeds=(0, 1, 2), train=False, compile=True)  # --collect: seed 2 was never trained, so it
    # is left out; compiling changes nothing in what a run is
    rows = run(more, progress=False)["state"]["rows"]
    assert all(r["seeds"] == 2 for r in rows)
    assert not (tmp_path / "quality" / "recall" / "pom-L16-K2-s2-3steps-lr0.001").exists()
    assert json.loads((tmp_path / "recall.json").read_text())["state"]["rows"]
    assert (tmp_path / "recall.png").is_file() and "state floats / layer" in report(payload)


def test_resume_a_run_saved_before_a_config_field_existed(tmp_path):
    """A checkpoint written before a model-config field was added resumes when the run keeps that field's default,
    and is refused when it does not."""
    from polymixer.tasks.recall import train_recall
    from polymixer.train.checkpoint import _write_manifest
    from polymixer.train.loop import TrainConfig

    kw = dict(num_kv_pairs=2, test_examples=8, seq_len=16, vocab_size=64, d_model=16)
    cfg = TrainConfig(steps=2, batch_size=4, eval_every=2, ckpt_every=1, out=str(tmp_path), progress=False)
    train_recall("mqar-based", cfg, **kw)
    for path in (tmp_path / "checkpoints").rglob("config.json"):  # as an older version wrote it
        saved = json.loads(path.read_text())
        del saved["model"]["token_shift"]
        path.write_text(json.dumps(saved))
        _write_manifest(path.parent)
    cfg4 = TrainConfig(steps=4, batch_size=4, eval_every=2, ckpt_every=1, out=str(tmp_path), progress=False)
    assert train_recall("mqar-based", cfg4, **kw)["history"]
    with pytest.raises(ValueError, match="token_shift"):
        train_recall("mqar-based", TrainConfig(**{**cfg4.__dict__, "steps": 6}), token_shift=True, **kw)


def test_bench_recall_length_points_from_the_command_line():
    import argparse

    from polymixer.bench.recall import add_arguments

    p = argparse.ArgumentParser()
    add_arguments(p)
    assert p.parse_args(["--length-points", "64:8", "512:64"]).length_points == [(64, 8), (512, 64)]
    with pytest.raises(SystemExit):
        p.parse_args(["--length-points", "512"])
