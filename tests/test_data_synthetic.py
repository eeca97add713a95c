"""The synthetic task: deterministic, split without leakage, answerable from its supporting documents."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import bm25s
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from searchrl.cli import app
from searchrl.common.config import ConfigError
from searchrl.common.io import read_jsonl
from searchrl.data.synthetic import generate, preset_config
from searchrl.data.synthetic_text import RELATION_WORDS, expert_queries
from searchrl.data.synthetic_world import SPLITS, SynthConfig
from searchrl.rewards.qa import contains_answer, normalize_answer
from searchrl.search.index import build_index

runner = CliRunner()


@pytest.fixture(scope="module")
def task():
    return generate(preset_config("tiny", seed=7))


@pytest.fixture(scope="module")
def small_task():
    return generate(preset_config("small", seed=11))


def _doc_text(doc: dict) -> str:
    return f"{doc['title']}\n{doc['contents']}"


def _assert_no_test_answer_in_train(task) -> None:
    train_questions = [f" {normalize_answer(r['question'])} " for r in task.splits["train"]]
    train_golds = {normalize_answer(g) for r in task.splits["train"] for g in r["golds"]}
    for held_out in ("test", "dev"):
        for row in task.splits[held_out]:
            for gold in row["golds"]:
                needle = f" {normalize_answer(gold)} "
                assert not any(needle in q for q in train_questions), (held_out, row, gold)
                assert normalize_answer(gold) not in train_golds, (held_out, row, gold)


def _assert_supported(task) -> None:
    docs = {d["id"]: d for d in task.corpus}
    for split in SPLITS:
        for row in task.splits[split]:
            support = [docs[i] for i in row["supporting_doc_ids"]]
            assert len(support) == row["hops"]
            # The last hop's document states the answer; the gold's canonical name is in it.
            assert contains_answer(_doc_text(support[-1]), row["golds"][0]), row
            # The first document is about the entity the question names.
            assert contains_answer(row["question"], support[0]["title"]), row
            if row["hops"] == 2:
                # The chain is connected: the second document's subject is named in the first one.
                assert contains_answer(support[0]["contents"], support[1]["title"]), row


def test_same_seed_gives_byte_identical_files_and_other_seed_differs(tmp_path):
    dirs = [tmp_path / "a", tmp_path / "b", tmp_path / "c"]
    for d, seed in zip(dirs, (5, 5, 6), strict=True):
        result = runner.invoke(app, ["data", "synth", "--out", str(d), "--seed", str(seed), "--size", "tiny"])
        assert result.exit_code == 0, result.output
    for name in ("corpus.jsonl", "train.jsonl", "dev.jsonl", "test.jsonl", "synth_config.json"):
        assert (dirs[0] / name).read_bytes() == (dirs[1] / name).read_bytes(), name
    assert (dirs[0] / "corpus.jsonl").read_bytes() != (dirs[2] / "corpus.jsonl").read_bytes()
    assert list(read_jsonl(dirs[0] / "test.jsonl")) == generate(preset_config("tiny", seed=5)).splits["test"]


def test_test_answers_never_appear_in_train_questions(task, small_task):
    _assert_no_test_answer_in_train(task)
    _assert_no_test_answer_in_train(small_task)


def test_every_question_is_answered_by_its_supporting_documents(task, small_task):
    _assert_supported(task)
    _assert_supported(small_task)


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(min_value=0, max_value=2**31 - 1), two_hop_share=st.floats(0.0, 1.0))
def test_split_and_support_invariants_hold_for_any_seed(seed, two_hop_share):
    task = generate(preset_config("tiny", seed=seed, two_hop_share=two_hop_share))
    _assert_no_test_answer_in_train(task)
    _assert_supported(task)


def test_rows_follow_the_schema_and_sizes_are_configurable(task):
    assert {s: len(rows) for s, rows in task.splits.items()} == {"train": 60, "dev": 20, "test": 20}
    ids = [r["id"] for s in SPLITS for r in task.splits[s]]
    assert len(ids) == len(set(ids))
    doc_ids = [d["id"] for d in task.corpus]
    assert len(doc_ids) == len(set(doc_ids)) and all(re.fullmatch(r"d\d{6}", i) for i in doc_ids)
    for row in task.splits["train"]:
        assert set(row) == {
            "id",
            "question",
            "golds",
            "hops",
            "supporting_doc_ids",
            "answer_type",
            "relation",
            "subject",
            "bridge",
        }
        assert (row["bridge"] is None) == (row["hops"] == 1) and contains_answer(
            row["question"], row["subject"]
        )
        assert row["question"].endswith("?") and row["golds"] and row["hops"] in (1, 2)
    # Two-hop share is honoured exactly when the world has enough of each kind.
    n_two = sum(r["hops"] == 2 for r in task.splits["train"])
    assert n_two == round(60 * 0.4)
    only_one = generate(preset_config("tiny", seed=7, two_hop_share=0.0))
    assert all(r["hops"] == 1 for s in SPLITS for r in only_one.splits[s])
    bigger = generate(preset_config("tiny", seed=7, train_questions=100, distractors_per_fact=2))
    assert len(bigger.splits["train"]) == 100 and len(bigger.corpus) > len(task.corpus)


def test_aliases_are_golds_and_are_stated_in_the_corpus(small_task):
    aliased = [r for s in SPLITS for r in small_task.splits[s] if len(r["golds"]) > 1]
    assert aliased, "the small world should have questions whose answers have aliases"
    corpus_text = " ".join(_doc_text(d) for d in small_task.corpus)
    for row in aliased:
        # The alias is the distinctive word of the full name ("Port Velmora" -> "Velmora").
        assert contains_answer(row["golds"][0], row["golds"][1]) and row["golds"][0] != row["golds"][1]
        if row["answer_type"] == "place":
            assert contains_answer(corpus_text, f"also called {row['golds'][1]}")


def test_bm25_on_the_question_ranks_the_first_supporting_document_first(small_task):
    texts = [_doc_text(d) for d in small_task.corpus]
    retriever = bm25s.BM25()
    retriever.index(bm25s.tokenize(texts, stopwords="en", show_progress=False), show_progress=False)
    for split in ("train", "test"):
        rows = small_task.splits[split]
        tokens = bm25s.tokenize([r["question"] for r in rows], stopwords="en", show_progress=False)
        top, _ = retriever.retrieve(tokens, k=1, show_progress=False)
        hits = [small_task.corpus[top[i, 0]]["id"] == r["supporting_doc_ids"][0] for i, r in enumerate(rows)]
        assert sum(hits) / len(hits) >= 0.85, split


def test_distractors_share_names_but_each_answer_is_unique(task):
    by_title: dict[str, list[dict]] = {}
    for doc in task.corpus:
        by_title.setdefault(doc["title"], []).append(doc)
    # Mention distractors share their subject's title, so a name alone does not find the fact.
    assert sum(1 for docs in by_title.values() if len(docs) > 1) > 10
    for split in SPLITS:
        for row in task.splits[split]:
            if row["hops"] != 1:
                continue
            subject_docs = by_title[next(t for t in by_title if contains_answer(row["question"], t))]
            stating = [
                d["id"] for d in subject_docs if RELATION_WORDS[row["relation"]] in d["contents"].split()
            ]
            assert stating == row["supporting_doc_ids"], row


def test_too_many_questions_and_bad_configs_are_refused_with_a_fix():
    with pytest.raises(ConfigError, match=r"asked for 5000 test questions.*lower test_questions"):
        generate(preset_config("tiny", test_questions=5000))
    with pytest.raises(ConfigError, match="num_cities"):
        SynthConfig(num_countries=10, num_cities=3)
    with pytest.raises(ConfigError, match="two_hop_share"):
        SynthConfig(two_hop_share=1.5)
    with pytest.raises(ConfigError, match="unknown size"):
        preset_config("huge")


def test_cli_reads_a_yaml_config_and_rejects_unknown_fields(tmp_path):
    cfg = tmp_path / "synth.yaml"
    cfg.write_text("num_people: 70\ntrain_questions: 30\n")
    out = tmp_path / "out"
    result = runner.invoke(app, ["data", "synth", "--out", str(out), "--size", "tiny", "--config", str(cfg)])
    assert result.exit_code == 0, result.output
    assert len(list(read_jsonl(out / "train.jsonl"))) == 30
    cfg.write_text("num_peeple: 70\n")
    result = runner.invoke(app, ["data", "synth", "--out", str(out), "--size", "tiny", "--config", str(cfg)])
    assert result.exit_code != 0 and "num_peeple" in result.output


def test_every_data_command_has_help():
    for args in (["data", "--help"], ["data", "synth", "--help"], ["data", "check", "--help"]):
        result = runner.invoke(app, args)
        assert result.exit_code == 0 and "Usage" in result.output
    assert "--size" in runner.invoke(app, ["data", "synth", "--help"]).output


def test_searchrl_bm25_finds_every_hop_with_the_expert_queries(task, tmp_path):
    """Through the search room's own index (k1 0.9, b 0.4, stemming): the question and each expert query
    put the supporting document of their hop first, so the task is learnable by searching."""
    paths = task.write(tmp_path / "data")
    backend = build_index(paths["corpus"], tmp_path / "index", backend="bm25")
    rows = [r for s in SPLITS for r in task.splits[s]]
    by_question = backend.search([r["question"] for r in rows], 1)
    assert sum(
        h[0].doc_id == r["supporting_doc_ids"][0] for h, r in zip(by_question, rows, strict=True)
    ) >= 0.95 * len(rows)
    queries = [
        (q, doc) for r in rows for q, doc in zip(expert_queries(r), r["supporting_doc_ids"], strict=True)
    ]
    hits = backend.search([q for q, _ in queries], 1)
    assert sum(h[0].doc_id == doc for h, (_, doc) in zip(hits, queries, strict=True)) >= 0.95 * len(queries)
    two_hop = next(r for r in rows if r["hops"] == 2)
    assert expert_queries(two_hop)[1].startswith(two_hop["bridge"])


def test_files_are_identical_across_processes_with_different_hash_seeds(tmp_path):
    """String hashing differs per process; nothing in generation may depend on set or dict-of-hash order."""
    script = "import sys; from searchrl.data.synthetic import generate, preset_config; "
    script += "generate(preset_config('tiny', seed=9)).write(sys.argv[1])"
    for hash_seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": hash_seed}
        subprocess.run(
            [sys.executable, "-c", script, str(tmp_path / hash_seed)], check=True, env=env, timeout=60
        )
    for name in ("corpus.jsonl", "train.jsonl", "test.jsonl"):
        assert (tmp_path / "1" / name).read_bytes() == (tmp_path / "2" / name).read_bytes(), name


def test_seed_comes_from_the_option_else_the_config_file(tmp_path):
    cfg = tmp_path / "synth.yaml"
    cfg.write_text("seed: 5\n")
    base = ["data", "synth", "--size", "tiny", "--config", str(cfg), "--out"]
    assert runner.invoke(app, [*base, str(tmp_path / "from_yaml")]).exit_code == 0
    assert runner.invoke(app, [*base, str(tmp_path / "from_option"), "--seed", "6"]).exit_code == 0
    expected = {5: generate(preset_config("tiny", seed=5)), 6: generate(preset_config("tiny", seed=6))}
    assert list(read_jsonl(tmp_path / "from_yaml" / "corpus.jsonl")) == expected[5].corpus
    assert list(read_jsonl(tmp_path / "from_option" / "corpus.jsonl")) == expected[6].corpus


# -- practice worlds: the same name words, other facts, no held-out entity ---------------------------------


@pytest.fixture(scope="module")
def practice(small_task):
    from searchrl.data.synthetic import practice_world

    return [practice_world(small_task, seed=s) for s in (101, 102, 103)]


def test_practice_worlds_never_name_a_held_out_entity(small_task, practice):
    from searchrl.data.synthetic import held_out_names

    held = held_out_names(small_task)
    assert len(held) > 50  # dev + test entities' names and aliases
    for world in practice:
        names = {g.lower() for ent in world.entities.values() for g in ent.golds}
        assert not names & held
        for doc in world.corpus:
            assert doc["title"].lower() not in held, doc  # look-alike distractors included
        for row in world.splits["train"]:
            for name in [*row["golds"], row["subject"], row["bridge"] or ""]:
                assert name.lower() not in held, row
        assert world.splits["dev"] == [] and world.splits["test"] == []


def test_practice_worlds_reuse_the_name_words_and_cover_the_held_out_ones(small_task, practice):
    from searchrl.data.synthetic import name_words

    words = set(name_words(small_task))
    held_words = {
        w for ent in small_task.entities.values() if ent.split != "train" for w in ent.name.split()
    } & words
    written = set()
    for world in practice:
        own = set(name_words(world))
        assert len(own & words) >= 0.95 * len(own)  # drawn from the task's words, a few invented when short
        # every word the answer of a practice question is made of is one the policy is trained to write
        written |= {w for row in world.splits["train"] for g in row["golds"] for w in g.split()}
        written |= {w for row in world.splits["train"] for w in row["subject"].split()}
    assert len(held_words & written) >= 0.97 * len(held_words), sorted(held_words - written)[:20]


def test_practice_worlds_have_their_own_facts_and_are_deterministic(small_task, practice):
    from searchrl.data.synthetic import practice_world

    fact_docs = {d["contents"] for d in small_task.corpus}
    for world in practice:
        shared = sum(d["contents"] in fact_docs for d in world.corpus)
        assert shared <= 0.02 * len(world.corpus)  # a coincidental sentence at most, never the world again
    again = practice_world(small_task, seed=101)
    assert again.corpus == practice[0].corpus and again.splits == practice[0].splits
    assert practice[0].corpus != practice[1].corpus
