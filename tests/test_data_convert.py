"""`searchrl data convert`: searchrl rows <-> Search-R1 parquet <-> FlashRAG JSONL, round trips both ways.

Every file here is made in the test: FlashRAG rows as FlashRAG publishes them (`golden_answers`, a
`metadata` object), and a Search-R1 parquet as its processing writes it (two datasets concatenated, ids
restarting at `train_0`, a chat-list `prompt`, `reward_model.ground_truth.target`, `extra_info`).
"""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from searchrl.cli import app
from searchrl.common.io import read_jsonl, write_jsonl
from searchrl.data.convert import (
    DEFAULT_PROMPT_TEMPLATE,
    ConvertError,
    convert,
    read_flashrag,
    read_rows,
    read_search_r1,
    write_rows,
)
from searchrl.data.datasets import load_qa
from searchrl.data.synthetic import generate, preset_config

runner = CliRunner()

FLASHRAG_ROWS = [
    {"id": "train_0", "question": "who wrote the novel dune", "golden_answers": ["Frank Herbert"]},
    {
        "id": "train_1",
        "question": "which river flows through cairo",
        "golden_answers": ["Nile", "the Nile", "Nile River"],
        "metadata": {
            "type": "bridge",
            "level": "hard",
            "supporting_facts": {"title": ["Cairo"], "sent_id": [0]},
        },
    },
    {"id": "train_2", "question": "what is the capital of peru", "golden_answers": ["Lima"], "metadata": {}},
]


def _sr1_rows(source: str, questions: list[tuple[str, list[str]]]) -> list[dict]:
    """Rows shaped as Search-R1's processing writes them (ids restart per dataset)."""
    return [
        {
            "id": f"train_{i}",
            "question": q,
            "golden_answers": golds,
            "data_source": source,
            "prompt": [{"role": "user", "content": f"Some instructions. Question: {q}\n"}],
            "ability": "fact-reasoning",
            "reward_model": {"style": "rule", "ground_truth": {"target": golds}},
            "extra_info": {"split": "train", "index": i},
        }
        for i, (q, golds) in enumerate(questions)
    ]


SR1_ROWS = _sr1_rows("nq", [("who sang let it be?", ["The Beatles"]), ("when was rome founded?", ["753 BC"])])
SR1_ROWS += _sr1_rows("hotpotqa", [("which city hosted the 1992 olympics?", ["Barcelona"])])


def _write_parquet(path, rows) -> None:
    pq.write_table(pa.Table.from_pylist(rows), path)


def test_searchrl_to_flashrag_and_back_keeps_every_field(tmp_path):
    rows = generate(preset_config("tiny", seed=3)).splits["dev"][:6]
    write_jsonl(tmp_path / "dev.jsonl", rows)
    convert([tmp_path / "dev.jsonl"], tmp_path / "flash.jsonl", "searchrl", "flashrag")
    written = list(read_jsonl(tmp_path / "flash.jsonl"))
    # FlashRAG's columns, our extra fields under metadata.searchrl (FlashRAG has no column for them).
    assert set(written[0]) == {"id", "question", "golden_answers", "metadata"}
    assert written[0]["golden_answers"] == rows[0]["golds"]
    assert written[0]["metadata"]["searchrl"]["hops"] == rows[0]["hops"]
    convert([tmp_path / "flash.jsonl"], tmp_path / "back.jsonl", "flashrag", "searchrl")
    assert load_qa(tmp_path / "back.jsonl") == load_qa(tmp_path / "dev.jsonl")


def test_flashrag_to_searchrl_and_back_is_the_same_file_content(tmp_path):
    write_jsonl(tmp_path / "nq" / "train.jsonl", FLASHRAG_ROWS)
    convert([tmp_path / "nq" / "train.jsonl"], tmp_path / "ours.jsonl", "flashrag", "searchrl")
    ours = load_qa(tmp_path / "ours.jsonl")
    assert [r["golds"] for r in ours] == [r["golden_answers"] for r in FLASHRAG_ROWS]
    assert ours[1]["metadata"]["type"] == "bridge"  # FlashRAG's own metadata stays one field
    convert([tmp_path / "ours.jsonl"], tmp_path / "again.jsonl", "searchrl", "flashrag")
    assert list(read_jsonl(tmp_path / "again.jsonl")) == FLASHRAG_ROWS


