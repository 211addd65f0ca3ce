"""The HTML report, read back as a reader would: the first screen's answer and what each stack
served, what its intervals rest on, failures with their causes, no secret, escaped text."""

from html.parser import HTMLParser

import pytest
from records import fake_result, write_result

from speedsplit.core.record import ErrorInfo
from speedsplit.output import aggregate, report

STUDY = {"study": ["hf-fp16", "vllm-fp16", "vllm-marlin"]}
PAIR = {"c": ["a", "b"]}
KERNEL = {"kernel": ["vllm-fp16", "vllm-marlin"]}
WHERE = "at 8 users × 8 in / 16 out tokens, greedy (tiny, tp1)"
FAILURES = ["model", "stack", "topology", "cell", "run", "status", "flags", "failures", "error"]
SERVED = ["cell", "stack", "kernel that ran", "output tok/s", "TTFT p50 ms", "TTFT p99 ms", "TPOT p50 ms", "E2E p99 s"]


class Page(HTMLParser):
    """The report's text: each paragraph, list item and heading as (tag, class, text), each
    table as its header, rows and which rows are marked bad."""

    def __init__(self, raw: str):
        super().__init__()
        self.raw, self.blocks, self.tables, self._block, self._cell = raw, [], [], None, False
        self.feed(raw)

    def handle_starttag(self, tag, attrs):
        cls = dict(attrs).get("class")
        if tag in ("p", "li", "h2", "h3", "pre"):
            self._block = [tag, cls, ""]
            self.blocks.append(self._block)
        elif tag == "table":
            self.tables.append({"rows": [], "bad": []})
        elif tag == "tr":
            self.tables[-1]["rows"].append([])
            self.tables[-1]["bad"].append(cls == "bad")
        elif tag in ("td", "th"):
            self.tables[-1]["rows"][-1].append("")
            self._cell = True

    def handle_endtag(self, tag):
        if tag in ("p", "li", "h2", "h3", "pre"):
            self._block = None
        self._cell = self._cell and tag not in ("td", "th")

    def handle_data(self, data):
        if self._cell:
            self.tables[-1]["rows"][-1][-1] += data
        if self._block:
            self._block[2] += data

    def texts(self, tag, cls=None) -> list[str]:
        return [text for t, c, text in self.blocks if t == tag and (cls is None or c == cls)]

    def table(self, header: list[str]) -> tuple[list[list[str]], list[bool]]:
        """The rows of the table with this header, and which are marked bad."""
        (found,) = [t for t in self.tables if t["rows"][0] == header]
        return found["rows"][1:], found["bad"][1:]


def measured(tmp_path, speeds: dict, chains: dict, edit=lambda res: None, config=None) -> Page:
    """The report over runs of each stack at their throughputs (None: a run that failed), as
    `speedsplit aggregate` writes it from the tables; edit changes each result first."""
    paths = []
    for stack, tok_s in speeds.items():
        for run, v in enumerate(tok_s):
            res = fake_result(stack, 8, run, v, status="ok" if v else "server_error")
            edit(res)
            paths.append(write_result(tmp_path / f"bench/tiny/{stack}/tp1/u8-wide-greedy/run{run}.json", res))
    aggregate.write_tables(paths, tmp_path / "tables", chains=chains)  # as the tables rule does
    out, tables, plots = tmp_path / "report.html", tmp_path / "tables", tmp_path / "plots"
    aggregate.write_report(
        out, config=config or {"chains": chains}, result_paths=paths, tables_dir=tables, plots_dir=plots
    )
    return Page(out.read_text())


def test_the_first_screen_answers_in_one_sentence_and_shows_the_kernel_each_stack_ran(tmp_path):
    page = measured(tmp_path, {"hf-fp16": [100, 101], "vllm-fp16": [200, 201], "vllm-marlin": [300, 301]}, STUDY)
    assert page.texts("h2")[:2] == ["The answer", "Attribution"]
    assert page.texts("p", "headline") == [
        f"study (hf-fp16 → vllm-fp16 → vllm-marlin) {WHERE}: vllm-fp16/hf-fp16 2× [1.93, 2.06] × "
        "vllm-marlin/vllm-fp16 (on the CPU: CPUWNA16LinearKernel) 1.5× [1.48, 1.52] = 2.99× [2.86, 3.12] "
        "(95% intervals over 2 runs a stack)."
    ]
    rows, bad = page.table(SERVED)
    assert rows == [
        ["u8-wide-greedy", "hf-fp16", "none reported", "100.5 [94.3, 107.1]", "100", "300", "100", "0.3"],
        ["u8-wide-greedy", "vllm-fp16", "none reported", "200.5 [194.2, 207.0]", "100", "300", "100", "0.3"],
        ["u8-wide-greedy", "vllm-marlin", "CPUWNA16LinearKernel", "300.5 [294.2, 306.9]", "100", "300", "100", "0.3"],
    ]
    assert bad == [False] * 3
    assert page.texts("p", "clean") == [
        "Nothing qualifies them: every run counted, every engine ran the kernel asked for, every measured "
        "phase was long enough, every request completed."
    ]
    assert page.texts("p")[-1] == "None: every run completed every request, unflagged."
    setup = ["GPUs: none", "CPU: Test CPU (2 cores)", "Versions:  (Python 3.11)", "Workflow commit: abc"]
    assert page.texts("li")[-4:] == setup


