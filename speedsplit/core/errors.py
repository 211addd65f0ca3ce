"""Errors a user can act on from their message alone, which names what is wrong (a config key,
a file and line, a model): shown as one line, never as a traceback, by speedsplit's commands
(speedsplit/cli.py) and by the workflow's jobs (workflow_scripts/_job.py: the line on the
terminal, the traceback in the job's log)."""


class UserError(Exception):
    """A mistake in what the user gave (config, files, results, a tool missing): its message
    is the whole story."""


class ConfigError(UserError, ValueError):
    """A config value is wrong; the message is one line naming the key."""


class BadRequest(ValueError):
    """A request body one of our servers refuses (HTTP 400: the reference and the HF servers),
    its message the reason the answer gives."""


def one_line(exc: BaseException) -> str:
    """How a UserError is shown: on one line, whatever its message (a message of several lines,
    such as a YAML parser's, has its lines joined)."""
    return "speedsplit: " + " ".join(line.strip() for line in str(exc).splitlines() if line.strip())
