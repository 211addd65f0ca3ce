"""The errors a user acts on from their message alone (speedsplit/core/errors.py): which mistakes
are the user's, which except clauses catch them, and how one is shown: one line, whatever its
message, from speedsplit's commands and from a workflow job."""

import subprocess
import sys

import pytest
import yaml

from conftest import REPO
from speedsplit import cli
from speedsplit.core.errors import BadRequest, ConfigError, UserError, one_line

BAD_YAML = "steps: [{name: a\n"  # the flow mapping never closed


def _yaml_error() -> str:
    """PyYAML's own words for BAD_YAML: several lines, the text quoted under a caret."""
    with pytest.raises(yaml.YAMLError) as exc:
        yaml.safe_load(BAD_YAML)
    return str(exc.value)


def test_a_users_mistake_is_shown_as_its_message_after_the_commands_name():
    assert one_line(UserError("no results folder at r")) == "speedsplit: no results folder at r"
    assert one_line(ConfigError("config error at grid.runs: 0 is less than 1")) == (
        "speedsplit: config error at grid.runs: 0 is less than 1"
    )


def test_a_message_of_several_lines_is_shown_on_one_line_with_every_line_of_it():
    said = _yaml_error()
    assert said.count("\n") >= 4  # what steps.read_steps puts in its StepsError
    shown = one_line(UserError(f"e.yaml: {said}"))
    assert "\n" not in shown
    assert shown == (
        "speedsplit: e.yaml: while parsing a flow mapping "
        'in "<unicode string>", line 1, column 9: steps: [{name: a ^ '
        "expected ',' or '}', but got '<stream end>' "
        'in "<unicode string>", line 2, column 1: ^'
    )
    assert one_line(UserError("first\r\n\n  second  \n")) == "speedsplit: first second"


def test_a_config_error_is_caught_as_a_users_mistake_and_as_a_bad_value():
    for catch in (UserError, ValueError):
        with pytest.raises(catch):
            raise ConfigError("config error at quality.prompts: 0 is less than 1")
    assert not issubclass(UserError, ValueError)  # a tool missing is no bad value


def test_a_request_our_servers_refuse_is_no_users_mistake():
    """A BadRequest is answered 400 by the server that met it; were one to reach a command, it
    is a defect of speedsplit's, shown with its traceback, not as the user's mistake."""
    with pytest.raises(BadRequest):
        try:
            raise BadRequest("logprobs must be an integer from 0 to 20, not 'five'")
        except UserError:  # what speedsplit's commands catch
            pytest.fail("a BadRequest was taken for the user's mistake")
    with pytest.raises(ValueError, match="logprobs must be"):
        raise BadRequest("logprobs must be an integer from 0 to 20, not 'five'")


def test_a_command_shows_a_users_mistake_of_several_lines_on_one_line_and_exits_2(tmp_path, capsys):
    (tmp_path / "e.yaml").write_text(BAD_YAML)
    assert cli.main(["host", "run", "--steps", str(tmp_path / "e.yaml"), "--project", str(tmp_path)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1
    assert err.startswith(f"speedsplit: {tmp_path / 'e.yaml'}: while parsing a flow mapping in ")
    assert err.endswith("expected ',' or '}', but got '<stream end>' in \"<unicode string>\", line 2, column 1: ^\n")
    assert not (tmp_path / "results").exists()


def test_a_job_shows_a_users_mistake_of_several_lines_on_one_line_and_logs_it_whole(tmp_path):
    """As a workflow script does (workflow_scripts/_job.py): to_log, then the library raises."""
    log = tmp_path / "job.log"
    script = f"""
import sys
sys.path.insert(0, {str(REPO / "workflow_scripts")!r})
from _job import to_log
class Job:
    log = [{str(log)!r}]
to_log(Job())
from speedsplit.core.errors import UserError
raise UserError("first line\\n  second line")
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert (out.returncode, out.stdout, out.stderr) == (1, "", "speedsplit: first line second line\n")
    logged = log.read_text()
    assert "Traceback (most recent call last)" in logged and "UserError: first line\n  second line" in logged