@pytest.mark.parametrize(
    "a, b, said",
    [
        ([100, 101, 102], [200, 202, 204], "2× [1.96, 2.05] = 2× [1.96, 2.05] (95% intervals over 3 runs a stack)."),
        ([100], [200], "2× [no interval: one run] = 2× [no interval: one run] (one run a stack: no interval; "
         "set grid.runs to 2 or more for one)."),
        ([100, 110], [104, 106], "1× [0.595, 1.68] (no difference shown) = 1× [0.595, 1.68] (no difference shown) "
         "(95% intervals over 2 runs a stack; no difference shown: the interval holds 1)."),
    ],
    ids=["three runs a stack", "one run a stack", "an interval holding 1"],
)  # fmt: skip
def test_a_sentence_says_how_many_runs_its_intervals_rest_on_and_when_they_show_no_difference(tmp_path, a, b, said):
    page = measured(tmp_path, {"a": a, "b": b}, PAIR)
    assert page.texts("p", "headline") == [f"c (a → b) {WHERE}: b/a {said}"]


def test_a_sentence_over_stacks_measured_unequally_does_not_claim_an_even_count_a_stack(tmp_path):
    page = measured(tmp_path, {"a": [100], "b": [200, 202, 204]}, PAIR)
    (sentence,) = page.texts("p", "headline")
    assert sentence.startswith(f"c (a → b) {WHERE}: b/a 2.02× [no interval: one run]")
    assert "2 runs a stack" not in sentence and "95% intervals" not in sentence


def test_a_stack_measured_once_still_shows_what_it_served(tmp_path):
    rows, _ = measured(tmp_path, {"a": [100], "b": [200]}, PAIR).table(SERVED)
    assert [r[3] for r in rows] == ["100.0", "200.0"]  # the value alone, rounded as the others


def test_failed_runs_are_listed_with_their_causes_and_qualify_the_answer(tmp_path):
    def cause(res):
        if res.status != "ok":
            res.server.error = None  # the session served; its requests failed
            res.error = ErrorInfo(type="ServerError", message="4 x http_500 (no cpu_gemm_wna16)")

    page = measured(tmp_path, {"a": [100, 101], "b": [None, None]}, PAIR, cause)
    why = "a stack of the chain has no clean run; b: no clean run (run0: server_error, run1: server_error)"
    assert page.texts("p", "headline") == [f"c (a → b) {WHERE}: not decomposable, {why}."]
    assert page.texts("li")[:3] == [
        "Left out of the headline numbers (2): b run0: server_error; b run1: server_error",
        f"Not decomposable: chain c at u8-wide-greedy (tiny, tp1): {why}",
        "2 run(s) did not complete: b u8-wide-greedy run0 (server_error), b u8-wide-greedy run1 (server_error)",
    ]
    rows, bad = page.table(FAILURES)
    assert rows == [
        ["tiny", "b", "tp1", "u8-wide-greedy", str(run), "server_error", "", "{}", "4 x http_500 (no cpu_gemm_wna16)"]
        for run in (0, 1)
    ]
    assert bad == [True, True]


def test_a_kernel_other_than_the_one_asked_for_qualifies_the_answer_naming_the_one_that_ran(tmp_path):
    def mismatch(res):
        res.flags = ["kernel_mismatch"] if "marlin" in res.stack else []

    page = measured(tmp_path, {"vllm-fp16": [100, 101], "vllm-marlin": [200, 202]}, KERNEL, mismatch)
    assert (
        "2 run(s) ran another kernel than the one asked for (reported: vllm-marlin: CPUWNA16LinearKernel): "
        "vllm-marlin u8-wide-greedy run0, vllm-marlin u8-wide-greedy run1"
    ) in page.texts("li")
    rows, bad = page.table(FAILURES)
    assert [(r[1], r[4], r[5], r[6]) for r in rows] == [
        ("vllm-marlin", str(n), "ok", "kernel_mismatch") for n in (0, 1)
    ]
    assert bad == [True, True]
    assert page.texts("p", "clean") == []


