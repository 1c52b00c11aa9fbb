"""bench parity: each family's models at their best rate against attention, gaps and targets from the benches' JSON."""

import json

import pytest

from polymixer.bench import parity


def _write(folder, name, part, rows):
    (folder / f"{name}.json").write_text(json.dumps({part: {"rows": rows}}))


def test_parity_reads_best_rates_and_judges_targets(tmp_path):
    lm = [{"spec": "tiny-attention", "val_loss": 1.0, "lr": 0.002, "best_lr": True, "rates": 2},
          {"spec": "tiny-attention", "val_loss": 0.9, "lr": 0.004, "best_lr": False, "rates": 2},  # not its best
          {"spec": "tiny-pom", "val_loss": 1.3, "lr": 0.002, "best_lr": True, "rates": 1},
          {"spec": "tiny-vpom", "val_loss": 1.08, "lr": 0.002, "best_lr": True, "rates": 1},
          {"spec": "tiny-hybrid", "val_loss": 1.03, "lr": 0.002, "best_lr": True, "rates": 1}]
    _write(tmp_path, "lm", "quality", lm)
    eo = [{"spec": "tiny-tsvit", "miou_24": 0.30}, {"spec": "tiny-tsvipom", "miou_24": 0.15},
          {"spec": "tiny-tsvipom-value", "miou_24": 0.295},
          {"spec": "tiny-tsvipom-hybrid", "miou_24": 0.33}]  # keeps full attention: not a linear-time model
    _write(tmp_path, "eo", "quality", eo)
    image = [{"model": "tiny-sit", "objective": "flow", "fd": 50.0}, {"model": "tiny-sipom", "objective": "flow",
                                                                       "fd": 60.0},
             {"model": "tiny-sit", "objective": "ddpm", "fd": 10.0}]  # another objective: ignored
    _write(tmp_path, "image", "quality", image)
    p = parity.collect(tmp_path)
    fam = {f["bench"]: f for f in p["families"]}
    lmf = fam["lm"]
    assert lmf["attention"]["value"] == 1.0 and lmf["attention"]["rates"] == 2
    assert lmf["pom"]["gap"] == pytest.approx(0.3) and lmf["value"]["gap"] == pytest.approx(0.08)
    assert lmf["best_linear"]["model"] == "tiny-hybrid"
    assert [t["verdict"] for t in lmf["targets"]] == ["MISSED", "met"]  # hybrid +3% > 2%; value PoM +8% ≤ 10%
    e = fam["eo"]
    assert e["hybrid"]["full_attention"] and e["hybrid"]["gap"] == pytest.approx(3.0)
    assert e["best_linear"]["model"] == "tiny-tsvipom-value" and e["best_linear"]["gap"] == pytest.approx(-0.5)
    assert [t["verdict"] for t in e["targets"]] == ["met", "met"]
    assert fam["image"]["pom"]["gap"] == pytest.approx(1.2) and fam["image"]["value"] == {"run": False}
    assert fam["points"]["found"] is False and fam["points"]["targets"][0]["verdict"] == "not run"
    text = parity.report(p)
    assert "tiny-tsvipom-hybrid (full attention)" in text and "not run" in text
    assert "all-PoM or all-value-PoM within 8 points: tiny-tsvipom-value -0.5 — **met**" in text


def test_parity_without_results_says_where_it_looked(tmp_path, capsys):
    from polymixer.cli import main

    with pytest.raises(SystemExit) as e:
        main(["bench", "parity", "--out", str(tmp_path)])
    assert "no bench results in" in str(e.value) and "lm.json" in str(e.value)
