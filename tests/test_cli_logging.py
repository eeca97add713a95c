"""`searchrl --log-level`: searchrl's log records reach stderr at the level asked for, and a wrong level is
refused with the levels there are (the copy gates' measurements were invisible to a demo's user before)."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
from typer.testing import CliRunner

from searchrl.cli import app, configure_logging


@pytest.fixture
def searchrl_logger() -> Iterator[logging.Logger]:
    logger = logging.getLogger("searchrl")
    level, handlers = logger.level, list(logger.handlers)
    yield logger
    logger.setLevel(level)
    logger.handlers[:] = handlers


def test_info_records_reach_stderr_only_at_info(searchrl_logger: logging.Logger, capsys) -> None:
    configure_logging("warning")
    logging.getLogger("searchrl.sft").info("copy-phase gate at step 800: 0.16")
    logging.getLogger("searchrl.sft").warning("a warning")
    err = capsys.readouterr().err
    assert "a warning" in err and "copy-phase gate" not in err

    configure_logging("info")
    configure_logging("info")  # twice: still one line a record
    logging.getLogger("searchrl.sft").info("copy-phase gate at step 800: 0.16")
    err = capsys.readouterr().err
    assert err.count("copy-phase gate at step 800: 0.16") == 1 and "searchrl.sft INFO" in err


def test_a_second_run_of_the_app_logs_to_the_stderr_of_its_time(
    searchrl_logger: logging.Logger, capsys
) -> None:
    # The first run's stderr (CliRunner's) is closed when it returns; records after it go to today's stderr.
    assert CliRunner().invoke(app, ["--log-level", "info", "search", "--help"]).exit_code == 0
    configure_logging("info")
    logging.getLogger("searchrl.ppo").info("after the first run")
    err = capsys.readouterr().err
    assert err.count("after the first run") == 1 and "Logging error" not in err


def test_an_unknown_level_is_refused_with_the_levels_there_are(searchrl_logger: logging.Logger) -> None:
    result = CliRunner().invoke(app, ["--log-level", "loud", "search", "--help"], terminal_width=200)
    assert result.exit_code == 2
    assert "'loud' is not one of debug, info, warning, error" in " ".join(
        result.output.replace("│", " ").split()
    )
