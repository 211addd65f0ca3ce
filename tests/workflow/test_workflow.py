"""The workflow itself: the whole DAG on the tiny model (CPU) with real servers, then an
incremental rerun and the report in a real browser (the dry runs: test_dry_runs.py)."""

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from conftest import PLANTED_TOKEN, REPO, planned_outputs, run_snakemake, snakemake_bin

from speedsplit.core.record import read_result
from speedsplit.core.specs import BenchJob
from speedsplit.serving import session_state
from speedsplit.serving.vllm_cpu import cpu_int4_route


@pytest.fixture(scope="module")
def workdir(local_run):
    """The whole DAG, run once on tests/config/ci.yaml in a fresh folder (conftest)."""
    return local_run


@pytest.mark.slow
def test_each_step_says_its_quality_beside_its_speed(workdir):
    """The trained tiny model's quality through each stack of the chain (quality: on by default):
    each stack probed once, after its last cell of run 0, saying what it serves; each chain step
    with its agreement, and the INT4 step with next-token agreement and a perplexity ratio."""
    import polars as pl

    probed = [read_result(p) for p in sorted((workdir / "results/bench").rglob("run*.json"))]
    probed = [r for r in probed if r.quality is not None]
    assert sorted((r.stack, r.cell, r.run) for r in probed) == [
        (s, "u2-ci-narrow-greedy", 0) for s in ("hf-fp16", "vllm-fp16", "vllm-marlin")
    ]
    assert all(r.weights.weights == "trained" and r.quality.status == "ok" for r in probed)
    stacks = {r["stack"]: r for r in pl.read_csv(workdir / "results/tables/quality_stacks.csv").iter_rows(named=True)}
    # transformers serve refuses token ids (HTTP 422) and ignores logprobs and echo: agreement by
    # text, no perplexity
    hf = stacks["hf-fp16"]
    assert hf["serves_token_ids"].startswith("no: HTTP 422") and hf["serves_logprobs"] == "no: none in the stream"
    assert hf["serves_prompt_logprobs"].startswith("no: ") and hf["perplexity"] is None
    for s in ("vllm-fp16", "vllm-marlin"):
        assert stacks[s]["serves_prompt_logprobs"] == "yes" and stacks[s]["tokens_scored"] == 8 * 127
        assert 1 < stacks[s]["perplexity"] < 1024  # a trained model: far below the vocabulary
    steps = {r["to_stack"]: r for r in pl.read_csv(workdir / "results/tables/quality.csv").iter_rows(named=True)}
    assert steps["vllm-fp16"]["compared_by"] == "texts re-tokenized" and steps["vllm-fp16"]["same_weights"]
    int4 = steps["vllm-marlin"]
    assert int4["compared_by"] == "token ids" and int4["prompts"] == 16 and int4["reference"] == "vllm-fp16"
    assert 0.5 < int4["next_token_agreement"] <= 1 and int4["perplexity_ratio_lo"] <= int4["perplexity_ratio"]
    assert int4["speed_factor"] is not None and int4["passes"] in (True, False)
    # task accuracy (ci.yaml: lm-evaluation-harness, 8 questions of the shipped task): the vLLM
    # stacks scored, transformers serve not (it serves no prompt logprobs), each step says so
    tasks = {r["to_stack"]: r for r in pl.read_csv(workdir / "results/tables/quality_tasks.csv").iter_rows(named=True)}
    assert tasks["vllm-marlin"]["task"] == "python_next_line" and tasks["vllm-marlin"]["samples"] == 8
    assert tasks["vllm-marlin"]["difference"] is not None and tasks["vllm-marlin"]["difference_lo"] is not None
    assert tasks["vllm-fp16"]["from_value"] is None and "hf-fp16: lm-eval failed" in tasks["vllm-fp16"]["note"]
    assert "serves no prompt logprobs" in tasks["vllm-fp16"]["note"]
    said = (workdir / "snakemake.out").read_text()
    assert "quality, study (tiny, tp1): runtime: " in said and "INT4 weights + kernel: " in said
    assert "python_next_line acc " in said