def test_search_r1_parquet_to_searchrl_and_back_is_the_same_table(tmp_path):
    _write_parquet(tmp_path / "train.parquet", SR1_ROWS)
    rows = read_search_r1(tmp_path / "train.parquet")
    # Two datasets whose ids restart: ours are prefixed with the dataset, so they are unique again.
    assert [r["id"] for r in rows] == ["nq-train_0", "nq-train_1", "hotpotqa-train_0"]
    assert [r["data_source"] for r in rows] == ["nq", "nq", "hotpotqa"]
    assert [r["golds"] for r in rows] == [["The Beatles"], ["753 BC"], ["Barcelona"]]
    assert rows[0]["question"] == "who sang let it be?"
    convert([tmp_path / "train.parquet"], tmp_path / "train.jsonl", "search-r1", "searchrl")
    convert([tmp_path / "train.jsonl"], tmp_path / "again.parquet", "searchrl", "search-r1")
    assert pq.read_table(tmp_path / "again.parquet").to_pylist() == SR1_ROWS


def test_searchrl_to_search_r1_writes_search_r1_columns_and_reads_back(tmp_path):
    rows = generate(preset_config("tiny", seed=4)).splits["train"][:5]
    write_jsonl(tmp_path / "train.jsonl", rows)
    convert(
        [tmp_path / "train.jsonl"], tmp_path / "train.parquet", "searchrl", "search-r1", data_source="synth"
    )
    table = pq.read_table(tmp_path / "train.parquet").to_pylist()
    first = table[0]
    assert first["data_source"] == "synth" and first["ability"] == "fact-reasoning"
    assert first["prompt"] == [
        {"role": "user", "content": DEFAULT_PROMPT_TEMPLATE.format(question=rows[0]["question"])}
    ]
    assert first["reward_model"] == {"style": "rule", "ground_truth": {"target": rows[0]["golds"]}}
    assert [r["extra_info"] for r in table[:2]] == [
        {"split": "train", "index": 0},
        {"split": "train", "index": 1},
    ]
    assert json.loads(first["metadata"])["searchrl"]["hops"] == rows[0]["hops"]
    # The pre-existing loader (HF datasets) reads the same golds from the file.
    assert [r["golds"] for r in load_qa(tmp_path / "train.parquet")] == [r["golds"] for r in rows]
    back = read_rows(tmp_path / "train.parquet", "search-r1")
    for original, again in zip(load_qa(tmp_path / "train.jsonl"), back, strict=True):
        assert again["id"] == f"synth-{original['id']}"
        assert {k: v for k, v in again.items() if k not in ("id", "data_source", "search_r1")} == {
            k: v for k, v in original.items() if k != "id"
        }
    # Written out again, the file is the same (the carried columns and original ids win).
    write_rows(back, tmp_path / "again.parquet", "search-r1")
    assert pq.read_table(tmp_path / "again.parquet").to_pylist() == table


def test_search_r1_file_without_question_column_reads_it_from_the_prompt(tmp_path):
    rows = [{k: v for k, v in r.items() if k not in ("question", "golden_answers", "id")} for r in SR1_ROWS]
    _write_parquet(tmp_path / "test.parquet", rows)
    read = read_search_r1(tmp_path / "test.parquet")
    assert [r["question"] for r in read] == [r["question"] for r in SR1_ROWS]
    assert read[2]["id"] == "hotpotqa-train_0"  # from extra_info's split and index


def test_cli_merges_flashrag_datasets_into_one_search_r1_file(tmp_path):
    write_jsonl(tmp_path / "nq" / "train.jsonl", FLASHRAG_ROWS[:2])
    write_jsonl(tmp_path / "hotpotqa" / "train.jsonl", FLASHRAG_ROWS[2:])
    out = tmp_path / "merged" / "train.parquet"
    args = ["data", "convert", "--from", "flashrag", "--to", "search-r1", "--question-mark"]
    result = runner.invoke(
        app,
        [*args, str(tmp_path / "nq" / "train.jsonl"), str(tmp_path / "hotpotqa" / "train.jsonl"), str(out)],
    )
    assert result.exit_code == 0, result.output
    assert "wrote 3 questions" in result.output and "'hotpotqa': 1, 'nq': 2" in result.output
    table = pq.read_table(out).to_pylist()
    assert [r["data_source"] for r in table] == ["nq", "nq", "hotpotqa"]
    assert [r["question"] for r in table] == [r["question"] + "?" for r in FLASHRAG_ROWS]
    assert [r["extra_info"]["split"] for r in table] == ["train"] * 3
    # Read back as ours: the merge's ids carry their dataset (once), and the golds are FlashRAG's.
    ours = read_search_r1(out)
    assert [r["id"] for r in ours] == ["nq-train_0", "nq-train_1", "hotpotqa-train_2"]
    assert [r["golds"] for r in ours] == [r["golden_answers"] for r in FLASHRAG_ROWS]


