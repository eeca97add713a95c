"""Real questions (HotpotQA distractor, SQuAD v1.1) over their own Wikipedia paragraphs: loaders, splits,
the written data directory, BM25 retrieval on it, errors on bad files and the CLI."""

from __future__ import annotations

import copy
import hashlib
import json
import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from searchrl.cli import app
from searchrl.data import realqa_files
from searchrl.data.datasets import DatasetError, load_qa
from searchrl.data.realqa import build_realqa, supporting_recall
from searchrl.data.realqa_files import load_hotpotqa, load_sources, load_squad
from searchrl.data.realqa_formats import doc_id, hotpotqa_from_items, squad_from_object
from searchrl.data.realqa_splits import SPLITS, split_questions, split_units
from searchrl.search.base import Hit
from searchrl.search.corpus import load_corpus
from searchrl.search.index import build_index

runner = CliRunner()
REPO = Path(__file__).resolve().parents[1]
HOTPOT_FILE = REPO / "data" / "realqa" / "hotpot_dev_distractor_v1-first53.json"
SQUAD_FILE = REPO / "data" / "realqa" / "squad-v1.1-dev-20articles.json"


@pytest.fixture(scope="module")
def raw_hotpot() -> list:
    return json.loads(HOTPOT_FILE.read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def raw_squad() -> dict:
    return json.loads(SQUAD_FILE.read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def hotpot():
    return load_hotpotqa(HOTPOT_FILE)


@pytest.fixture(scope="module")
def squad():
    return load_squad(SQUAD_FILE)


@pytest.fixture(scope="module")
def task():
    return build_realqa("both", seed=0)


@pytest.fixture(scope="module")
def written(task, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("realqa")
    task.write(out)
    return out


# -- the shipped files --------------------------------------------------------------------------------------


def test_shipped_files_are_the_attributed_copies():
    readme = (REPO / "data" / "realqa" / "README.md").read_text(encoding="utf-8")
    assert "CC BY-SA 4.0" in readme and "Yang et al., 2018" in readme and "Rajpurkar et al., 2016" in readme
    for path in (HOTPOT_FILE, SQUAD_FILE):
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        assert f"{digest}  {path.name}" in readme  # the README's checksum is the file's
    assert "Data attribution" in (REPO / "README.md").read_text(encoding="utf-8")


def test_hotpot_counts(hotpot, raw_hotpot):
    assert len(hotpot.questions) == 53 == len(raw_hotpot)
    assert sum(r["type"] == "bridge" for r in hotpot.questions) == 39
    assert sum(r["type"] == "comparison" for r in hotpot.questions) == 14
    assert hotpot.paragraph_slots == 522 == sum(len(item["context"]) for item in raw_hotpot)
    unique = {(title, "".join(sents)) for item in raw_hotpot for title, sents in item["context"]}
    assert len(hotpot.documents) == len(unique) == 521
    assert all(
        r["hops"] == 2 and r["source"] == "hotpotqa" and r["level"] == "hard" for r in hotpot.questions
    )
    assert [r["id"] for r in hotpot.questions] == [item["_id"] for item in raw_hotpot]


def test_squad_counts(squad, raw_squad):
    assert len(squad.questions) == 4196
    assert len(squad.documents) == squad.paragraph_slots == 745
    assert len({r["supporting_titles"][0] for r in squad.questions}) == len(raw_squad["data"]) == 20
    assert all(r["hops"] == 1 and r["type"] == "squad" and r["source"] == "squad" for r in squad.questions)
    assert {d["title"] for d in squad.documents} >= {"Super Bowl 50", "Prime number"}  # underscores -> spaces


def test_hotpot_documents_and_supporting_sentences(hotpot, raw_hotpot):
    docs = {d["id"]: d for d in hotpot.documents}
    for item, row in zip(raw_hotpot, hotpot.questions, strict=True):
        paragraphs = dict((title, sents) for title, sents in item["context"])
        for title, sents in paragraphs.items():  # every paragraph of every question is in the corpus, whole
            doc = docs[doc_id("hotpotqa", title, "".join(sents))]
            assert (doc["title"], doc["contents"]) == (title, "".join(sents))
        assert row["golds"] == [item["answer"]]
        assert row["supporting_titles"] == list(dict.fromkeys(t for t, _ in item["supporting_facts"]))
        by_title = {docs[d]["title"]: docs[d] for d in row["supporting_doc_ids"]}
        assert list(by_title) == row["supporting_titles"]
        for title, index in item["supporting_facts"]:
            assert paragraphs[title][index].strip() in by_title[title]["contents"]
        if item["answer"] not in ("yes", "no"):
            assert any(item["answer"] in d["contents"] for d in by_title.values())


def test_squad_documents_hold_their_answers(squad, raw_squad):
    docs = {d["id"]: d for d in squad.documents}
    rows = iter(squad.questions)
    for article in raw_squad["data"]:
        for paragraph in article["paragraphs"]:
            for qa in paragraph["qas"]:
                row = next(rows)
                assert row["id"] == qa["id"]
                assert row["golds"] == list(dict.fromkeys(a["text"].strip() for a in qa["answers"]))
                assert len(set(row["golds"])) == len(row["golds"]) >= 1
                doc = docs[row["supporting_doc_ids"][0]]
                assert doc["contents"] == paragraph["context"]
                assert doc["title"] == article["title"].replace("_", " ") == row["supporting_titles"][0]
                assert all(g in doc["contents"] for g in row["golds"])


def test_every_supporting_doc_is_in_the_corpus_and_golds_are_non_empty(task):
    ids = {d["id"] for d in task.corpus}
    assert len(ids) == len(task.corpus) == 521 + 745
    rows = [r for split in SPLITS for r in task.splits[split]]
    assert len(rows) == 53 + 4196
    for row in rows:
        assert row["supporting_doc_ids"] and set(row["supporting_doc_ids"]) <= ids
        assert row["golds"] and all(isinstance(g, str) and g.strip() for g in row["golds"])


def test_doc_ids_are_content_hashes(hotpot):
    doc = hotpot.documents[0]
    expected = hashlib.sha256(f"{doc['title']}\x00{doc['contents']}".encode()).hexdigest()[:12]
    assert doc["id"] == f"hotpot-{expected}"
    assert doc_id("squad", doc["title"], doc["contents"]) == f"squad-{expected}"


@settings(max_examples=15, deadline=None)
@given(order=st.permutations(range(53)), seed=st.integers(0, 3))
def test_ids_and_splits_do_not_depend_on_question_order(raw_hotpot, hotpot, order, seed):
    shuffled = hotpotqa_from_items([raw_hotpot[i] for i in order], "shuffled")
    assert shuffled.documents == hotpot.documents
    assert {r["id"]: r for r in shuffled.questions} == {r["id"]: r for r in hotpot.questions}
    assert split_questions(shuffled.questions, "hotpotqa", seed) == split_questions(
        hotpot.questions, "hotpotqa", seed
    )


# -- splits ---------------------------------------------------------------------------------------------------


def _ids(splits: dict) -> dict[str, set[str]]:
    return {s: {r["id"] for r in rows} for s, rows in splits.items()}


@pytest.mark.parametrize("source", ["hotpotqa", "squad"])
def test_splits_are_disjoint_complete_and_deterministic(hotpot, squad, source):
    data = hotpot if source == "hotpotqa" else squad
    splits = split_questions(data.questions, source, seed=0)
    ids = _ids(splits)
    assert (
        not (ids["train"] & ids["dev"])
        and not (ids["train"] & ids["test"])
        and not (ids["dev"] & ids["test"])
    )
    assert set().union(*ids.values()) == {r["id"] for r in data.questions}
    assert all(ids.values())
    assert split_questions(data.questions, source, seed=0) == splits
    assert _ids(split_questions(data.questions, source, seed=1)) != ids


def test_squad_test_articles_never_in_train(squad):
    for seed in range(5):
        splits = split_questions(squad.questions, "squad", seed=seed)
        articles = {s: {r["supporting_titles"][0] for r in rows} for s, rows in splits.items()}
        assert articles["test"] and articles["dev"]
        assert not (articles["test"] & articles["train"]) and not (articles["dev"] & articles["train"])
        assert not (articles["test"] & articles["dev"])
        train_docs = {d for r in splits["train"] for d in r["supporting_doc_ids"]}
        assert not any(d in train_docs for r in splits["test"] for d in r["supporting_doc_ids"])


def test_split_fractions_and_caps(hotpot, squad):
    sizes = {s: len(v) for s, v in split_questions(hotpot.questions, "hotpotqa", 0, 0.1, 0.2).items()}
    assert sizes == {"train": 37, "dev": 5, "test": 11}  # round(5.3), round(10.6): by question
    squad_splits = split_questions(squad.questions, "squad", 0, 0.1, 0.2)
    largest_article = max(len(u) for u in split_units(squad.questions, "squad"))
    for split, fraction in (("dev", 0.1), ("test", 0.2)):  # whole articles: within one article of the target
        assert abs(len(squad_splits[split]) - fraction * 4196) <= largest_article
    capped = split_questions(squad.questions, "squad", 0, 0.1, 0.2, {"train": 100, "test": 7})
    assert [len(capped[s]) for s in SPLITS] == [100, len(squad_splits["dev"]), 7]
    assert capped["train"] == squad_splits["train"][:100]  # a cap takes a prefix, never moves a question
    no_dev = split_questions(hotpot.questions, "hotpotqa", 0, 0.0, 0.2)
    assert no_dev["dev"] == [] and len(no_dev["train"]) == 42


def test_split_refuses_bad_fractions(hotpot):
    with pytest.raises(ValueError, match=r"test_fraction must be in \[0, 1\), got 1.5"):
        split_questions(hotpot.questions, "hotpotqa", test_fraction=1.5)
    with pytest.raises(ValueError, match="must leave questions for training"):
        split_questions(hotpot.questions, "hotpotqa", dev_fraction=0.5, test_fraction=0.5)
    with pytest.raises(ValueError, match="leave none for training"):
        split_questions(hotpot.questions[:2], "hotpotqa", dev_fraction=0.4, test_fraction=0.4)


def test_questions_sharing_a_supporting_paragraph_stay_together(hotpot):
    rows = copy.deepcopy(hotpot.questions[:20])
    for row in rows[1:]:  # every question now shares question 0's first supporting paragraph
        row["supporting_doc_ids"] = [rows[0]["supporting_doc_ids"][0], *row["supporting_doc_ids"][1:]]
    rows += copy.deepcopy(hotpot.questions[20:])
    splits = split_questions(rows, "hotpotqa", seed=0)
    together = {r["id"] for r in rows[:20]}
    assert sum(bool(together & ids) for ids in _ids(splits).values()) == 1


# -- the written directory -------------------------------------------------------------------------------


def test_written_dir_round_trips_through_the_readers(task, written):
    for split in SPLITS:
        assert load_qa(written / f"{split}.jsonl") == task.splits[split]
    docs = load_corpus(written / "corpus.jsonl")
    assert [(d.id, d.title, d.text) for d in docs] == [
        (d["id"], d["title"], d["contents"]) for d in task.corpus
    ]
    meta = json.loads((written / "meta.json").read_text())
    assert meta["counts"] == {"documents": 1266, **{s: len(task.splits[s]) for s in SPLITS}}
    assert meta["seed"] == 0 and meta["corpus_format"] == "searchrl" and "CC BY-SA 4.0" in meta["licence"]
    for source, path in (("hotpotqa", HOTPOT_FILE), ("squad", SQUAD_FILE)):
        recorded = meta["sources"][source]["files"]
        assert recorded == [{"name": path.name, "sha256": hashlib.sha256(path.read_bytes()).hexdigest()}]
    assert meta["sources"]["squad"]["split_rule"].startswith("by article")
    for name, digest in meta["written_files_sha256"].items():
        assert hashlib.sha256((written / name).read_bytes()).hexdigest() == digest


def test_writing_is_byte_identical_and_search_r1_format_reads_the_same(task, written, tmp_path):
    again = build_realqa("both", seed=0).write(tmp_path / "again")
    for name in ("corpus.jsonl", "train.jsonl", "dev.jsonl", "test.jsonl", "meta.json"):
        assert (tmp_path / "again" / name).read_bytes() == (written / name).read_bytes(), name
    task.write(tmp_path / "r1", corpus_format="search-r1")
    first = json.loads((tmp_path / "r1" / "corpus.jsonl").read_text().splitlines()[0])
    assert set(first) == {"id", "contents"} and first["contents"].startswith('"')
    assert load_corpus(tmp_path / "r1" / "corpus.jsonl") == load_corpus(again["corpus"])
    with pytest.raises(ValueError, match="unknown corpus format"):
        task.write(tmp_path / "x", corpus_format="parquet")


def test_bm25_finds_the_supporting_paragraph(task, written):
    backend = build_index(written / "corpus.jsonl", written / "index")
    rows = [r for split in SPLITS for r in task.splits[split]]
    hot = supporting_recall(backend, [r for r in rows if r["source"] == "hotpotqa"])
    sq = supporting_recall(backend, [r for r in rows if r["source"] == "squad"])
    # Measured on the shared 1,266-doc corpus (docs/data.md): HotpotQA any@1 0.72, any@3 0.87, all@3 0.36;
    # SQuAD @1 0.78, @3 0.92. The question alone rarely finds both HotpotQA paragraphs: that is the 2nd hop.
    assert hot["n"] == 53 and sq["n"] == 4196
    assert hot["any@1"] >= 0.70 and hot["any@3"] >= 0.85 and 0.2 <= hot["all@3"] < hot["any@3"]
    assert sq["any@1"] >= 0.75 and sq["any@3"] >= 0.90 and sq["all@3"] == sq["any@3"]


class _FixedBackend:
    """Answers every query with the same ranked ids."""

    fingerprint = "fixed"

    def __init__(self, ranked: list[str]) -> None:
        self.ranked = ranked

    def search(self, queries: list[str], k: int) -> list[list[Hit]]:
        return [[Hit(d, 1.0, "", "") for d in self.ranked[:k]] for _ in queries]


def test_supporting_recall_counts_any_and_all():
    rows = [
        {"question": "q1", "supporting_doc_ids": ["a", "c"]},
        {"question": "q2", "supporting_doc_ids": ["b"]},
        {"question": "q3", "supporting_doc_ids": ["z"]},
    ]
    got = supporting_recall(_FixedBackend(["a", "b", "c"]), rows, ks=(1, 3), batch_size=2)
    assert got == {"n": 3.0, "any@1": 1 / 3, "all@1": 0.0, "any@3": 2 / 3, "all@3": 2 / 3}


# -- bad files -------------------------------------------------------------------------------------------------


def _write(tmp_path: Path, name: str, obj) -> Path:
    path = tmp_path / name
    path.write_text(obj if isinstance(obj, str) else json.dumps(obj), encoding="utf-8")
    return path


def _break_hotpot(items: list, case: str) -> tuple[list, str, str]:
    """Mutate item 1 of `items`; returns (items, field named in the error, what the error says)."""
    item = items[1]
    if case == "missing context":
        del item["context"]
        return items, "'context'", "missing"
    if case == "fact title not in context":
        item["supporting_facts"][0][0] = "No Such Page"
        return items, "'supporting_facts[0][0]'", "'No Such Page' is not in this item's context"
    if case == "sentence index out of range":
        title = item["supporting_facts"][1][0]
        n = len(dict(item["context"])[title])
        item["supporting_facts"][1][1] = n
        return (
            items,
            "'supporting_facts[1][1]'",
            f"sentence index {n} is out of range: paragraph {title!r} has {n}",
        )
    if case == "sentence index not an integer":
        item["supporting_facts"][0][1] = "0"
        return items, "'supporting_facts[0][1]'", "a sentence index (an integer)"
    if case == "sentences not a list":
        item["context"][3][1] = "one string"
        return items, "'context[3][1]'", "a non-empty list of sentence strings"
    if case == "bad type":
        item["type"] = "multi"
        return items, "'type'", "'bridge' or 'comparison'"
    if case == "answer not a string":
        item["answer"] = 7
        return items, "'answer'", "got int 7"
    if case == "repeated id":
        item["_id"] = items[0]["_id"]
        return items, "'_id'", "repeated (item 0 has the same id)"
    raise AssertionError(case)


HOTPOT_CASES = [
    "missing context",
    "fact title not in context",
    "sentence index out of range",
    "sentence index not an integer",
    "sentences not a list",
    "bad type",
    "answer not a string",
    "repeated id",
]


@pytest.mark.parametrize("case", HOTPOT_CASES)
def test_bad_hotpot_items_name_file_item_and_field(raw_hotpot, tmp_path, case):
    items, field, says = _break_hotpot(copy.deepcopy(raw_hotpot[:3]), case)
    path = _write(tmp_path, "hotpot.json", items)
    with pytest.raises(DatasetError) as err:
        load_hotpotqa(path)
    message = str(err.value)
    assert message.startswith(f"{path}: item 1 (_id {items[1]['_id']!r}): field {field}"), message
    assert says in message and "expected" in message


def _break_squad(obj: dict, case: str) -> tuple[dict, str, str]:
    qa = obj["data"][0]["paragraphs"][1]["qas"][2]
    if case == "answer not a string":
        qa["answers"][0]["text"] = 42
        return obj, "field 'answers[0].text'", "got int 42; expected the answer text, a non-empty string"
    if case == "answer not in paragraph":
        qa["answers"][1]["text"] = "words that are nowhere"
        return obj, "field 'answers[1].text'", "does not occur in the paragraph"
    if case == "missing question":
        del qa["question"]
        return obj, "field 'question'", "missing"
    if case == "empty answers":
        qa["answers"] = []
        return obj, "field 'answers'", "got list []"
    raise AssertionError(case)


@pytest.mark.parametrize(
    "case", ["answer not a string", "answer not in paragraph", "missing question", "empty answers"]
)
def test_bad_squad_questions_name_file_item_and_field(raw_squad, tmp_path, case):
    obj = {"version": "1.1", "data": [copy.deepcopy(raw_squad["data"][0])]}
    qid = obj["data"][0]["paragraphs"][1]["qas"][2]["id"]
    obj, field, says = _break_squad(obj, case)
    path = _write(tmp_path, "squad.json", obj)
    with pytest.raises(DatasetError) as err:
        load_squad(path)
    message = str(err.value)
    where = f"{path}: data[0] (title 'Super_Bowl_50') paragraphs[1] qas[2] (id {qid!r}): {field}"
    assert message.startswith(where), message
    assert says in message


def test_bad_top_levels_and_invalid_json(raw_hotpot, raw_squad, tmp_path):
    squad_path = _write(tmp_path, "s.json", {"version": "1.1", "data": raw_squad["data"][:1]})
    with pytest.raises(
        DatasetError, match=r"top level is a JSON object, expected a JSON list.*looks like a SQuAD"
    ):
        load_hotpotqa(squad_path)
    hotpot_path = _write(tmp_path, "h.json", raw_hotpot[:2])
    with pytest.raises(DatasetError, match=r"top level is a JSON list.*looks like a HotpotQA"):
        load_squad(hotpot_path)
    with pytest.raises(DatasetError, match=r"h2.json: item 0: expected a JSON object, got str"):
        load_hotpotqa(_write(tmp_path, "h2.json", ["not an item"]))
    broken = _write(tmp_path, "broken.json", '[\n  {"_id": "a",\n   "question": "q" "answer": "x"}\n]')
    with pytest.raises(DatasetError) as err:
        load_hotpotqa(broken)
    assert re.search(
        rf"{re.escape(str(broken))}: not valid JSON at line 3, column \d+: Expecting ','", str(err.value)
    )
    with pytest.raises(DatasetError, match="missing.json: file not found"):
        load_squad(tmp_path / "missing.json")
    with pytest.raises(DatasetError, match=r"neither HotpotQA.*nor SQuAD"):
        load_sources("both", [_write(tmp_path, "n.json", {"rows": []})])


def test_files_of_both_sources_are_told_apart_and_ids_must_not_collide(raw_hotpot, raw_squad, tmp_path):
    hot = _write(tmp_path, "a.json", raw_hotpot[:4])
    sq_obj = {"version": "1.1", "data": raw_squad["data"][:1]}
    sq = _write(tmp_path, "b.json", sq_obj)
    loaded = load_sources("both", [sq, hot])  # order does not matter: the shape tells the dataset
    assert len(loaded["hotpotqa"].questions) == 4 and len(loaded["squad"].questions) > 100
    with pytest.raises(DatasetError, match=r"needs a squad file too"):
        load_sources("both", [hot])
    sq_obj = copy.deepcopy(sq_obj)
    sq_obj["data"][0]["paragraphs"][0]["qas"][0]["id"] = raw_hotpot[0]["_id"]
    with pytest.raises(
        DatasetError, match=rf"question id '{raw_hotpot[0]['_id']}' is in both hotpotqa and squad"
    ):
        build_realqa("both", [hot, _write(tmp_path, "c.json", sq_obj)])


def test_in_memory_parsers_name_their_source():
    with pytest.raises(DatasetError, match=r"^mine: the list is empty"):
        hotpotqa_from_items([], "mine")
    with pytest.raises(DatasetError, match=r"^theirs: field 'data': got list \[\]"):
        squad_from_object({"data": []}, "theirs")


def test_missing_shipped_files_say_to_pass_files(monkeypatch, tmp_path):
    monkeypatch.setattr(realqa_files, "REALQA_DIR", tmp_path)
    with pytest.raises(DatasetError, match=r"installed outside its repository.*--files PATH"):
        build_realqa("squad")
    result = runner.invoke(app, ["data", "realqa", "--source", "squad", "--out", str(tmp_path / "o")])
    assert result.exit_code == 1 and "--files PATH" in result.output


# -- CLI -------------------------------------------------------------------------------------------------------


def _flat(output: str) -> str:
    """CLI output without rich's box drawing and line wrapping."""
    return " ".join(re.sub(r"[│╭╮╰╯─]", " ", output).split())


def test_cli_writes_a_data_dir_that_searchrl_index_reads(tmp_path):
    out = tmp_path / "hp"
    result = runner.invoke(
        app,
        [
            "data",
            "realqa",
            "--source",
            "hotpotqa",
            "--out",
            str(out),
            "--seed",
            "3",
            "--test-fraction",
            "0.3",
        ],
    )
    assert result.exit_code == 0, result.output
    assert (
        "wrote 521 documents" in result.output
        and f"searchrl index --corpus {out / 'corpus.jsonl'}" in result.output
    )
    sizes = {s: len(load_qa(out / f"{s}.jsonl")) for s in SPLITS}
    assert sizes == {"train": 32, "dev": 5, "test": 16}
    meta = json.loads((out / "meta.json").read_text())
    assert meta["seed"] == 3 and meta["test_fraction"] == 0.3 and list(meta["sources"]) == ["hotpotqa"]
    indexed = runner.invoke(
        app, ["index", "--corpus", str(out / "corpus.jsonl"), "--out", str(out / "index")]
    )
    assert indexed.exit_code == 0 and "indexed 521 documents" in indexed.output


def test_cli_explicit_files_caps_and_format(raw_squad, tmp_path):
    sq = _write(tmp_path, "sq.json", {"version": "1.1", "data": raw_squad["data"][:6]})
    out = tmp_path / "sq"
    args = ["data", "realqa", "--source", "squad", "--files", str(sq), "--out", str(out), "--max-train", "50"]
    result = runner.invoke(app, [*args, "--corpus-format", "search-r1"])
    assert result.exit_code == 0, result.output
    assert len(load_qa(out / "train.jsonl")) == 50
    assert set(json.loads((out / "corpus.jsonl").read_text().splitlines()[0])) == {"id", "contents"}


def test_cli_errors(raw_hotpot, tmp_path):
    bad = copy.deepcopy(raw_hotpot[:2])
    del bad[1]["context"]
    path = _write(tmp_path, "bad.json", bad)
    result = runner.invoke(
        app, ["data", "realqa", "--source", "hotpotqa", "--files", str(path), "--out", str(tmp_path)]
    )
    assert result.exit_code == 1
    assert f"{path}: item 1 (_id {bad[1]['_id']!r}): field 'context': missing" in result.output
    result = runner.invoke(app, ["data", "realqa", "--source", "nq", "--out", str(tmp_path / "x")])
    assert result.exit_code == 2 and "unknown source 'nq'; choose hotpotqa, squad or both" in _flat(
        result.output
    )
    result = runner.invoke(
        app,
        ["data", "realqa", "--out", str(tmp_path / "x"), "--dev-fraction", "0.6", "--test-fraction", "0.5"],
    )
    assert result.exit_code == 2 and "must leave questions for training" in _flat(result.output)
    assert not (tmp_path / "x").exists()


def test_cli_help():
    result = runner.invoke(app, ["data", "realqa", "--help"])
    assert result.exit_code == 0
    for option in (
        "--source",
        "--out",
        "--seed",
        "--dev-fraction",
        "--test-fraction",
        "--files",
        "--max-train",
    ):
        assert option in result.output
    assert "realqa" in runner.invoke(app, ["data", "--help"]).output