@pytest.mark.slow
def test_every_result_is_complete_and_honest(workdir):
    results = sorted((workdir / "results/bench").rglob("run*.json"))
    assert len(results) == 3 * 2 * 2  # stacks x cells x runs
    served, unsampled = [], []
    for path in results:
        res = read_result(path)
        assert res.status == "ok", (path, res.server)
        s = res.summary
        assert s.failed == 0 and s.wrong_output_length == 0 and s.wrong_prompt_length == 0
        assert s.output_tok_s > 0
        assert res.provenance.versions["transformers"]
        requests = path.with_name(path.stem + ".requests.jsonl").read_text().splitlines()
        assert len(requests) == s.requests + res.job.cell.users * res.job.cell.warmup_requests
        tel = res.telemetry  # vLLM CPU's real /metrics; no GPU here, no /metrics on the HF server
        assert tel.gpu is None and tel.gpu_absent == "no GPU: the run was on the CPU"
        if res.stack.startswith("vllm") and tel.server is None:
            # a measured phase of 0.2-0.4 s can pass between two readings when the CPU is busy
            # (one /metrics answer took longer than the phase); the result then says so
            assert tel.server_absent.startswith("no sample inside the measured phase"), (path, tel)
            unsampled.append(res.stack)
        elif res.stack.startswith("vllm"):
            assert tel.server.samples >= 1 and 0 <= tel.server.kv_cache_usage_peak <= 1, (path, tel)
            assert tel.server.prefix_cache_hits_flagged is False  # distinct prompts reuse nothing
            served.append(tel.server)
        else:
            assert tel.server is None and "/metrics" in tel.server_absent
        assert res.slo.ttft_p99_s == 2.0 and 0 < res.slo.good_requests <= s.requests
        if res.stack == "vllm-marlin":
            # vLLM's CPU build has no Marlin: the GPTQ model runs on its CPU int4 kernel, and the
            # result says so
            assert res.engine.linear_kernel == cpu_int4_route()[0] and res.kernel_ok is True
    assert len(unsampled) <= 2, unsampled  # of 8 vLLM runs: most have readings
    # a reading can fall before the server took the phase's first requests (KV use 0), but
    # across the runs the counters show requests being served
    assert max(t.kv_cache_usage_peak for t in served) > 0 and max(t.running_mean for t in served) > 0
    reused = [read_result(p).server.reused for p in results]
    assert reused.count(False) == 3  # one server start per stack (server_reuse: per_stack)
    # one compile-cache folder per stack, shared (nothing else held it): three keys
    caches = {read_result(p).server.compile_cache_dir for p in results}
    assert len(caches) == 3 and all(c.startswith("shared ") for c in caches), caches
    folders = {p.name for p in (workdir / "results/cache/shared").iterdir() if p.is_dir()}
    # + vLLM's model inspection, engine-wide, and the coordination profile's server's (its
    # profiler arguments make another key)
    assert {c[7:] for c in caches} | {"modelinfos"} < folders and len(folders) == 5, folders
    # vLLM wrote its model inspection once, into the engine-wide folder every cache reads (the
    # coordination profile's server too: it inspected nothing again)
    assert list((workdir / "results/cache/shared/modelinfos").glob("*/*.json"))
    inspections = [p for p in (workdir / "results/cache").rglob("modelinfos") if not p.is_symlink()]
    assert inspections == [workdir / "results/cache/shared/modelinfos"], inspections
    quant = json.loads((workdir / "results/quantize/tiny/gptq-w4g128.json").read_text())
    assert quant["method"] == "gptqmodel" and quant["quality"]["status"] == "measured"
    q = json.loads((workdir / "resources/models/tiny/gptq-w4g128/config.json").read_text())
    assert q["quantization_config"]["bits"] == 4 and q["quantization_config"]["desc_act"] is False


@pytest.mark.slow
def test_every_stream_is_counted_again_from_its_text_and_real_servers_agree_with_it(workdir):
    """Every request's text tokenised again with the model's tokenizer, on real servers: vLLM's
    (a running count in every chunk: the text is beside it) and transformers serve's (usage in
    its last chunk only: the text and the chunks check it). No honest server is caught by the
    check; the text alone may encode back to fewer tokens than were generated (the model's own
    tokens need not be the ones its tokenizer would choose), or to more (vLLM's CPU build streamed
    a prompt's own text again in its first chunk where that text held a replacement character:
    80 tokens of text for 48 counted), so it stands beside the counts and never makes one."""
    from speedsplit.core.requestlog import read_requests, requests_path

    for path in sorted((workdir / "results/bench").rglob("run*.json")):
        res = read_result(path)
        records = [r for r in read_requests(requests_path(path)) if r.ok]
        assert records and all(r.text_tokens is not None for r in records), path
        assert res.summary.usage_mismatch == 0 and not any(r.usage_disagrees for r in records), path
        counted = {r.stream_count for r in records}
        assert counted == ({"chunks"} if res.stack == "hf-fp16" else {"running"}), (path, counted)
        assert res.summary.tokens_per_chunk >= 1.0


