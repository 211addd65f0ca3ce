"""`speedsplit failed`: which runs are re-measured, and setting them aside without
ever losing a result or its request records."""

from pathlib import Path

import pytest
from records import fake_result, write_result

from speedsplit.output import failed


def bench_tree(root: Path) -> dict[int, Path]:
    """A capacity ladder of vllm-fp16: 16 passed, 32 failed, 64 skipped past it."""
    paths = {}
    for users, status in ((16, "ok"), (32, "server_died"), (64, "skipped")):
        res = fake_result("vllm-fp16", users, 0, 100.0 if status == "ok" else None, status=status)
        res.job.cell.capacity_below = [f"u{u}-wide-greedy" for u in (16, 32) if u < users]
        path = root / "bench/tiny/vllm-fp16/tp1" / f"u{users}-wide-greedy" / "run0.json"
        paths[users] = write_result(path, res)
        path.with_name("run0.requests.jsonl").write_text(f'{{"user": {users}}}\n')
    return paths


def test_a_skipped_level_is_no_failure_but_is_judged_again_after_the_levels_below(tmp_path):
    paths = bench_tree(tmp_path)
    found = failed.failed_results(tmp_path / "bench")
    assert [p for p, _ in found] == [paths[32]]  # skipped is not failed
    assert failed.skipped_above(tmp_path / "bench", [paths[32]]) == [(paths[64], "skipped past levels now re-measured")]
    assert failed.skipped_above(tmp_path / "bench", []) == []


def test_two_reruns_in_one_second_get_folders_of_their_own(tmp_path):
    a, b = failed.aside_folder(tmp_path), failed.aside_folder(tmp_path)
    assert a != b and a.is_dir() and b.is_dir() and a.parent == b.parent == tmp_path / "failed"


def test_an_interrupted_move_loses_no_result_and_no_records(tmp_path, monkeypatch):
    """Interrupted between the result and its records (here: Ctrl-C as the records are removed):
    the result is set aside with its records, and the records still in results are the same
    file, so the rerun that replaces them loses nothing."""
    paths = bench_tree(tmp_path)
    into = failed.aside_folder(tmp_path)
    real_unlink = Path.unlink

    def interrupted(self, *a, **kw):
        if self.name.endswith(".requests.jsonl"):
            raise KeyboardInterrupt
        return real_unlink(self, *a, **kw)

    monkeypatch.setattr(Path, "unlink", interrupted)
    with pytest.raises(KeyboardInterrupt):
        failed.move_aside([paths[32]], tmp_path, into)
    monkeypatch.undo()
    aside = into / paths[32].relative_to(tmp_path)
    assert not paths[32].exists() and aside.exists()  # the result: set aside, so it is re-measured
    assert aside.with_name("run0.requests.jsonl").read_text() == '{"user": 32}\n'  # its records went with it
    failed.move_aside([paths[16]], tmp_path, into)  # an uninterrupted move leaves nothing behind
    assert not paths[16].exists() and not paths[16].with_name("run0.requests.jsonl").exists()
    assert (into / paths[16].relative_to(tmp_path)).with_name("run0.requests.jsonl").exists()
