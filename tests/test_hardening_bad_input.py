"""Bad configs, datasets and corpora across the CLI: each gets an error that names the file, the line or
the field, and says how to fix it; the command exits non-zero without a traceback.

The commands run in process through typer's `CliRunner` (the real `searchrl` app, its real argument
parsing and error handling); `load_qa` and `load_corpus` are checked directly as well.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from searchrl.cli import app
from searchrl.common.config import ConfigError, load_config
from searchrl.data.datasets import DatasetError, load_qa
from searchrl.ppo.config import PPOConfig
from searchrl.search.corpus import CorpusError, load_corpus

runner = CliRunner()


def run_cli(*args: str):
    result = runner.invoke(app, list(args))
    assert result.exit_code != 0, result.output
    assert "Traceback" not in result.output
    return " ".join(result.output.split())  # rich wraps long lines: compare without the breaks


def write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


# -- training configs ----------------------------------------------------------------------------------


def test_train_config_with_a_typo_names_the_file_and_suggests_the_field(tmp_path):
    cfg = write(tmp_path / "bad.yaml", f"output_dir: {tmp_path / 'run'}\nlearning_rat: 0.0001\n")
    out = run_cli("train", "--config", str(cfg))
    assert str(cfg) in out and "learning_rat" in out and "did you mean 'learning_rate'" in out


def test_train_config_with_a_wrong_type_names_the_field_and_the_expected_type(tmp_path):
    cfg = write(tmp_path / "bad.yaml", f"output_dir: {tmp_path / 'run'}\nlearning_rate: fast\n")
    out = run_cli("train", "--config", str(cfg))
    assert str(cfg) in out and "learning_rate" in out and "expected a number" in out


def test_train_config_with_broken_yaml_names_the_file_and_line(tmp_path):
    cfg = write(tmp_path / "bad.yaml", "output_dir: [unclosed\nlearning_rate: 1\n")
    out = run_cli("train", "--config", str(cfg))
    assert str(cfg) in out and "not valid YAML" in out and "line 2" in out


def test_train_config_that_does_not_exist_or_is_not_a_mapping(tmp_path):
    out = run_cli("train", "--config", str(tmp_path / "missing.yaml"))
    assert "missing.yaml" in out and "not found" in out
    cfg = write(tmp_path / "list.yaml", "- 1\n- 2\n")
    with pytest.raises(ConfigError, match="top level must be a mapping"):
        load_config(PPOConfig, cfg)


def test_train_set_override_that_is_not_field_equals_value(tmp_path):
    cfg = write(tmp_path / "ok.yaml", f"output_dir: {tmp_path / 'run'}\n")
    out = run_cli("train", "--config", str(cfg), "--set", "kl_coef")
    assert "--set 'kl_coef'" in out and "FIELD=VALUE" in out


# -- corpora ---------------------------------------------------------------------------------------------


def test_index_on_a_corpus_with_a_broken_line_names_file_and_line(tmp_path):
    corpus = write(
        tmp_path / "corpus.jsonl",
        '{"id": "a", "contents": "x"}\n{"id": "b", "contents": "y"}\n{"id": "c", "contents": \n',
    )
    out = run_cli("index", "--corpus", str(corpus), "--out", str(tmp_path / "idx"))
    assert f"{corpus}:3" in out and "invalid JSON" in out


@pytest.mark.parametrize(
    "row, problem",
    [
        ({"contents": "no id"}, "missing field 'id'"),
        ({"id": "b"}, "missing field 'contents'"),
        ({"id": "b", "contents": 7}, "'contents' must be a string"),
        ({"id": "b", "title": ["t"], "contents": "x"}, "'title' must be a string"),
    ],
)
def test_corpus_rows_with_missing_or_wrong_fields(tmp_path, row, problem):
    corpus = write(
        tmp_path / "corpus.jsonl", json.dumps({"id": "a", "contents": "x"}) + "\n" + json.dumps(row) + "\n"
    )
    with pytest.raises(CorpusError) as err:
        load_corpus(corpus)
    assert f"{corpus}:2" in str(err.value) and problem in str(err.value)
    out = run_cli("index", "--corpus", str(corpus), "--out", str(tmp_path / "idx"))
    assert f"{corpus}:2" in out and problem in out


def test_serve_and_search_on_a_missing_index_say_how_to_build_one(tmp_path):
    out = run_cli("serve", "--index", str(tmp_path / "nothing"))
    assert "index directory not found" in out and "searchrl index" in out
    out = run_cli("search", "--index", str(tmp_path / "nothing"), "hello")
    assert "searchrl index" in out


# -- datasets --------------------------------------------------------------------------------------------


def test_data_check_and_load_qa_name_the_line_and_the_missing_field(tmp_path):
    qa = write(
        tmp_path / "qa.jsonl",
        '{"id": "q1", "question": "a?", "golds": ["x"]}\n{"id": "q2", "question": "b?"}\n',
    )
    out = run_cli("data", "check", str(qa))
    assert str(qa) in out and "line 2" in out and "missing field 'golds'" in out
    with pytest.raises(DatasetError, match=r"line 2: missing field 'golds'"):
        load_qa(qa)


def test_load_qa_on_broken_json_and_missing_question(tmp_path):
    broken = write(tmp_path / "broken.jsonl", '{"question": "a?", "golds": ["x"]}\n{"question": \n')
    with pytest.raises(DatasetError) as err:
        load_qa(broken)
    assert str(broken) in str(err.value) and "2" in str(err.value)
    noq = write(tmp_path / "noq.jsonl", '{"golds": ["x"]}\n')
    with pytest.raises(DatasetError) as err:
        load_qa(noq)
    assert "question" in str(err.value) and "line 1" in str(err.value)
    with pytest.raises((DatasetError, FileNotFoundError)) as err:
        load_qa(tmp_path / "absent.jsonl")
    assert "absent.jsonl" in str(err.value)


def test_viewer_on_a_folder_without_trajectories_says_how_to_get_them(tmp_path):
    out = run_cli("view", str(tmp_path))  # an empty folder is no run: say what a valid target is
    assert "not a run, a demo or a trajectories file" in out and "trajectories/" in out
    (tmp_path / "config.yaml").write_text("seed: 1\n")  # a run trained without saving trajectories
    out = run_cli("view", str(tmp_path))
    assert "trajectories/" in out and "save_trajectories" in out