@pytest.mark.slow
def test_vllm_counts_its_engine_steps_and_each_step_splits_at_the_engine(workdir):
    """vLLM's /metrics histogram of the tokens of each engine step, read over the measured
    phase: its steps and their tokens in every vLLM run (transformers serve has no /metrics), and
    the mechanism table's engine level where both sides of a step counted them."""
    import polars as pl

    for path in sorted((workdir / "results/bench").rglob("run*.json")):
        res = read_result(path)
        server = res.telemetry.server if res.telemetry else None
        if res.stack.startswith("vllm"):
            assert server and server.engine_steps > 0 and server.engine_tokens >= res.summary.output_tokens, path
        else:
            assert server is None or server.engine_steps is None, path
    why = pl.read_parquet(workdir / "results/tables/mechanism.parquet")
    engine = why.filter(pl.col("factor") == "vllm-marlin/vllm-fp16")
    assert engine.height and engine["step_rate_factor"].is_not_null().all()
    product = engine["step_rate_factor"] * engine["tokens_per_step_factor"]
    assert (product / engine["throughput_factor"] - 1).abs().max() < 1e-9


@pytest.mark.slow
def test_each_vllm_stack_profiles_a_window_of_decode_and_the_step_splits_by_class(workdir):
    """mechanism.profile: run 0 of the wide cell on each vLLM stack (not run 1, not the narrow
    cell, not transformers serve) ends with its window profiled on the server that measured it;
    the CPU's ops split into classes that add up to the step, and the chain step's change too."""
    import polars as pl

    from speedsplit.analysis.step_time import CLASS_MS

    profiled = []
    for path in sorted((workdir / "results/bench").rglob("run*.json")):
        res = read_result(path)
        if res.profile is not None:
            profiled.append((res.stack, res.cell, res.run))
            split = res.profile.split
            assert res.profile.status == "ok" and split.device == "cpu", (path, res.profile.error)
            assert split.steps >= 1 and sum(getattr(split, c) for c in CLASS_MS) == pytest.approx(split.step_ms)
            keep = workdir / "results/traces" / res.session_key.replace("/", "__") / f"{res.cell}-run0"
            assert sorted(p.name for p in keep.iterdir()) == res.profile.traces
    assert sorted(profiled) == [("vllm-fp16", "u4-ci-wide-greedy", 0), ("vllm-marlin", "u4-ci-wide-greedy", 0)]
    changes = pl.read_parquet(workdir / "results/tables/step_time_changes.parquet")
    r = changes.filter(pl.col("step") == "vllm-fp16 → vllm-marlin").row(0, named=True)
    assert sum(r[c.replace("_ms", "_delta_ms")] for c in CLASS_MS) == pytest.approx(r["delta_ms"])
    answer = pl.read_parquet(workdir / "results/tables/answer.parquet").filter(pl.col("cell") == "u4-ci-wide-greedy")
    assert any("vllm-fp16 → vllm-marlin: decode step" in (w or "") for w in answer["why_kernels"])


@pytest.mark.slow
def test_the_terminal_says_what_each_cell_did_and_what_the_run_found(workdir):
    """One line per finished cell, the CPU's INT4 route before the grid, and a closing summary
    with the answer and the report's path: nobody has to open a log."""
    out = (workdir / "snakemake.out").read_text()
    assert f"speedsplit: {cpu_int4_route()[1]}" in out
    cells = [ln for ln in out.splitlines() if ln.startswith("[speedsplit] ") and " run" in ln and ": ok, " in ln]
    assert len(cells) == 3 * 2 * 2, out[-3000:]
    assert all("output tok/s, p99 TTFT" in ln for ln in cells)
    summary = out[out.index("speedsplit: what this run found") :]
    assert "study (hf-fp16 → vllm-fp16 → vllm-marlin)" in summary and "NOT DECOMPOSED" not in summary
    assert f"report: {workdir / 'results/report.html'}" in summary


