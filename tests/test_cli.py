"""The command line: `polymixer bench mixer` writes its table, JSON and plot; errors are reported, not raised."""

from __future__ import annotations

import json

from polymixer.bench.mixer import predicted_crossover
from polymixer.cli import main


def test_bench_mixer_small_sweep(tmp_path, capsys):
    out = tmp_path / "bench"
    rc = main(["bench", "mixer", "--dim", "32", "--heads", "4", "--tokens", "256", "--lengths", "64", "128",
               "--pom-lengths", "512", "--repeats", "2", "--no-compile", "--out", str(out)])
    assert rc == 0
    text = capsys.readouterr().out
    assert "crossover" in text and "pom full" in text and "sdpa causal" in text
    payload = json.loads((out / "mixer.json").read_text())
    assert (out / "mixer.png").stat().st_size > 10_000
    mixers = {(r["N"], r["mixer"]) for r in payload["rows"]}
    assert (512, "pom causal") in mixers and (512, "sdpa full") not in mixers  # attention stops at --lengths
    for r in payload["rows"]:
        assert r["fwd_ms"] > 0 and r["fwdbwd_ms"] > 0 and r["fwd_peak_mb"] is not None
        assert r["batch"] * r["N"] >= 256
    assert payload["summary"]["predicted_crossover"] == predicted_crossover(32, 64, 2)


def test_predicted_crossover_is_d_plus_3_for_defaults():
    assert predicted_crossover(512, 1024, 2) == 515


def test_cli_reports_bad_arguments(capsys):
    rc = main(["bench", "mixer", "--lengths", "0", "--no-compile", "--out", "/tmp/unused"])
    assert rc == 2
    assert "positive" in capsys.readouterr().err
