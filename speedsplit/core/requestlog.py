"""A run's request records: one `RequestRecord` per request the load generator sent.

The bench job writes them as JSON lines (`run{N}.requests.jsonl`, appended request by
request); committed evidence keeps them columnar (`run{N}.requests.parquet`: zstd, floats
byte-split, about half the size of the gzipped lines) or, from before that, gzipped lines.
`read_requests` reads all three; `pack` turns lines into columns and checks that every
record reads back equal (nothing rounded, nothing lost).
"""

from __future__ import annotations

import gzip
from pathlib import Path
from typing import Literal

from pydantic import Field, PrivateAttr, field_serializer

from speedsplit.core.facts import StrictRecord

# The forms a run's request records take beside its result, newest first.
SUFFIXES = (".requests.parquet", ".requests.jsonl.gz", ".requests.jsonl")


# How far usage may stand above what a stream without a running count shows (its chunks, or its
# text tokenised again, whichever is more) before it is not believed: a detokenised stream
# encodes back to its own count or a token or two off (docs/how-it-works.md, "Tokens are counted").
TEXT_COUNT_SLACK_TOKENS = 2
TEXT_COUNT_SLACK_SHARE = 0.02


def text_slack(tokens: int) -> int:
    """The re-tokenised text's allowed distance from a count of `tokens` (TEXT_COUNT_SLACK_*)."""
    return max(TEXT_COUNT_SLACK_TOKENS, int(TEXT_COUNT_SLACK_SHARE * tokens))


class RequestRecord(StrictRecord):
    """One request as the client saw it (times in seconds from its phase's start, written to
    the microsecond: finer digits are clock noise and would triple the records' size)."""

    user: int
    index: int = Field(description="the user's n-th request in its phase")
    phase: Literal["warmup", "measured"]
    url: str = Field(description="the instance that served it")
    sent: float = Field(description="when its body went to the socket (one that never did: when it was begun)")
    first_token: float | None = None
    end: float | None = None
    gaps: list[float] = Field(default_factory=list, description="seconds between streamed chunks")
    prompt_tokens: int | None = Field(default=None, description="as the server counted them")
    output_tokens: int | None = Field(
        default=None,
        description="the output tokens every number counts: the stream's running count where it has one, else "
        "usage's when the stream bears it out (usage_disagrees), else the stream's; in records from before "
        "streamed_tokens, what usage said",
    )
    usage_tokens: int | None = Field(
        default=None, description="completion tokens the server's usage reported (null: records from before it)"
    )
    streamed_tokens: int | None = Field(
        default=None,
        description="tokens counted in the stream: its running count (vLLM's continuous usage, llama.cpp's "
        "timings), else one per chunk that carries a token (a lower bound: a chunk may hold several)",
    )
    stream_count: Literal["running", "chunks"] | None = Field(
        default=None, description="how streamed_tokens was counted (null: records from before it)"
    )
    text_tokens: int | None = Field(
        default=None,
        description="tokens the model's tokenizer counts in the streamed text, re-tokenised whole (null: no "
        "tokenizer, or records from before it); where the stream has no running count, usage is believed only "
        "up to TEXT_COUNT_SLACK above the more of it and the chunks",
    )
    chunks: int = Field(0, description="streamed chunks with choices, text or not")
    error: str | None = Field(default=None, description="http_<code>, stall, timeout, connection, ...")
    detail: str | None = None
    due: float | None = Field(default=None, description="open loop: when it was due (sent is when it went out)")
    asked_prompt_tokens: int | None = Field(default=None, description="open loop: its own prompt length")
    asked_output_tokens: int | None = Field(default=None, description="open loop: its own output length")
    cached_tokens: int | None = Field(
        default=None,
        description="prompt tokens the server says its KV cache held, on the card or offloaded "
        "(usage.prompt_tokens_details.cached_tokens: vLLM with --enable-prompt-tokens-details; null: not said)",
    )
    offloaded_tokens: int | None = Field(
        default=None,
        description="of those, the ones an offloaded tier held, where the server says (the reference server's "
        "prompt_tokens_details.offloaded_tokens; vLLM counts them only in /metrics)",
    )

    _text: list[str] = PrivateAttr(default_factory=list)  # the streamed text, until it is counted
    _prompt: str | None = PrivateAttr(default=None)  # a session's turn: the prompt sent, until it is counted

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def usage_disagrees(self) -> bool:
        """Whether the server's usage is not borne out by its stream: other than the running
        count; or, without one, below the chunks, or above both the chunks and the re-tokenised
        text by more than text_slack. Chunks bound usage from below only: a server holds back
        tokens that end inside a character and sends no chunk for them (transformers serve
        streamed 27 chunks for 48 tokens of the tiny model, 21 of them silent for 165 ms;
        llama.cpp 27 for 32) or sends several in one, so a claim above the chunks is not a lie
        by itself; the text, tokenised again, says how many there were, or fewer (never a lie
        below what the chunks show)."""
        if self.usage_tokens is None or self.streamed_tokens is None:
            return False
        if self.stream_count == "running":
            return self.usage_tokens != self.streamed_tokens
        if self.usage_tokens < self.streamed_tokens:
            return True
        if self.text_tokens is None:
            return False
        # what the stream shows at least: its chunks, or its text tokenised again, whichever is
        # more (a model's own tokens may encode back to fewer: 48 spaces, one token each, are
        # one token of the model's BPE vocabulary when encoded again)
        return self.usage_tokens > max(self.streamed_tokens, self.text_tokens) + text_slack(self.usage_tokens)

    def settle(self) -> None:
        """Set output_tokens, the count every number uses, once the stream has ended: exact from
        a running count; else usage's where the stream bears it out; else what the stream
        shows at least (its chunks, or its text tokenised again, whichever is more)."""
        if self.stream_count == "running" or self.usage_tokens is None or self.usage_disagrees:
            text = self.text_tokens if self.stream_count != "running" else None
            self.output_tokens = max(self.streamed_tokens or 0, text or 0) if text is not None else self.streamed_tokens
        else:
            self.output_tokens = self.usage_tokens

    @field_serializer("sent", "first_token", "end", "due")
    def _to_the_microsecond(self, t: float | None) -> float | None:
        return None if t is None else round(t, 6)

    @field_serializer("gaps")
    def _gaps_to_the_microsecond(self, gaps: list[float]) -> list[float]:
        return [round(g, 6) for g in gaps]