@pytest.mark.parametrize(
    ("setup", "args", "message"),
    [
        (None, ["--from", "parquet", "--to", "searchrl", "a", "b"], "unknown format 'parquet'"),
        (None, ["--from", "flashrag", "--to", "searchrl", "only_one"], "at least one input file and then"),
        (
            {"x.jsonl": [{"id": "a", "question": "q", "golds": ["g"]}]},
            ["--from", "flashrag", "--to", "searchrl", "x.jsonl", "y.jsonl"],
            "line 1: missing field 'golden_answers'",
        ),
        (
            {"x.jsonl": [{"id": "a", "question": "q", "golds": ["g"]}]},
            ["--from", "searchrl", "--to", "search-r1", "x.jsonl", "y.parquet"],
            "no data_source; pass --data-source NAME",
        ),
        (
            {"x.jsonl": [{"id": "a", "question": "q", "golds": ["g"]}]},
            ["--from", "searchrl", "--to", "flashrag", "x.jsonl", "y.parquet"],
            "a flashrag file must end in .jsonl",
        ),
        (
            {"x.jsonl": [{"id": "a", "question": "q", "golds": ["g"]}]},
            ["--from", "searchrl", "--to", "searchrl", "x.jsonl", "x.jsonl"],
            "the output is also an input",
        ),
    ],
)
def test_cli_refuses_bad_requests_naming_what_to_fix(tmp_path, monkeypatch, setup, args, message):
    monkeypatch.chdir(tmp_path)
    for name, rows in (setup or {}).items():
        write_jsonl(tmp_path / name, rows)
    result = runner.invoke(app, ["data", "convert", *args])
    assert result.exit_code != 0
    assert message in " ".join(result.output.split()), result.output


def test_repeated_ids_in_one_file_are_refused(tmp_path):
    write_jsonl(tmp_path / "a.jsonl", [FLASHRAG_ROWS[0], FLASHRAG_ROWS[0]])
    with pytest.raises(ConvertError, match="ids repeat"):
        convert([tmp_path / "a.jsonl"], tmp_path / "b.jsonl", "flashrag", "searchrl")
    _write_parquet(tmp_path / "t.parquet", SR1_ROWS[:1] * 2)
    with pytest.raises(ConvertError, match=r"ids repeat \(\['nq-train_0'\]\)"):
        read_search_r1(tmp_path / "t.parquet")


def test_flashrag_reader_names_the_line_of_a_bad_row(tmp_path):
    (tmp_path / "bad.jsonl").write_text(
        json.dumps(FLASHRAG_ROWS[0]) + "\n" + json.dumps({"id": "x", "golden_answers": ["a"]}) + "\n"
    )
    with pytest.raises(Exception, match=r"bad.jsonl: line 2: missing field 'question'"):
        read_flashrag(tmp_path / "bad.jsonl")


def test_search_r1_test_file_splits_into_benchmark_folders(tmp_path):
    """Search-R1's merged test.parquet (every set says split 'test') -> one FlashRAG folder per set, each file
    named by the split Search-R1 really took it from, as `searchrl eval --benchmarks` reads them."""
    from searchrl.evaluation.benchmarks import find_benchmark_files

    rows = _sr1_rows("nq", [("who wrote dune?", ["Frank Herbert"])])
    rows += _sr1_rows("hotpotqa", [("which city hosted 1992?", ["Barcelona"]), ("a?", ["b"])])
    rows += _sr1_rows("bamboogle", [("who was first?", ["Ada"])])
    for r in rows:
        r["extra_info"] = {"split": "test", "index": r["extra_info"]["index"]}
    _write_parquet(tmp_path / "test.parquet", rows)
    args = ["data", "convert", "--from", "search-r1", "--to", "flashrag", "--by-source"]
    result = runner.invoke(app, [*args, str(tmp_path / "test.parquet"), str(tmp_path / "bench")])
    assert result.exit_code == 0, result.output
    assert sorted(str(p.relative_to(tmp_path / "bench")) for p in (tmp_path / "bench").rglob("*.jsonl")) == [
        "bamboogle/test.jsonl",
        "hotpotqa/dev.jsonl",
        "nq/test.jsonl",
    ]
    assert [r["golden_answers"] for r in read_jsonl(tmp_path / "bench" / "hotpotqa" / "dev.jsonl")] == [
        ["Barcelona"],
        ["b"],
    ]
    found = find_benchmark_files(tmp_path / "bench", ["nq", "hotpotqa", "bamboogle"])
    assert [(f.benchmark.name, f.split, f.matches_search_r1) for f in found] == [
        ("nq", "test", True),
        ("hotpotqa", "dev", True),
        ("bamboogle", "test", True),
    ]
    result = runner.invoke(app, [*args, str(tmp_path / "test.parquet"), str(tmp_path / "one.jsonl")])
    assert result.exit_code == 1 and "the output is a folder" in result.output
