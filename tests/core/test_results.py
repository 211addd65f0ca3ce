import json

from speedsplit.core import results


def test_secret_looking_names():
    secret = ["HF_TOKEN", "OPENAI_API_KEY", "AWS_SECRET_ACCESS_KEY", "DB_PASSWORD", "--api-key", "--hf-token"]
    plain = ["tokenizer", "output_tokens", "kv_cache_tokens", "TOKENIZERS_PARALLELISM", "keyboard", "--max-num-seqs"]
    assert all(results.looks_secret(n) for n in secret)
    assert not any(results.looks_secret(n) for n in plain)


def test_redact_removes_secret_values_options_and_home(monkeypatch, tmp_path):
    monkeypatch.setenv("MY_SERVICE_API_KEY", "s3cr3t-value-xyz")
    monkeypatch.setenv("SOME_TOKEN", "true")  # too plain to search for
    text = (
        "serve --api-key abc --hf-token=def --tokenizer tok --max-num-seqs 8 "
        "env MY_SERVICE_API_KEY=s3cr3t-value-xyz hf_abcdefghijklmnopqrstuvwxyz0 ok true"
    )
    out = results.redact(text)
    for leaked in ("abc", "def", "s3cr3t-value-xyz", "hf_abcdefghij"):
        assert leaked not in out.split(), out
    assert "--tokenizer tok" in out and "--max-num-seqs 8" in out and out.endswith("ok true")
    assert results.redact_env({"HF_TOKEN": "x", "OMP_NUM_THREADS": "2"}) == {
        "HF_TOKEN": "<redacted>",
        "OMP_NUM_THREADS": "2",
    }


def _write_under_a_size_limit(target, q):
    import resource
    import signal

    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # as a bench job does: EFBIG instead of death
    resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))
    try:
        results.write_json_atomic(target, {"big": "x" * 100_000})
        q.put("written")
    except OSError as exc:
        q.put(f"OSError {exc.errno}")


def test_a_write_that_fails_leaves_the_old_file_and_no_temp(tmp_path):
    import multiprocessing as mp

    target = tmp_path / "r.json"
    results.write_json_atomic(target, {"a": 1})
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    p = ctx.Process(target=_write_under_a_size_limit, args=(target, q))
    p.start()
    p.join(30)
    assert q.get(timeout=5) == "OSError 27"  # EFBIG: the file-size limit stands in for a full disk
    assert json.loads(target.read_text()) == {"a": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]
