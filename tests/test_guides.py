"""The guides' result tables are what ``python -m polymixer.experiments.guides`` generates from docs/bench's JSON:
a figure typed by hand, or a bench rerun without regenerating, fails here."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from polymixer.experiments import guides

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
BENCH = DOCS / "bench"


def test_every_generated_table_in_the_guides_is_current():
    stale = guides.update_guides(DOCS, BENCH, check=True)
    assert not stale, f"stale tables (run {guides.COMMAND}): {stale}"


def test_every_registered_table_is_marked_in_exactly_one_guide():
    """Every table (the shared ones and each family's, which its registration brings) is marked once in docs/*.md,
    and the JSON it names exists."""
    used = [m.name for g in guides.guides_in(DOCS) for m in guides.find_markers(g.read_text(), g.name)]
    assert sorted(used) == sorted(guides.tables()), "each table is used by exactly one marker in docs/*.md"
    assert {"lm.quality", "recall.state", "eo.quality"} <= set(guides.tables()) - set(guides.SHARED)
    for name, table in guides.tables().items():
        assert all((BENCH / f).exists() for f in table.sources), name


def _make(name: str, bench: Path) -> str:
    """The table ``name`` generated from the JSON under ``bench``."""
    return guides.tables()[name].make(bench)


def _sources(name: str):
    return guides.tables()[name].sources


def _copy_guide(tmp_path: Path, name: str) -> Path:
    docs = tmp_path / "docs"
    docs.mkdir()
    return Path(shutil.copy(DOCS / name, docs / name))


def test_a_number_edited_by_hand_is_stale_and_the_generator_writes_it_back(tmp_path, capsys):
    guide = _copy_guide(tmp_path, "lm.md")
    original = guide.read_text()
    begin = original.index("<!-- table:lm.throughput")
    table = original[begin:original.index(guides.END, begin)]
    first = re.search(r"\| (\d[\d.]*) \(", table).group(1)  # attention's first throughput figure
    edited = table.replace(f"| {first} (", f"| {first}1 (", 1)
    assert edited != table
    guide.write_text(original.replace(table, edited))

    assert guides.update_guides(guide.parent, BENCH, check=True) == [("lm.md", "lm.throughput")]
    assert guide.read_text() != original, "--check rewrites nothing"
    assert guides.main(["--docs", str(guide.parent), "--bench", str(BENCH), "--check"]) == 1
    assert "lm.md: table lm.throughput is stale" in capsys.readouterr().out

    assert guides.main(["--docs", str(guide.parent), "--bench", str(BENCH)]) == 0
    assert guide.read_text() == original
    assert guides.main(["--docs", str(guide.parent), "--bench", str(BENCH), "--check"]) == 0


def test_a_table_follows_its_json(tmp_path):
    """A rerun bench (here one figure of lm.json changed) makes the guide stale until it is regenerated."""
    bench = tmp_path / "bench"
    shutil.copytree(BENCH, bench, ignore=shutil.ignore_patterns("*.png"))
    lm = bench / "lm.json"
    payload = json.loads(lm.read_text())
    payload["throughput"]["rows"][0]["ktok_s"] = 99.5
    lm.write_text(json.dumps(payload))
    guide = _copy_guide(tmp_path, "lm.md")
    assert guides.update_guides(guide.parent, bench, check=True) == [("lm.md", "lm.throughput")]
    guides.update_guides(guide.parent, bench)
    assert "| 99.5 (" in guide.read_text()


def test_an_unknown_table_name_is_a_one_line_error(tmp_path, capsys):
    guide = tmp_path / "docs" / "odd.md"
    guide.parent.mkdir()
    guide.write_text(f"<!-- table:lm.nonesuch (generated from docs/bench/lm.json: {guides.COMMAND}) -->\n"
                     f"| a |\n|---|\n{guides.END}\n")
    with pytest.raises(ValueError, match=r"^odd\.md: unknown table 'lm\.nonesuch'"):
        guides.update_guides(guide.parent, BENCH, check=True)
    assert guides.main(["--docs", str(guide.parent), "--bench", str(BENCH), "--check"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "odd.md" in err and "lm.nonesuch" in err


def test_a_marker_without_its_end_is_an_error(tmp_path):
    guide = tmp_path / "docs" / "open.md"
    guide.parent.mkdir()
    guide.write_text(guides.marker("lm.throughput") + "\n| a |\n")
    with pytest.raises(ValueError, match="open.md: table 'lm.throughput' has no"):
        guides.update_guides(guide.parent, BENCH, check=True)


def test_markdown_table_writes_numbers_as_format_table_does():
    text = guides.markdown_table([[1024, 0.00641, 51054.2, None, ""]], ["a", "b", "c", "d", "e"])
    assert text.splitlines() == ["| a | b | c | d | e |", "|---|---|---|---|---|", "| 1024 | 0.00641 | 51,054 | — | |"]


# --- the result tables generated in issue 84, item 5 -------------------------------------------------------------

def _bench_with(tmp_path: Path, *files: str) -> Path:
    """A bench folder holding copies of the named JSON files of docs/bench."""
    bench = tmp_path / "bench"
    for f in files:
        (bench / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(BENCH / f, bench / f)
    return bench


def _cells(table: str, first: str):
    """The cells of the table's row whose first cell is ``first``."""
    rows = [[c.strip() for c in line.split("|")[1:-1]] for line in table.splitlines() if line.startswith("|")]
    return next(r for r in rows if r[0] == first)


def _edit(path: Path, change) -> None:
    payload = json.loads(path.read_text())
    change(payload)
    path.write_text(json.dumps(payload))


def test_the_eo_quality_median_is_over_every_seed_the_json_holds(tmp_path):
    bench = _bench_with(tmp_path, *_sources("eo.quality"))
    label = "TSViT (published date encoding)"
    assert _cells(_make("eo.quality", bench), label)[1:5] == ["AA · AA", "2e-3", "39.4 / 51.6 / 42.7 / 44.7", "43.7"]

    def drop_tsvit(payload):
        payload["quality"]["rows"] = [r for r in payload["quality"]["rows"] if r["spec"] != "tiny-tsvit"]

    _edit(bench / "eo_seed3/eo.json", drop_tsvit)
    assert _cells(_make("eo.quality", bench), label)[3:5] == ["39.4 / 51.6 / 42.7", "42.7"]


def test_a_seed_folder_is_read_at_seed_0s_chosen_rate_not_at_its_own_best(tmp_path):
    """The other seeds run at the rate seed 0's sweep chose; a seed folder's row at another rate (an earlier choice),
    even where it scores better there, is not the model's figure — as `bench parity` reads the seeds."""
    bench = _bench_with(tmp_path, *_sources("points.quality"))
    label = "hybrid (preset)"
    assert _cells(_make("points.quality", bench), label)[2:6] == ["3e-3 (4)", "27.0 / 24.7 / 22.5", "24.7",
                                                                "25.2 / 22.6 / 20.8"]

    def better_elsewhere(payload):  # seed 1 at 6e-3 best in its own folder
        for r in payload["quality"]["rows"]:
            if r["spec"] == "tiny-ppomv3-hybrid":
                r["best_lr"], r["val_miou"] = r["lr"] == 0.006, 0.30 if r["lr"] == 0.006 else r["val_miou"]

    _edit(bench / "points_seed1/points.json", better_elsewhere)
    assert _cells(_make("points.quality", bench), label)[3:6] == ["27.0 / 24.7 / 22.5", "24.7", "25.2 / 22.6 / 20.8"]

    def drop_chosen(payload):  # no run at the chosen rate: the seed is not shown
        payload["quality"]["rows"] = [r for r in payload["quality"]["rows"]
                                      if not (r["spec"] == "tiny-ppomv3-hybrid" and r["lr"] == 0.003)]

    _edit(bench / "points_seed2/points.json", drop_chosen)
    assert _cells(_make("points.quality", bench), label)[3:5] == ["27.0 / 24.7", ""]


def test_image_every_digit_divides_a_median_by_sit_s_with_the_same_positions(tmp_path):
    bench = _bench_with(tmp_path, *_sources("image.every_digit"))
    table = _make("image.every_digit", bench)
    assert _cells(table, "value PoM (`tiny-sipom-value`)")[4:] == ["39.9", "1.15×"]
    assert _cells(table, "SiPoM (`tiny-sipom`)")[1:] == ["1e-3", "77.5", "77.5", "", ""], "one seed: no median"

    def rotary_sit_at(fd):
        return lambda payload: [r.update(fd=fd) for r in payload["quality"]["rows"]
                                if r["model"] == "tiny-sit+position=sincos_rope"]

    for seed in (1, 2):  # the rotary SiT's median moves to the rotary value PoM's: only that ratio follows
        _edit(bench / f"image_seed{seed}/image.json", rotary_sit_at(35.5669))
    table = _make("image.every_digit", bench)
    assert _cells(table, "value PoM, `position=sincos_rope`")[5] == "1.00×"
    assert _cells(table, "value PoM (`tiny-sipom-value`)")[5] == "1.15×"


def test_ocr_recipe_gives_each_cer_against_htr_vt_s_at_the_recipe_rate(tmp_path):
    bench = _bench_with(tmp_path, "ocr.json")
    figures = {"tiny HTR-VT": (0.04, 0.2), "tiny hybrid": (0.03, 0.1), "tiny HTR-VPoM": (0.05, 0.3)}

    def digits(payload):
        for r in payload["quality"]["rows"]:
            if r["task"] == "digits" and r["lr"] == 1e-3:
                r["cer"], r["wer"] = figures[r["model"]]

    _edit(bench / "ocr.json", digits)
    assert _cells(_make("ocr.recipe", bench), "handwritten digit lines (600 test lines)")[1:] == [
        "300 × 32 lines", "**4.00%** / 20.0%", "3.00% (−25.0%) / 10.0%", "5.00% (+25.0%) / 30.0%"]


def test_the_recall_tables_name_a_shared_figure_once_and_bold_the_picked_rate():
    recipe = _make("recall.recipe", BENCH)  # hybrid-LV / -shift tried 4 / 5 rates: no shared count
    assert _cells(recipe, "hybrid-LV / hybrid-LV-shift")[1:] == ["16,704", "5e-4 / 2.5e-4", "0.0786 / 0.0783", "3"]
    assert _cells(recipe, "value PoM 1k / 4k / 16k")[1:] == ["1,104 / 4,256 / 16,704", "4e-3 / 1e-3 / 2e-3",
                                                             "0.9678 / 0.9997 / 1.0000", "1 / 2 / 3"]
    mixture = _make("recall.mixture", BENCH)
    assert _cells(mixture, "Based (1,081)")[1:3] == ["3e-3 / 3e-2 / 1e-1", "0.050 / **0.682** / 0.673"]
    assert _cells(mixture, "value PoM (1,104)")[1:3] == ["3e-3", "0.750"], "one rate: nothing bold"


def test_the_h200_tables_dash_what_was_not_run():
    forward = _make("gpu.h200_forward", BENCH)
    assert _cells(forward, "1,024")[-1] == "0.77× / 0.53×", "SDPA's forward ms over the triton route's"
    assert _cells(forward, "65,536")[-2:] == ["— / —", "— / —"], "no SDPA at 65,536"
    assert _cells(_make("gpu.h200_backward", BENCH), "65,536")[5] == "— / —"


def test_the_traffic_table_is_traffic_py_s_own_table_of_its_json(tmp_path):
    from polymixer.experiments.bench import traffic

    gpu_sources = {f for name, table in guides.tables().items() if name.startswith("gpu.") for f in table.sources}
    bench = _bench_with(tmp_path, *gpu_sources)
    rows = json.loads((bench / "traffic.json").read_text())
    assert _make("gpu.traffic", bench) == traffic.table(rows)
    causal = _cells(_make("gpu.traffic", bench), "causal")
    assert causal[3:7] == ["4", "4", "7", "7"], "the chunk-parallel causal kernels: 4 forward, 7 backward passes"

    rows[0]["forward"]["passes"] = 5.0
    (bench / "traffic.json").write_text(json.dumps(rows))
    guide = _copy_guide(tmp_path, "gpu.md")
    assert guides.update_guides(guide.parent, bench, check=True) == [("gpu.md", "gpu.traffic")]
    assert _cells(_make("gpu.traffic", bench), "causal")[3:5] == ["5", "4"], "counted 5 against the model's 4"


def test_the_prose_lm_table_compares_each_size_with_attentions_best_form_at_that_size(tmp_path):
    """lm.prose: every rate a model ran (its best bold), attention's best form (with or without the shift) the
    reference, a larger model against the larger attention, smaller models first."""
    def row(spec, lr, loss):
        return {"spec": spec, "lr": lr, "val_loss": loss, "params": 1000}

    rows = [row("tiny-pom+block_size=1024", 0.008, 2.0), row("tiny-attention+block_size=1024", 0.004, 1.6),
            row("tiny-attention+block_size=1024+attention_shift=4", 0.004, 1.5),
            row("tiny-attention+block_size=1024", 0.008, 1.7),
            row("tiny-pom+block_size=1024+n_embd=256", 0.004, 1.8) | {"smaller": "tiny-pom+block_size=1024"},
            row("tiny-attention+block_size=1024+n_embd=256", 0.002, 1.2)
            | {"smaller": "tiny-attention+block_size=1024"}]
    # the training curves: PoM's gap to the shifted attention opens, 0% → +10% → +20% → +30% (steps 10 … 40)
    rows[0]["train_curve"] = [[10, 3.0], [20, 2.2], [30, 1.8], [40, 1.3]]
    rows[2]["train_curve"] = [[10, 3.0], [20, 2.0], [30, 1.5], [40, 1.0]]
    (tmp_path / "lm_prose").mkdir()
    (tmp_path / "lm_prose" / "lm.json").write_text(json.dumps({"quality": {"rows": rows}}))
    lines = _make("lm.prose", tmp_path).splitlines()
    assert lines[0] == ("| model | params | 2e-3 | 4e-3 | 8e-3 | best vs attention's best form "
                        "| training loss vs it at ¼ · ½ · ¾ · end |")
    assert [line.split(" | ")[0] for line in lines[2:]] == [
        "| `tiny-attention+block_size=1024`", "| `tiny-attention+block_size=1024+attention_shift=4`",
        "| `tiny-pom+block_size=1024`", "| `tiny-attention+block_size=1024+n_embd=256`",
        "| `tiny-pom+block_size=1024+n_embd=256`"]
    assert lines[2].endswith("| | **1.6000** | 1.7000 | +6.7% | — |")  # plain attention against its shifted form
    assert lines[3].endswith("— (the reference) | |")  # (a row without a curve: "—")
    assert lines[4].endswith("| +33.3% | +0.0% · +10.0% · +20.0% · +30.0% |")
    assert lines[6].endswith("| | **1.8000** | | +50.0% | — |")  # against the larger attention


def test_the_why_table_puts_bytes_and_tokens_side_by_side_and_names_each_run_not_on_file(tmp_path):
    """lm.why: bits per byte against full attention at the same budget (test where both runs have it, else
    validation, marked), the PoM in the paper's form unless only polymixer's ran (then named), the n-gram's best; a
    run not on file reads "not run" and is listed with its command — at the rate its model chose at the comparison's
    budget — and its minutes estimated from the measured train minutes per step."""
    from polymixer.experiments.lm.tables import WHY_LOCAL, WHY_NGRAM, WHY_SHIFT

    att, pom, ours = "tiny-attention+block_size=1024", "tiny-pom-paper+block_size=1024", "tiny-pom+block_size=1024"

    def write(name, rows, part="quality", config=None):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(json.dumps({part: {"rows": rows} | ({"config": config} if config else {})}))

    def row(spec, steps, bpb, lr=0.004, test=None, minutes=None):
        return {"spec": spec, "steps": steps, "val_bpb": bpb, "lr": lr, "best_lr": True, "params": 1000,
                **({"test_bpb": test} if test else {}), **({"train_min": minutes} if minutes else {})}

    write("lm_prose/lm.json", [row(att, 375, 2.0, minutes=37.5), row(ours, 375, 2.6, 0.008, minutes=30.0)],
          config={"quality_lr": 0.002})
    write("lm_why/bytes_94/lm.json", [row(att, 94, 2.5, 0.004), row(ours, 94, 2.5, 0.016)])
    write("lm_tokens/lm.json", [row(att, 235, 1.9, test=1.8, minutes=23.5), row(pom, 235, 2.2, test=2.16)])
    write("lm_why/tokens_235/lm.json", [row(WHY_LOCAL, 235, 2.0, test=1.98)])
    write(WHY_NGRAM, [{"tokenizer": t, "order": k, "val_bpb": v + 0.01, "test_bpb": v}
                      for t, vs in (("bytes", (4.5, 2.0, 1.9)), ("prose-bpe-4096", (2.8, 1.7, 1.75)))
                      for k, v in enumerate(vs)], part="ngram")
    lines = _make("lm.why", tmp_path).splitlines()
    assert lines[0] == ("| bits per byte (gap to full attention) | bytes, context 1,024 bytes "
                        "| BPE 4,096 tokens, context 1,024 tokens |")
    cells = {line.split(" | ")[0][2:]: line.split(" | ")[1:] for line in lines[2:10]}
    assert cells["n-gram baseline, best of 0–5 tokens of context (test)"] == [
        "1.900 (order 2; validation 1.910)", "1.700 (order 1; validation 1.710) |"]
    assert cells[f"full attention (`{att}`), the comparison's budget"] == ["2.000 val", "1.800 |"]
    local = cells["attention over the last 8 positions (`+mixer=L+window=8`) against full"]
    assert local == ["not run", "+10.0% (1.980 against 1.800) |"]
    quarter, one, four = (cells[f"the paper's PoM (`{pom}`) against full attention, {f}× the budget ({s} steps)"]
                          for f, s in (("0.25", "94 / 59"), ("1", "375 / 235"), ("4", "1,500 / 940")))
    assert quarter == ["+0.0% (2.500 against 2.500 val), as `tiny-pom`", "not run |"]
    assert one == ["+30.0% (2.600 against 2.000 val), as `tiny-pom`", "+20.0% (2.160 against 1.800) |"]
    assert four == ["not run", "not run |"]
    shifted = cells[f"the paper's PoM with a short token shift (`{WHY_SHIFT}`) against full attention"]
    assert shifted == ["not run", "not run |"]
    folders = {line[2:].split(": `")[0]: line for line in lines if line.startswith("- docs/bench/")}
    todo = ["- `" + c for line in folders.values() for c in line.split(": `", 1)[1].split("; `")]
    # the local attention at full attention's chosen rate (4e-3 = 2 × the recipe's 2e-3); minutes per step measured
    assert (f"- `polymixer bench lm --parts quality --corpus prose --quality-steps 375 --presets {WHY_LOCAL} "
            f"--sweep {WHY_LOCAL} --lr-factors 2 --out docs/bench/lm_why/bytes_375` (~38 min)") in todo
    assert (f"- `polymixer bench lm --parts quality --corpus prose --quality-steps 1500 --presets {ours} "
            f"--sweep {ours} --lr-factors 4 --out docs/bench/lm_why/bytes_1500` (~120 min)") in todo
    # tokens: the PoM's rate not chosen (no rate in its row) reads as a sweep of three; minutes from lm_tokens' own
    assert any(c.startswith(f"- `polymixer bench lm --parts quality --corpus prose --tokenizer prose-bpe-4096 "
                            f"--quality-batch 16 --quality-steps 59 --presets {att} ") for c in todo)
    assert f"--quality-steps 59 --presets {pom} --sweep {pom} --lr-factors 2 --out docs/bench/lm_why/tokens_59` " \
           "(~6 min)" in "\n".join(todo)
    # the shifted PoM at the paper's PoM's chosen rate (tokens: 4e-3) or, none chosen (bytes), a sweep of three
    assert (f"--quality-steps 235 --presets {WHY_SHIFT} --sweep {WHY_SHIFT} --lr-factors 2 "
            "--out docs/bench/lm_why/tokens_235` ") in "\n".join(todo)
    assert f"--presets {WHY_SHIFT} --sweep {WHY_SHIFT} --lr-factors 1 2 4 --out docs/bench/lm_why/bytes_375` " \
           in "\n".join(todo)
    assert len(todo) == 9 and lines[-6].startswith("Not run yet (9 commands, ~")  # one line a folder
    assert sorted(folders) == [f"docs/bench/lm_why/{f}" for f in ("bytes_1500", "bytes_375", "tokens_235",
                                                                   "tokens_59", "tokens_940")]
    # without the measured token runs, a token run's minutes scale the byte runs' by tokens a step and parameters
    (tmp_path / "lm_tokens" / "lm.json").unlink()
    text = _make("lm.why", tmp_path)
    assert "--tokenizer prose-bpe-4096 --quality-steps 235 --quality-batch 16 --presets " in text  # its own sweep
    # 0.1 min a step × 16 / 32 windows × (1,000 + the BPE's 491,392 parameters) / 1,000 × 59 steps × 3 rates
    assert (f"--quality-steps 59 --presets {att} --sweep {att} --lr-factors 1 2 4 --out docs/bench/lm_why/tokens_59` "
            f"(~{0.1 * 0.5 * 492.392 * 59 * 3:.0f} min)") in text


def test_the_why_tables_commands_are_commands_the_cli_takes_and_build_their_models():
    """Every command lm.why lists for the committed results parses with polymixer's parser, and each model it names
    builds (local attention over the last 8 positions in every layer included); the shifted PoM's P layers have the
    shift, which a model's token_shift (the value PoM's) does not give them."""
    import shlex

    from polymixer.experiments.bench.common import parse_variant
    from polymixer.experiments.cli import build_parser
    from polymixer.models import create_model
    from polymixer.models.registry import check_overrides

    text = _make("lm.why", BENCH)
    commands = [c.split("` (~")[0] for line in text.splitlines() if line.startswith("- docs/bench/")
                for c in line.split(": `", 1)[1].split("; `")]
    assert commands
    for command in commands:
        args = build_parser().parse_args(shlex.split(command)[1:])
        assert args.noun == "lm" and args.out.startswith("docs/bench/lm_")
        for spec in args.sweep:
            preset, overrides = parse_variant(spec)
            check_overrides(preset, overrides)
    preset, overrides = parse_variant("tiny-attention+block_size=1024+mixer=L+window=8")
    assert create_model(preset, device="meta", **overrides).pattern == "LLLL"
    assert any("+pom_shift=4 " in c for c in commands)
    preset, overrides = parse_variant("tiny-pom-paper+block_size=1024+pom_shift=4")
    model = create_model(preset, device="meta", **check_overrides(preset, overrides).__dict__)
    assert {m.shift_width for m in model.modules() if type(m).__name__ == "PoM"} == {4}
    with pytest.raises(ValueError, match="token_shift=4 is taken by no mixer of this model"):
        check_overrides(*parse_variant("tiny-pom-paper+block_size=1024+token_shift=4"))
    with pytest.raises(ValueError, match="pom_shift=4 is taken by no mixer of this model"):
        check_overrides(*parse_variant("tiny-attention+block_size=1024+pom_shift=4"))


def test_the_claims_table_leaves_out_a_paper_target_not_run(tmp_path):
    """A paper's model not run has no figure (its verdict may still carry a clause, e.g. "not run; undertrained: …"):
    the claims table skips it instead of failing, and keeps the targets that ran."""
    from polymixer.experiments import guides

    ran = {"what": "the paper's tiny-pom within +18.0% (the paper: +17.9%)", "measured": "tiny-pom +3.7% (1 seed)",
           "verdict": "unsettled: 1 paired seed (an interval needs 2)"}
    idle = {"what": "the paper's tiny-hybrid within +2.0% (the paper: +0.6%)", "measured": None,
            "verdict": "not run; undertrained: tiny-attention 1.99 bits per byte against the n-gram's 1.71"}
    (tmp_path / "parity.json").write_text(json.dumps({"families": [{"family": "lm", "targets": [ran, idle]}]}))
    table = guides.parity_claims(tmp_path)
    assert "`tiny-pom`" in table and "+3.7% (1 seed)" in table and "| unsettled |" in table
    assert "tiny-hybrid" not in table