@pytest.mark.slow
def test_tables_and_attribution_come_out(workdir):
    import polars as pl

    att = pl.read_csv(workdir / "results/tables/attribution.csv")
    for cell in ("u4-ci-wide-greedy", "u2-ci-narrow-greedy"):
        rows = att.filter(pl.col("cell") == cell)
        factors = rows.filter(pl.col("position") > 0)["value"].to_list()
        total = rows.filter(pl.col("factor") == "total")["value"].item()
        assert len(factors) == 2 and abs(factors[0] * factors[1] - total) < 1e-9 * total
    assert (workdir / "results/tables/cells.parquet").stat().st_size > 0
    assert (workdir / "results/tables/attribution.md").read_text().startswith("|")
    prof = json.loads((workdir / "results/profile/tiny/vllm-fp16/tp1/u4-ci-wide-greedy.json").read_text())
    assert prof["status"] == "ok" and prof["traces"] and prof["breakdown"] is None and "no GPU" in prof["note"]
    assert prof["load"]["failed"] == 0
    link = pl.read_csv(workdir / "results/tables/link.csv")
    assert set(link["backend"]) == {"gloo"} and link["decode_sized"].any()
    # shares are undefined where a total is within 5% of 1 (the tiny model on a CPU can get there)
    shares = pl.read_parquet(workdir / "results/tables/attribution.parquet").filter(
        (pl.col("chain") == "study") & (pl.col("position") > 0) & pl.col("log_share").is_not_null()
    )
    names = ["throughput", "latency", "factors-study", "link"] + (["shares-study"] if shares.height else [])
    assert (workdir / "results/plots/shares-study.svg").exists() == bool(shares.height)
    for name in names:
        for ext in ("html", "svg", "png"):
            assert (workdir / f"results/plots/{name}.{ext}").stat().st_size > 1000


@pytest.mark.slow
def test_no_server_is_left_running(workdir):
    """Every session this workflow ran is stopped, and every server process it published is gone."""

    ours = [st for st in session_state.host_states() if st.workflow == str(workdir.resolve())]
    keys = sorted(st.key for st in ours)
    # one per stack (server_reuse: per_stack), and the coordination profile's own server
    want = [f"tiny/{s}/tp1/all" for s in ("hf-fp16", "vllm-fp16", "vllm-marlin")] + ["tiny/vllm-fp16/tp1/profile"]
    assert keys == sorted(want), keys
    for st in ours:
        assert st.state == "stopped" and not session_state.daemon_alive(st)
        assert st.servers and not any(r.alive() for r in st.servers)