def requests_path(result: str | Path) -> Path:
    """A result's request records: run{N}.requests.jsonl beside it (as the bench job writes
    them), else the packed forms committed evidence keeps (parquet, or gzipped lines)."""
    stem = Path(result).with_suffix("")
    found = [stem.with_name(stem.name + s) for s in reversed(SUFFIXES)]
    return next((p for p in found if p.exists()), found[0])


def read_requests(path: str | Path) -> list[RequestRecord]:
    """The request records of a .requests.jsonl, .requests.jsonl.gz or .requests.parquet file."""
    path = Path(path)
    if path.suffix == ".parquet":
        import polars as pl

        return [RequestRecord.model_validate(row) for row in pl.read_parquet(path).iter_rows(named=True)]
    text = gzip.decompress(path.read_bytes()).decode() if path.suffix == ".gz" else path.read_text()
    return [RequestRecord.model_validate_json(line) for line in text.splitlines() if line.strip()]


def _columns(records: list[RequestRecord]):
    import pyarrow as pa

    fields = {
        "user": pa.int32(),
        "index": pa.int32(),
        "phase": pa.string(),
        "url": pa.string(),
        "sent": pa.float64(),
        "first_token": pa.float64(),
        "end": pa.float64(),
        "gaps": pa.list_(pa.float64()),
        "prompt_tokens": pa.int32(),
        "output_tokens": pa.int32(),
        "usage_tokens": pa.int32(),
        "streamed_tokens": pa.int32(),
        "stream_count": pa.string(),
        "text_tokens": pa.int32(),
        "chunks": pa.int32(),
        "error": pa.string(),
        "detail": pa.string(),
        "due": pa.float64(),
        "asked_prompt_tokens": pa.int32(),
        "asked_output_tokens": pa.int32(),
        "cached_tokens": pa.int32(),
        "offloaded_tokens": pa.int32(),
    }
    assert set(fields) == set(RequestRecord.model_fields), "a RequestRecord field has no column"
    rows = [r.__dict__ for r in records]  # the values as read: exact, not the writer's microseconds
    return pa.table({k: pa.array([row[k] for row in rows], type=t) for k, t in fields.items()})


def pack(path: str | Path) -> Path:
    """Rewrite a run's .requests.jsonl[.gz] as .requests.parquet beside it, check that it
    reads back equal record by record, and remove the lines; returns the new file."""
    import pyarrow.parquet as pq

    from speedsplit.core.results import write_bytes_atomic

    path = Path(path)
    records = read_requests(path)
    out = path.with_name(path.name.split(".requests.")[0] + ".requests.parquet")
    tmp = out.with_name(out.stem + ".packing.parquet")
    # Floats byte-split (their exponents compress; dictionary encoding would hide them from it)
    strings = ["phase", "url", "error", "detail", "stream_count"]
    pq.write_table(
        _columns(records),
        tmp,
        compression="zstd",
        compression_level=19,
        use_dictionary=strings,
        use_byte_stream_split=True,
    )
    if read_requests(tmp) != records:
        tmp.unlink()
        raise ValueError(f"{path}: the columnar copy does not read back equal; left as it was")
    write_bytes_atomic(out, tmp.read_bytes())
    tmp.unlink()
    path.unlink()
    return out
