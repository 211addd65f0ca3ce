"""Shared by every workflow script: make the speedsplit package importable (also from a
conda env that lacks it) and send the job's stdout and stderr to its log file."""

import contextlib
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


class _Log:
    """The job's log file, written a line at a time, that a full disk cannot turn into the job's
    failure: once a write fails, a line saying so, what was not written and the rest of the
    output go to the terminal. (A plain file there made Python exit 120 at its last flush,
    "lost sys.stderr", and Snakemake deleted the error result the job had just written.)"""

    encoding = "utf-8"

    def __init__(self, path: str):
        self.path, self.file, self.pending = path, open(path, "ab", buffering=0), ""

    def write(self, text: str) -> int:
        if self.file is None:
            return sys.__stderr__.write(text)
        self.pending += text
        if "\n" in text:
            done, _, self.pending = self.pending.rpartition("\n")
            self._out(done + "\n")
        return len(text)

    def flush(self) -> None:
        if self.file is not None and self.pending:
            self._out(self.pending)
            self.pending = ""
        sys.__stderr__.flush()

    def _out(self, text: str) -> None:
        data = text.encode(errors="replace")
        try:
            while data:
                data = data[self.file.write(data) :]
        except OSError as exc:
            with contextlib.suppress(OSError):
                self.file.close()
            self.file = None
            said = f"[speedsplit] the job's log {self.path} cannot be written ({exc.strerror}): its output follows here"
            print(said, file=sys.__stderr__, flush=True)
            sys.__stderr__.write(data.decode(errors="replace"))

    def isatty(self) -> bool:
        return False

    def fileno(self) -> int:
        return (self.file or sys.__stderr__).fileno()


def to_log(snakemake) -> None:
    """The job's output to its log; a mistake in what the user gave (a UserError: a corrupt
    result, a bad trace, a config key) also as one line on the terminal, its traceback in the
    log only."""
    if snakemake.log:
        sys.stderr = sys.stdout = _Log(snakemake.log[0])
    sys.excepthook = _one_line


def _one_line(kind, exc, tb) -> None:
    from speedsplit.core.errors import UserError, one_line

    sys.__excepthook__(kind, exc, tb)  # to the log, where there is one
    if isinstance(exc, UserError):
        print(one_line(exc), file=sys.__stderr__, flush=True)