TOKEN, KEY = "hf_" + "Ab1" * 12, "plain-secret-4711"


def leaked(tmp_path, monkeypatch) -> Page:
    """A stack's env holds a Hugging Face token; the failed run's log tail and cause hold it and
    a secret the environment holds (of no known shape)."""
    monkeypatch.setenv("SERVER_API_KEY", KEY)

    def leak(res):
        if res.status != "ok":
            res.server.log_tail = f"HF_TOKEN={TOKEN}\nusing key {KEY}"
            res.server.error = f"startup failed: HF_TOKEN={TOKEN} key {KEY}"

    config = {"chains": PAIR, "stacks": {"a": {"env": {"HF_TOKEN": TOKEN}}}}
    return measured(tmp_path, {"a": [100, 101], "b": [None]}, PAIR, leak, config)


def test_no_secret_from_a_stack_env_or_a_run_log_reaches_the_report(tmp_path, monkeypatch):
    page = leaked(tmp_path, monkeypatch)
    assert TOKEN not in page.raw and KEY not in page.raw
    (cfg,) = page.texts("pre")
    assert '"HF_TOKEN": "<HF_TOKEN>"' in cfg and "&lt;HF_TOKEN&gt;" in page.raw


def test_a_secret_in_a_cause_reads_as_its_placeholder_not_as_markup(tmp_path, monkeypatch):
    rows, _ = leaked(tmp_path, monkeypatch).table(FAILURES)
    assert rows[0][-1] == "startup failed: HF_TOKEN=<HF_TOKEN> key <SERVER_API_KEY>"


def test_odd_text_in_a_chain_name_and_a_cause_is_escaped_not_markup(tmp_path):
    def odd(res):
        if res.status != "ok":
            res.server.error = "<marquee>alert('x')</marquee> & co"

    page = measured(tmp_path, {"a": [100, 101], "b": [200, None]}, {"c<i>&": ["a", "b"]}, odd)
    assert "<marquee" not in page.raw and "<i>" not in page.raw
    assert "<td>&lt;marquee&gt;alert(&#x27;x&#x27;)&lt;/marquee&gt; &amp; co</td>" in page.raw
    rows, _ = page.table(FAILURES)
    assert rows == [
        ["tiny", "b", "tp1", "u8-wide-greedy", "1", "server_error", "", "{}", "<marquee>alert('x')</marquee> & co"]
    ]
    assert page.texts("p", "headline")[0].startswith(f"c<i>& (a → b) {WHERE}: b/a ")
    (cfg,) = page.texts("pre")
    assert '"c<i>&": [' in cfg


def test_a_chain_with_a_stack_not_measured_is_not_decomposed_and_says_which(tmp_path):
    page = measured(tmp_path, {"a": [100, 101]}, {"c": ["a", "z"]})
    assert page.texts("p", "headline") == [
        "No chain has every stack measured in these results: nothing to decompose (what was measured is in "
        "the sections below)."
    ]
    assert page.texts("li")[0] == "Chain c is not decomposed at 1 headline cell(s): z not measured here"
    assert all(t["rows"][0] != SERVED for t in page.tables)  # no stack served a headline cell
    rows = next(t["rows"] for t in page.tables if t["rows"][0][:5] == ["chain", "model", "topology", "cell", "factor"])
    assert [(r[4], r[6], r[-1]) for r in rows[1:]] == [
        ("z/a", "—", "a stack of the chain has no clean run; z: not measured"),
        ("total", "—", "a stack of the chain has no clean run; z: not measured"),
    ]


def test_empty_tables_make_a_report_without_a_result_and_a_missing_table_leaves_the_last_report(tmp_path):
    measured(tmp_path, {"a": [100, 101]}, {})
    frames = aggregate.read_tables(tmp_path / "tables")
    out = tmp_path / "empty.html"
    report.build(out, config={"chains": {}}, provenance=None, frames=frames, svgs={})
    page = Page(out.read_text())
    assert page.texts("h2") == ["The answer", "Attribution", "Plots", "Cells", "Failures and flags", "Setup"]
    assert page.texts("p")[-5:] == [
        "No chain has measurements of all its stacks.",
        "—",  # no crossover
        "—",  # no stability
        "None: every run completed every request, unflagged.",
        "No result yet.",
    ]
    del frames["crossover"]
    with pytest.raises(KeyError, match="crossover"):
        report.build(out, config={"chains": {}}, provenance=None, frames=frames, svgs={})
    assert Page(out.read_text()).texts("h2") == page.texts("h2")  # the last report, whole
    assert list(tmp_path.glob(".empty.html.*")) == []  # no temp file left beside it
