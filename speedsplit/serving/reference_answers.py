"""What the server of known speed says (speedsplit/serving/reference.py): its answers, set by hand
like its speed, so that a chain of reference stacks has known quality factors as well as known
speed factors (tests/analysis/test_quality_truth.py).

Every answer's token i is " t{i}" (id i), except that a request whose prompt falls in the
diverging share (one prompt in `diverge_every`, by a hash of its text, the same on every
server) says " u{i}" (id DIVERGED + i) from position `diverge_at` on. A prompt token it scores
(`echo` with `logprobs`) at position j gets log-probability -(`nll` + `nll_wave` x (j % 3)), so
with no wave its perplexity is exp(nll) exactly; it is the top token at its place except where
(its id + j) % `other_top_every` == 0, where another token is half a nat above it.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

DIVERGED = 1_000_000  # the ids of a diverging answer's tokens start here


@dataclass(frozen=True)
class Answers:
    diverge_every: int = 0  # one prompt in this many diverges (0: none)
    diverge_at: int = 0  # from this output position on
    nll: float = 1.0  # every scored prompt token's negative log-probability (its base)
    nll_wave: float = 0.0  # added times (position % 3)
    other_top_every: int = 0  # (id + position) % this == 0: another token tops it (0: never)

    def diverges(self, prompt: str) -> bool:
        return bool(self.diverge_every) and zlib.crc32(prompt.encode()) % self.diverge_every == 0

    def token(self, prompt: str, i: int, diverges: bool | None = None) -> tuple[int, str]:
        """Output token i of the answer to prompt: (its id, its text)."""
        d = self.diverges(prompt) if diverges is None else diverges
        return (DIVERGED + i, f" u{i}") if d and i >= self.diverge_at else (i, f" t{i}")

    def scores(self, ids: list[int], top: int) -> tuple[list[float], list[dict[int, float]]]:
        """A prompt's scores: each token's logprob from the second on, and the top ones at its
        place: itself (or another above it), then others a nat apart each."""
        lps, tops = [], []
        for j, t in enumerate(ids[1:], start=1):
            lp = -(self.nll + self.nll_wave * (j % 3))
            ranked = {t: lp, **{DIVERGED + t + r: lp - r for r in range(1, top)}}
            if self.tops_another(t, j):
                ranked[-1 - t] = lp + 0.5
            lps.append(lp)
            tops.append(ranked)
        return lps, tops

    def tops_another(self, token: int, position: int) -> bool:
        return bool(self.other_top_every) and (token + position) % self.other_top_every == 0


def agreement(a: Answers, b: Answers, prompts: list[str], n: int) -> tuple[float, float]:
    """What two reference servers' answers to these prompts (n tokens each) agree on: the share
    that match in full, and the mean position of the first difference (n where none)."""
    firsts = []
    for p in prompts:
        ta, tb = [a.token(p, i)[0] for i in range(n)], [b.token(p, i)[0] for i in range(n)]
        firsts.append(next((i for i in range(n) if ta[i] != tb[i]), n))
    return sum(f == n for f in firsts) / len(prompts), sum(firsts) / len(prompts)
