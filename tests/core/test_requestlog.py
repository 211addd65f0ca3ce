"""Request records: the columnar form committed evidence keeps reads back exactly what the
JSON lines held, and one reader takes every form."""

import gzip
import json

from speedsplit.core.requestlog import RequestRecord, pack, read_requests, requests_path


def records() -> list[dict]:
    ok = dict(user=0, index=0, phase="measured", url="http://127.0.0.1:1", sent=0.1234567890123, first_token=0.2)
    ok.update(end=1.0000000000000002, gaps=[0.0029313400000319234, 1e-300, 0.1], prompt_tokens=32, output_tokens=3)
    failed = dict(user=1, index=2, phase="warmup", url="http://127.0.0.1:2", sent=5e-7, error="http_503", detail="x")
    return [ok, failed, {**ok, "user": 2, "gaps": [], "chunks": 7}]


def test_packing_keeps_every_bit_and_the_reader_takes_every_form(tmp_path):
    lines = "\n".join(json.dumps(r) for r in records()) + "\n"
    (tmp_path / "run0.json").write_text("{}")
    (tmp_path / "run0.requests.jsonl.gz").write_bytes(gzip.compress(lines.encode()))
    (tmp_path / "run1.requests.jsonl").write_text(lines)
    expected = [RequestRecord(**r) for r in records()]
    assert requests_path(tmp_path / "run0.json").name == "run0.requests.jsonl.gz"
    for name in ("run0.requests.jsonl.gz", "run1.requests.jsonl"):
        packed = pack(tmp_path / name)
        assert not (tmp_path / name).exists() and packed.suffix == ".parquet"
        back = read_requests(packed)
        assert back == expected
        assert [r.gaps for r in back][0][0] == 0.0029313400000319234  # not rounded to the microsecond
    assert requests_path(tmp_path / "run0.json").name == "run0.requests.parquet"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run0.json", "run0.requests.parquet", "run1.requests.parquet"]


def test_the_lines_the_bench_job_writes_win_over_a_packed_copy(tmp_path):
    (tmp_path / "run0.requests.parquet").write_bytes(b"")
    (tmp_path / "run0.requests.jsonl").write_text("")
    assert requests_path(tmp_path / "run0.json").name == "run0.requests.jsonl"
