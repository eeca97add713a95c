"""The real loop's data stage at full size, without a model: the held-out test split (>= 300 questions) shares
nothing with train and dev; the dev split is there for every choice; the shipped real-loop YAMLs agree."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import yaml

from searchrl.common.config import ConfigError, load_config
from searchrl.demo.configs import RealDemoConfig
from searchrl.demo.real import build_real_data
from searchrl.demo.real_sections import RealGRPOSettings

ROOT = Path(__file__).resolve().parents[1]


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


@pytest.fixture(scope="module", params=[0, 1])
def written(request, tmp_path_factory):
    cfg = dataclasses.replace(
        load_config(RealDemoConfig, ROOT / "configs" / "demo_real.yaml"), seed=request.param
    )
    out = tmp_path_factory.mktemp(f"realqa-{request.param}")
    task = build_real_data(cfg, out)
    return cfg, task, {s: _rows(out / f"{s}.jsonl") for s in ("train", "dev", "test")}


def test_the_splits_have_the_sizes_the_config_asks(written):
    cfg, task, rows = written
    assert len(rows["test"]) == sum(cfg.test_questions.values()) >= 300
    assert len(rows["train"]) == sum(cfg.train_questions.values()) > 137  # more than the 137 of before
    assert len(rows["dev"]) == sum(cfg.dev_questions.values()) >= 100
    for split, caps in (
        ("train", cfg.train_questions),
        ("dev", cfg.dev_questions),
        ("test", cfg.test_questions),
    ):
        for source, cap in caps.items():
            assert sum(r["source"] == source for r in rows[split]) == cap, (split, source)
    assert (
        task.meta["counts"]["test"] == len(rows["test"])
        and task.meta["demo_caps"]["test"] == cfg.test_questions
    )
    # The caps spread over the split's SQuAD articles (the first N of a seeded order, not the first articles).
    assert len({r["supporting_titles"][0] for r in rows["test"] if r["source"] == "squad"}) >= 4


def test_nothing_of_a_test_question_leaks_into_train_or_dev(written):
    _, task, rows = written
    test, seen = rows["test"], rows["train"] + rows["dev"]
    # No question, by id or by text.
    assert not {r["id"] for r in test} & {r["id"] for r in seen}
    assert not {r["question"].strip().lower() for r in test} & {r["question"].strip().lower() for r in seen}
    # SQuAD by article: no test article is the subject of a train or dev question.
    test_articles = {t for r in test if r["source"] == "squad" for t in r["supporting_titles"]}
    assert not test_articles & {t for r in seen if r["source"] == "squad" for t in r["supporting_titles"]}
    # HotpotQA by question: no supporting paragraph of a test question supports a train or dev question.
    test_support = {d for r in test for d in r["supporting_doc_ids"]}
    assert not test_support & {d for r in seen for d in r["supporting_doc_ids"]}
    # The same holds between dev and train (dev chooses; it must not be trained on either).
    dev_articles = {t for r in rows["dev"] if r["source"] == "squad" for t in r["supporting_titles"]}
    assert not dev_articles & {
        t for r in rows["train"] if r["source"] == "squad" for t in r["supporting_titles"]
    }
    assert not {r["id"] for r in rows["dev"]} & {r["id"] for r in rows["train"]}
    # Both kinds of HotpotQA question are tested.
    assert {r["type"] for r in test} == {"bridge", "comparison", "squad"}
    assert task.meta["sources"]["squad"]["dev_test_questions_sharing_a_supporting_doc_with_train"] == {
        "dev": 0,
        "test": 0,
    }


def test_the_grpo_yaml_is_the_demo_yaml_with_grpo_on():
    plain = yaml.safe_load((ROOT / "configs" / "demo_real.yaml").read_text())
    grpo = yaml.safe_load((ROOT / "configs" / "real" / "demo_real_grpo.yaml").read_text())
    assert grpo.pop("out_dir") == "runs/demo-real-grpo" and plain.pop("out_dir") == "runs/demo-real"
    assert grpo["grpo"].pop("enabled") is True and plain["grpo"].pop("enabled") is False
    assert grpo == plain
    cfg = load_config(RealDemoConfig, ROOT / "configs" / "real" / "demo_real_grpo.yaml")
    assert cfg.grpo.enabled and cfg.ppo.episodes_per_step % cfg.grpo.num_generations == 0
    assert RealDemoConfig().grpo.enabled is False  # off unless asked


def test_grpo_settings_are_checked(tmp_path):
    with pytest.raises(ConfigError, match="num_generations"):
        RealGRPOSettings(num_generations=1)
    with pytest.raises(ConfigError, match="wall_clock_s"):
        RealGRPOSettings(wall_clock_s=0)
    bad = tmp_path / "bad.yaml"
    bad.write_text("kind: real\ngrpo: {enabled: true, num_generations: 3}\n")
    with pytest.raises(ConfigError, match="must divide"):
        load_config(RealDemoConfig, bad)
