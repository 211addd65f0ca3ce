"""What the server of known speed says (speedsplit/serving/reference.py): its answers, set by hand
like its speed, so that a chain of reference stacks has known quality factors as well as known
speed factors (tests/analysis/test_quality_truth.py).

Every answer's token i is " t{i}" (id i), except that a request whose prompt falls in the
diverging share (one prompt in `diverge_every`, by a hash of its text, the same on every
server) says " u{i}" (id DIVERGED + i) from position `diverge_at` on. Every prompt token it
scores (`echo` with `logprobs`) gets log-probability -`nll` and is the top token at its place,
so its perplexity is exp(nll) exactly.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

DIVERGED = 1_000_000  # the ids of a diverging answer's tokens start here


@dataclass(frozen=True)
class Answers:
    diverge_every: int = 0  # one prompt in this many diverges (0: none)
    diverge_at: int = 0  # from this output position on
    nll: float = 1.0  # every scored prompt token's negative log-probability

    def diverges(self, prompt: str) -> bool:
        return bool(self.diverge_every) and zlib.crc32(prompt.encode()) % self.diverge_every == 0

    def token(self, prompt: str, i: int, diverges: bool | None = None) -> tuple[int, str]:
        """Output token i of the answer to prompt: (its id, its text)."""
        d = self.diverges(prompt) if diverges is None else diverges
        return (DIVERGED + i, f" u{i}") if d and i >= self.diverge_at else (i, f" t{i}")

    def scores(self, ids: list[int], top: int) -> tuple[list[float], list[dict[int, float]]]:
        """A prompt's scores: each token's logprob from the second on (-nll), and the top ones
        at its place: itself, then others a nat apart each."""
        lps = [-self.nll] * (len(ids) - 1)
        tops = [{t: -self.nll, **{DIVERGED + t + r: -self.nll - r for r in range(1, top)}} for t in ids[1:]]
        return lps, tops


def agreement(a: Answers, b: Answers, prompts: list[str], n: int) -> tuple[float, float]:
    """What two reference servers' answers to these prompts (n tokens each) agree on: the share
    that match in full, and the mean position of the first difference (n where none)."""
    firsts = []
    for p in prompts:
        ta, tb = [a.token(p, i)[0] for i in range(n)], [b.token(p, i)[0] for i in range(n)]
        firsts.append(next((i for i in range(n) if ta[i] != tb[i]), n))
    return sum(f == n for f in firsts) / len(prompts), sum(firsts) / len(prompts)