@pytest.mark.slow
def test_failed_cells_are_remeasured_exactly(workdir, tmp_path):
    """`speedsplit failed --rerun` sets aside the failed runs; Snakemake then plans
    exactly those cells again (and the aggregates), nothing else."""
    import sys

    wd = tmp_path / "copy"
    shutil.copytree(workdir, wd, ignore=shutil.ignore_patterns("resources"))
    (wd / "resources").symlink_to(workdir / "resources")
    failed = "results/bench/tiny/vllm-fp16/tp1/u2-ci-narrow-greedy/run0.json"
    res = json.loads((wd / failed).read_text())
    res.update(status="error", error={"type": "OSError", "message": "No space left on device"})
    (wd / failed).write_text(json.dumps(res))
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    listed = subprocess.run(
        [sys.executable, "-m", "speedsplit.cli", "failed"], cwd=wd, capture_output=True, text=True, env=env
    )
    assert listed.returncode == 0 and f"{failed}: error: No space left on device" in listed.stdout
    moved = subprocess.run(
        [sys.executable, "-m", "speedsplit.cli", "failed", "--rerun"], cwd=wd, capture_output=True, text=True, env=env
    )
    assert moved.returncode == 0 and "moved 1 result(s)" in moved.stdout, moved.stdout + moved.stderr
    assert not (wd / failed).exists() and list((wd / "results/failed").rglob("run0.json"))
    # the command it prints (and runs, given snakemake's arguments after --), as a dry run
    args = moved.stdout.split("re-measure them with: snakemake ")[1].split(" <your usual arguments>")[0].split()
    assert args == [failed]
    usual = ["--configfile", "ci.yaml", "--cores", "2", "--resources", "gpu=1"]
    out = run_snakemake([*args, "-n", *usual], wd, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert planned_outputs(out.stdout) == [failed]
    # once it is measured again (here: put back with a new time), the second run rebuilds the
    # aggregates and re-measures nothing
    aside = next((wd / "results/failed").rglob("run0.json"))
    shutil.copy(aside, wd / failed)
    shutil.copy(aside.with_name("run0.requests.jsonl"), (wd / failed).with_name("run0.requests.jsonl"))
    out = run_snakemake(["-n", *usual], wd, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert planned_outputs(out.stdout) == [] and "rule report:" in out.stdout


@pytest.mark.slow
def test_failed_rerun_remeasures_and_ends_with_fresh_tables_report_and_summary(workdir, tmp_path):
    """`speedsplit failed --rerun -- <args>` for real: the failed run is measured again, the
    tables and report are rebuilt, the closing summary is the new one (the old failure gone),
    exit 0. Before, the first run's summary read the stale tables and failed the command."""
    import sys

    wd = tmp_path / "copy"
    shutil.copytree(workdir, wd, ignore=shutil.ignore_patterns("resources"))
    (wd / "resources").symlink_to(workdir / "resources")
    # a run that carries no quality probe, on the stack quickest to start: the rerun's mechanics
    # are the same for any run, and re-measuring vLLM's run 0 started vLLM and its probes again
    failed = wd / "results/bench/tiny/hf-fp16/tp1/u2-ci-narrow-greedy/run1.json"
    res = json.loads(failed.read_text())
    res.update(status="error", error={"type": "OSError", "message": "No space left on device"})
    failed.write_text(json.dumps(res))
    closing = subprocess.run(  # what a plain rerun's summary tells the user to run
        [snakemake_bin(), "--snakefile", str(REPO / "Snakefile"), "--configfile", "ci.yaml", "--cores", "2"],
        cwd=wd, capture_output=True, text=True, timeout=600, env={**os.environ, "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    # it rebuilds the tables (the result is newer) and measures nothing again: the failure stays,
    # and the summary names the command that re-measures it, with this run's own arguments
    said = (closing.stdout + closing.stderr).split("speedsplit failed --rerun -- ")[1].splitlines()[0]
    assert said.split()[-4:] == ["--configfile", "ci.yaml", "--cores", "2"], said
    assert json.loads(failed.read_text())["status"] == "error"
    report_before = (wd / "results/report.html").stat().st_mtime
    usual = ["--snakefile", str(REPO / "Snakefile"), "--configfile", "ci.yaml", "--cores", "2", "--resources", "gpu=1"]
    done = subprocess.run(
        [sys.executable, "-m", "speedsplit.cli", "failed", "--rerun", "--", *usual],
        cwd=wd, capture_output=True, text=True, timeout=900, env={**os.environ, "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-3000:]
    assert json.loads(failed.read_text())["status"] == "ok"
    assert "failed runs re-measured; the tables, report and summary follow" in out
    final = out.rsplit("speedsplit: what this run found", 1)[1]
    assert "No space left on device" not in final and "NOT DECOMPOSED" not in final, final
    assert (wd / "results/report.html").stat().st_mtime > report_before


@pytest.mark.slow
def test_no_secret_or_home_path_in_any_output(workdir):
    """Neither the planted HF_TOKEN nor the sessions' API keys (ci.yaml: benchmark.api_key,
    kept only in the sessions' private launch files) reach any output."""
    home = str(Path.home())
    keys = {
        json.loads(p.read_text()).get("api_key")
        for p in session_state.sessions_dir().glob("*.launch.json")
        if Path(json.loads(p.read_text())["workdir"]) == workdir.resolve()
    } - {None}
    # the vLLM stacks' sessions and the coordination profile's (transformers serve has no key option)
    assert len(keys) == 3, keys
    for path in list((workdir / "results").rglob("*")):
        if path.is_file() and path.suffix in (".json", ".jsonl", ".csv", ".md", ".html", ".log"):
            text = path.read_text(errors="replace")
            assert PLANTED_TOKEN not in text, path
            assert not any(k in text for k in keys), path
            if path.suffix != ".log":
                assert home + "/" not in text, path
    required = {
        (r.stack, r.server.api_key_required) for r in map(read_result, (workdir / "results/bench").rglob("run*.json"))
    }
    assert required == {("hf-fp16", False), ("vllm-fp16", True), ("vllm-marlin", True)}


@pytest.mark.slow
def test_editing_one_cell_reruns_exactly_that_cell(workdir):
    cfg = yaml.safe_load((workdir / "ci.yaml").read_text())
    cfg["workloads"]["ci-narrow"]["output_tokens"] = 40
    (workdir / "edited.yaml").write_text(yaml.safe_dump(cfg))
    out = run_snakemake(
        ["-n", "--configfile", "edited.yaml", "--cores", "2", "--resources", "gpu=1"], workdir, timeout=300
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert planned_outputs(out.stdout) == sorted(
        f"results/bench/tiny/{s}/tp1/u2-ci-narrow-greedy/run{r}.json"
        for s in ("hf-fp16", "vllm-fp16", "vllm-marlin")
        for r in (0, 1)
    )
    unchanged = run_snakemake(
        ["-n", "--configfile", "ci.yaml", "--cores", "2", "--resources", "gpu=1"], workdir, timeout=300
    )
    assert "Nothing to be done" in unchanged.stdout + unchanged.stderr
    # the changed cells are planned as a fresh run's: each stack's two share its server, one
    # after the other in the lane, the second stopping it (each once started its own server)
    from speedsplit.planning import config as C
    from speedsplit.planning import plan as P

    cwd = os.getcwd()
    os.chdir(workdir)  # results/ paths are the workflow's own
    try:
        edited = C.load(workdir / "edited.yaml")
        finished = P.finished_as_planned(edited)
        prev = P.predecessors(edited, finished)
        sessions = P.session_plans(edited, finished)
        assert finished(BenchJob("tiny", "vllm-fp16", "tp1", "u4-ci-wide-greedy", 0))  # unchanged
        assert P.finished_as_planned(C.load(workdir / "ci.yaml"))(
            BenchJob("tiny", "vllm-fp16", "tp1", "u2-ci-narrow-greedy", 1)
        )
        todo = [job for job in prev if not finished(job)]
    finally:
        os.chdir(cwd)
    assert sorted(job.result for job in todo) == planned_outputs(out.stdout)
    for stack in ("hf-fp16", "vllm-fp16", "vllm-marlin"):
        mine = [job for job in todo if job.stack == stack]
        assert len(mine) == 2 and prev[mine[1]] == mine[0], (stack, mine)  # one after the other
        assert sessions[f"tiny/{stack}/tp1/all"].last_job == mine[1].result  # the second stops the server


@pytest.mark.slow
def test_a_forced_rerun_measures_every_forced_cell_in_its_lane(workdir):
    """`snakemake -R bench` on a finished grid reruns every cell, each stack's one after another
    on its server (each lane job's order-only input its predecessor); -R with one result reruns
    that cell alone. Snakemake 9 never asked whether a job downstream of a rerun one was forced:
    through ancient order-only inputs `-R bench` reran each lane's first cell only."""
    every = sorted(str(p.relative_to(workdir)) for p in (workdir / "results/bench").rglob("run*.json"))
    args = ["-n", "--configfile", "ci.yaml", "--cores", "2", "--resources", "gpu=1"]
    out = run_snakemake([*args, "-R", "bench"], workdir, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert len(every) == 12 and planned_outputs(out.stdout) == every
    # each job's order-only input: the result of the job before it in the lane (one lane here)
    blocks = re.findall(r"rule bench:\n\s+input: ([^\n]+)\n\s+output: ([^,\s]+)", out.stdout)
    after = {o: next((i for i in ins.split(", ") if i.startswith("results/bench/")), None) for ins, o in blocks}
    (first,) = [o for o, a in after.items() if a is None]
    following = {a: o for o, a in after.items() if a}
    lane = [first]
    while lane[-1] in following:
        lane.append(following[lane[-1]])
    assert sorted(lane) == every
    stacks = [path.split("/")[3] for path in lane]  # per_stack reuse: a stack's cells one after another
    assert [s for i, s in enumerate(stacks) if i == 0 or stacks[i - 1] != s] == sorted(set(stacks), key=stacks.index)
    one = "results/bench/tiny/vllm-fp16/tp1/u4-ci-wide-greedy/run1.json"
    out = run_snakemake([*args, "-R", one], workdir, timeout=300)
    assert out.returncode == 0 and planned_outputs(out.stdout) == [one], out.stderr[-2000:]


@pytest.mark.slow
def test_a_new_timeout_or_a_grown_grid_reruns_no_finished_cell(workdir):
    """Timeouts and the session layout reach bench jobs through results/plan.json, written
    when the workflow starts, never through a job file: changing them reruns no finished cell.
    A grown grid plans its new cells only: a finished cell has no order-only input (a new cell
    before it in its lane would make it rerun: snakemake reruns a job whose input another job
    of the run updates, ancient() or not)."""
    from speedsplit.planning import config as C
    from speedsplit.planning import plan as P

    plan = json.loads((workdir / "results/plan.json").read_text())
    assert set(plan["sessions"]) == {f"tiny/{s}/tp1/all" for s in ("hf-fp16", "vllm-fp16", "vllm-marlin")}
    cfg = yaml.safe_load((workdir / "ci.yaml").read_text())
    cfg.setdefault("benchmark", {}).update(idle_timeout_s=33, request_timeout_s=77, stall_timeout_s=55)
    cfg.setdefault("stacks", {})["vllm-fp16"] = {"startup_timeout_s": 1234}
    (workdir / "timeout.yaml").write_text(yaml.safe_dump(cfg))
    usual = ["--cores", "2", "--resources", "gpu=1"]
    out = run_snakemake(["-n", "--configfile", "timeout.yaml", *usual], workdir, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert planned_outputs(out.stdout) == []
    cfg["grid"]["runs"] = 3
    (workdir / "grown.yaml").write_text(yaml.safe_dump(cfg))
    out = run_snakemake(["-n", "--configfile", "grown.yaml", *usual], workdir, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    new = {
        f"results/bench/tiny/{s}/tp1/{c}/run2.json"
        for s in ("hf-fp16", "vllm-fp16", "vllm-marlin")
        for c in ("u4-ci-wide-greedy", "u2-ci-narrow-greedy")
    }
    grown = C.load(REPO / "config/config.yaml", workdir / "grown.yaml")
    # without the finished results, a finished cell would follow a new one in its lane
    prev = P.predecessors(grown)
    assert {job.result for job, p in prev.items() if p is not None and p.result in new} - new
    assert planned_outputs(out.stdout) == sorted(new)


@pytest.mark.slow
def test_report_answers_on_its_first_screen_in_a_browser(workdir, tmp_path):
    """Opened offline in headless Chromium at 1400 x 900: the first screen holds the headline
    sentence the tables hold, every figure's SVG rendered at a real size, and the page is not
    blank. Also snakemake --report, for the plots and tables registered with it."""
    import polars as pl

    from speedsplit.output import report as R

    if not (shutil.which("chromium") or shutil.which("chromium-browser")):
        pytest.skip("Debian's chromium is not installed (.ci/run installs it)")
    page = workdir / "results/report.html"
    text = page.read_text()
    assert "<script src=" not in text and text.count("<svg") >= 4
    shot = tmp_path / "first-screen.png"
    seen = R.render(page, shot)
    sentences = pl.read_csv(workdir / "results/tables/answer.csv")["sentence"].to_list()
    assert sentences and all(s.startswith("study (hf-fp16 → vllm-fp16 → vllm-marlin) at ") for s in sentences)
    first = sentences[0]
    assert first in seen["dom"].replace("&gt;", ">") and "<h2>The answer</h2>" in seen["dom"]
    assert 0 < seen["headline_bottom"] <= seen["viewport"][1]  # the answer is on the first screen
    assert seen["dom"].index("The answer") < seen["dom"].index("<h2>Attribution</h2>")
    assert seen["figures_in_page"] >= 4 and len(seen["figures"]) == seen["figures_in_page"]
    assert all(w > 100 and h > 100 for w, h in seen["figures"].values()), seen["figures"]
    assert "plot-waterfall" in seen["figures"]
    from PIL import Image

    img = Image.open(shot).convert("RGB")
    assert img.size[0] >= 1400
    small = img.resize((140, 90))
    colours = {small.getpixel((x, y)) for x in range(140) for y in range(90)}
    assert len(colours) > 50  # text and a plot, not a blank page
    # Snakemake's own report holds the registered plots and tables
    out = run_snakemake(["--configfile", "ci.yaml", "--report", str(tmp_path / "sm.html")], workdir, timeout=300)
    assert out.returncode == 0, (out.stdout + out.stderr)[-3000:]
    registered = (tmp_path / "sm.html").read_text()
    assert all(name in registered for name in ("waterfall.svg", "throughput.svg", "answer.csv", "report.html"))
