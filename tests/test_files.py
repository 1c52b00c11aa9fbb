"""Atomic writes (polymixer.files): whole or nothing, and writers of the same file at once never collide; a run
folder's claim (polymixer.experiments.locks) held by one process at a time and ended with it."""

import json
import subprocess
import sys
import threading

import pytest

from polymixer.experiments.bench.common import write_json
from polymixer.experiments.locks import claimed
from polymixer.files import atomic_path, write_text_atomic


def test_a_second_writer_finishing_inside_the_first_leaves_both_working(tmp_path):
    # benches sharing a sweep write the same JSON; a fixed temporary name made the slower writer's rename fail
    target = tmp_path / "bench.json"
    with atomic_path(target) as mine:
        mine.write_text("first")
        write_text_atomic(target, "second")  # another process, start to end, while the first is still writing
        assert target.read_text() == "second"
    assert target.read_text() == "first"  # the last to finish wins, whole
    assert [p.name for p in tmp_path.iterdir()] == ["bench.json"]  # no temporary left behind


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path):
    target = tmp_path / "figure.png"
    target.write_bytes(b"old")
    with pytest.raises(RuntimeError):
        with atomic_path(target) as tmp:
            assert tmp.suffix == ".png" and tmp.parent == tmp_path  # writers that pick a format by extension
            tmp.write_bytes(b"half")
            raise RuntimeError("disk full")
    assert target.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["figure.png"]


def test_many_threads_writing_one_report_each_see_no_error(tmp_path):
    target = tmp_path / "sub" / "eo.json"
    errors = []

    def writer(i: int) -> None:
        try:
            for j in range(30):
                write_json(target, {"writer": i, "round": j})
        except Exception as e:  # pragma: no cover - the failure being tested for
            errors.append(e)

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert set(json.loads(target.read_text())) == {"writer", "round"}
    assert [p.name for p in target.parent.iterdir()] == ["eo.json"]


def test_a_part_written_by_another_process_meanwhile_is_kept(tmp_path):
    # a learning-curve run beside a quality sweep of the same bench: each used to write back the file as it was when
    # it started, so whichever finished last erased the other's part
    from dataclasses import dataclass, field

    from polymixer.experiments.bench.common import run_parts

    @dataclass
    class Cfg:
        parts: tuple = field(default_factory=tuple)

    path = tmp_path / "eo.json"
    path.write_text(json.dumps({"speed": {"rows": ["old speed"]}, "curves": {"rows": ["old curves"]}}))

    def curves(cfg, progress):
        return {"rows": ["new curves"]}

    def quality(cfg, progress):
        run_parts(Cfg(("curves",)), path, {"speed": None, "quality": None, "curves": curves}, False)  # meanwhile
        return {"rows": ["quality"]}

    out = run_parts(Cfg(("quality",)), path, {"speed": None, "quality": quality, "curves": curves}, False)
    saved = json.loads(path.read_text())
    assert saved["curves"]["rows"] == ["new curves"] and saved["quality"]["rows"] == ["quality"]
    assert saved["speed"]["rows"] == ["old speed"] and out["curves"]["rows"] == ["new curves"]


def test_a_bench_file_that_is_not_json_stops_the_bench_before_it_trains(tmp_path):
    from dataclasses import dataclass, field

    from polymixer.experiments.bench.common import run_parts

    @dataclass
    class Cfg:
        parts: tuple = field(default_factory=tuple)

    path = tmp_path / "eo.json"
    path.write_text('{"quality": {"rows": [')  # cut short
    ran = []
    with pytest.raises(ValueError, match=r"eo\.json: not valid JSON"):
        run_parts(Cfg(("quality",)), path, {"quality": lambda cfg, progress: ran.append(1) or {"rows": []}}, False)
    assert ran == [] and path.read_text() == '{"quality": {"rows": ['  # nothing trained, nothing overwritten


def test_the_lock_excludes_a_second_holder(tmp_path):
    from filelock import FileLock, Timeout

    from polymixer.experiments.locks import locked

    target = tmp_path / "lm.json"
    with locked(target):
        with pytest.raises(Timeout):
            FileLock(str(tmp_path / ".lm.json.lock"), timeout=0.05).acquire()  # another process's attempt
    FileLock(str(tmp_path / ".lm.json.lock"), timeout=0.05).acquire()  # free again once the block ends


def test_a_run_folder_is_claimed_by_one_holder_and_freed_when_its_process_dies(tmp_path):
    run = tmp_path / "quality" / "tiny-vpom-lr0.002"
    with claimed(run) as mine:
        with claimed(run) as other:  # a second holder's attempt answers at once
            assert mine and not other
    with claimed(run) as again:
        assert again  # free once the block ends
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time\n"
                               "from polymixer.experiments.locks import claimed\n"
                               f"with claimed({str(run)!r}) as mine:\n    print(mine, flush=True)\n"
                               "    time.sleep(600)"], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "True"
        with claimed(run) as mine:
            assert not mine  # held by a live process
    finally:
        holder.kill()  # killed with the claim held: no stale claim to clear by hand
        holder.wait()
    with claimed(run) as mine:
        assert mine
