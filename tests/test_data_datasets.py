"""QA loaders: our JSONL, FlashRAG / Search-R1 rows, parquet and JSON through HF datasets, and clear errors."""

from __future__ import annotations

import gzip
import json

import datasets
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from searchrl.cli import app
from searchrl.common.io import write_jsonl
from searchrl.data.datasets import DatasetError, load_qa, load_split, normalize_qa_row
from searchrl.data.synthetic import generate, preset_config

runner = CliRunner()


def _write_lines(path, lines: list[str]) -> None:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")


def test_our_synthetic_rows_load_unchanged(tmp_path):
    task = generate(preset_config("tiny", seed=2))
    task.write(tmp_path)
    assert load_split(tmp_path, "dev") == task.splits["dev"]
    assert load_qa(tmp_path / "train.jsonl", limit=5) == task.splits["train"][:5]


def test_flashrag_rows_with_golden_answers_get_ids_and_our_schema(tmp_path):
    path = tmp_path / "nq_dev.jsonl"
    rows = [
        {
            "question": "who wrote hamlet ",
            "golden_answers": ["Shakespeare", "William Shakespeare"],
            "metadata": {},
        },
        {"id": "q7", "question": "capital of france", "answers": ["Paris"]},
        {"question": "largest planet", "answer": "Jupiter"},
    ]
    write_jsonl(path, rows)
    loaded = load_qa(path)
    assert [r["id"] for r in loaded] == ["nq_dev-000000", "q7", "nq_dev-000002"]
    assert loaded[0]["question"] == "who wrote hamlet"
    assert [r["golds"] for r in loaded] == [["Shakespeare", "William Shakespeare"], ["Paris"], ["Jupiter"]]
    assert loaded[0]["metadata"] == {} and loaded[0]["hops"] is None and loaded[0]["supporting_doc_ids"] == []
    assert "golden_answers" not in loaded[0]


def test_gzipped_jsonl_loads(tmp_path):
    path = tmp_path / "qa.jsonl.gz"
    path.write_bytes(gzip.compress(b'{"question": "q?", "golds": ["a"]}\n'))
    assert load_qa(path)[0]["golds"] == ["a"]


def test_search_r1_parquet_and_hf_json_load_through_datasets(tmp_path):
    parquet = tmp_path / "train.parquet"
    datasets.Dataset.from_list(
        [
            {
                "id": "train_0",
                "question": "who founded rome?",
                "golden_answers": ["Romulus", "Romulus and Remus"],
            },
            {"id": "train_1", "question": "what is h2o?", "golden_answers": ["water"]},
        ]
    ).to_parquet(str(parquet))
    rows = load_qa(parquet)
    assert [r["golds"] for r in rows] == [["Romulus", "Romulus and Remus"], ["water"]]
    # Search-R1's processed files keep the golds under reward_model.ground_truth.target.
    processed = tmp_path / "processed.parquet"
    datasets.Dataset.from_list(
        [{"question": "q one?", "reward_model": {"style": "rule", "ground_truth": {"target": ["one"]}}}]
    ).to_parquet(str(processed))
    assert load_qa(processed)[0]["golds"] == ["one"]
    as_json = tmp_path / "qa.json"
    as_json.write_text(json.dumps([{"question": "q?", "golden_answers": ["x", "y"]}]))
    assert load_qa(as_json)[0]["golds"] == ["x", "y"]


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('{"golds": ["a"]}', r"line 3: missing field 'question'; each row needs question and golds"),
        (
            '{"question": "q?"}',
            r"line 3: missing field 'golds'; each row needs question and golds \(or golden_answers",
        ),
        (
            '{"question": "q?", "golden_answers": [1, 2]}',
            r"line 3: field 'golden_answers' must be a string or a list",
        ),
        ('{"question": "q?", "golds": []}', r"line 3: field 'golds' has no non-empty answer"),
        ('{"question": "", "golds": ["a"]}', r"line 3: field 'question' must be a non-empty string"),
        ('{"question": "q?", "golds": ["a"], "hops": 0}', r"line 3: field 'hops' must be a positive integer"),
        ('{"question": "q?", "golds": "a"', r"line 3: not valid JSON"),
        ('["question", "golds"]', r"line 3: expected a JSON object"),
    ],
)
def test_a_bad_row_names_the_file_the_line_and_the_field(tmp_path, line, message):
    path = tmp_path / "bad.jsonl"
    _write_lines(path, ['{"question": "ok?", "golds": ["x"]}', "", line])
    with pytest.raises(DatasetError, match=message) as info:
        load_qa(path)
    assert str(path) in str(info.value)


def test_a_bad_parquet_row_names_the_row(tmp_path):
    path = tmp_path / "bad.parquet"
    datasets.Dataset.from_list(
        [{"question": "a?", "answer": "x"}, {"question": "b?", "answer": None}]
    ).to_parquet(str(path))
    with pytest.raises(DatasetError, match=r"bad.parquet: row 2: missing field 'golds'"):
        load_qa(path)


def test_file_level_errors_say_how_to_fix(tmp_path):
    with pytest.raises(DatasetError, match="file not found"):
        load_qa(tmp_path / "missing.jsonl")
    (tmp_path / "qa.csv").write_text("question,answer\n")
    with pytest.raises(DatasetError, match=r"use \.jsonl, \.jsonl\.gz, \.json or \.parquet"):
        load_qa(tmp_path / "qa.csv")
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(DatasetError, match="no rows"):
        load_qa(tmp_path / "empty.jsonl")
    write_jsonl(tmp_path / "dup.jsonl", [{"id": "a", "question": "q?", "golds": ["x"]}] * 2)
    with pytest.raises(DatasetError, match=r"ids must be unique, repeated: \['a'\]"):
        load_qa(tmp_path / "dup.jsonl")
    with pytest.raises(DatasetError, match="run `searchrl data synth"):
        load_split(tmp_path, "train")


_json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=8,
)
_row_keys = st.sampled_from(["question", "golds", "golden_answers", "answer", "answers", "id", "hops", "x"])


@settings(max_examples=300, deadline=None)
@given(row=st.dictionaries(_row_keys, _json_values, max_size=5))
def test_any_row_is_either_a_valid_row_or_a_dataset_error(row):
    try:
        out = normalize_qa_row(row, "f.jsonl: line 1", default_id="f-000000")
    except DatasetError as e:
        assert str(e).startswith("f.jsonl: line 1: ")
        return
    assert isinstance(out["question"], str) and out["question"]
    assert out["golds"] and all(isinstance(g, str) and g.strip() for g in out["golds"])
    assert isinstance(out["id"], str)


def test_data_check_command_reports_rows_and_errors(tmp_path):
    good = tmp_path / "good.jsonl"
    write_jsonl(good, [{"question": "q?", "golds": ["a"], "hops": 2}])
    result = runner.invoke(app, ["data", "check", str(good)])
    assert result.exit_code == 0 and "1 questions" in result.output
    bad = tmp_path / "bad.jsonl"
    _write_lines(bad, ['{"golds": ["a"]}'])
    result = runner.invoke(app, ["data", "check", str(bad)])
    assert result.exit_code == 1 and "missing field 'question'" in result.output
