"""Builders shared by the tests of what `searchrl view / audit / report / eval` accept (no tests here).

- `build_smoke_demo(root)`: the real smoke demo (`searchrl.demo.configs.smoke_config` + `searchrl.demo.pipeline.run_demo`), every
  stage at toy size: `ppo/` (a PPO run), `eval/{sft,ppo}-test.json` + `.trajectories.jsonl.gz`, `sft/policy`, `data/`,
  `index/`, `summary.json`, `report.html`.
- `build_grpo_run(root)`: a real one-step GRPO run (`run_grpo`, our rollout engine) from a tiny policy saved
  to disk, evaluated at step 0, with its checkpoint, trajectories, config.yaml and manifest.json.
- `unseen_world(root)`: a corpus and questions no run here ever saw (other names, other facts), with a
  BM25 index built from the corpus, and `forced_turns` to force a search-then-answer episode through the
  real engine (the tiny policies answer nothing useful on their own).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

UNSEEN_CORPUS = [
    {
        "id": "u1",
        "title": "Brask Hollow",
        "contents": "Brask Hollow is a fishing village on the Tamsel coast.",
        "x": 1,
    },
    {"id": "u2", "title": "Tamsel", "contents": "Tamsel is a cold coast whose largest port is Vennick."},
    {"id": "u3", "title": "Vennick", "contents": "Vennick was charted by the sailor Ode Marrin in 1710."},
    {"id": "u4", "title": "Ode Marrin", "contents": "Ode Marrin was a sailor born in Quillow."},
]
UNSEEN_QUESTIONS = [
    {"id": "n1", "question": "On which coast is Brask Hollow?", "golds": ["Tamsel"], "hops": 1, "note": "x"},
    {"id": "n2", "question": "Who charted Vennick?", "golds": ["Ode Marrin"], "hops": 1},
    {
        "id": "n3",
        "question": "Where was the sailor who charted Vennick born?",
        "golds": ["Quillow"],
        "hops": 2,
    },
]
# (query, answer) per question: n1 and n3 right, n2 wrong.
UNSEEN_SCRIPT = [
    ("Brask Hollow coast", "Tamsel"),
    ("Vennick charted", "Nobody"),
    ("Ode Marrin born", "Quillow"),
]


def build_smoke_demo(root: Path) -> Path:
    """Run the smoke demo into `root/demo` and return that directory."""
    from searchrl.demo.configs import smoke_config
    from searchrl.demo.pipeline import run_demo

    out = root / "demo"
    cfg = smoke_config(str(out))
    cfg.progress_bar = False
    run_demo(cfg)
    return out


@dataclass
class GrpoRun:
    run: Path
    policy: Path
    corpus: Path
    index: Path
    train: Path
    dev: Path


def build_grpo_run(root: Path) -> GrpoRun:
    """A one-step GRPO run (our rollout, 2 generations, dev evaluation at step 0) under `root/grpo`."""
    from worlds import TINY_ONE_LAYER

    from searchrl.common.io import write_jsonl
    from searchrl.data.synthetic import generate, preset_config
    from searchrl.grpo.config import GRPORunConfig
    from searchrl.grpo.trainer import run_grpo
    from searchrl.models.tiny import build_policy, tokenizer_training_texts, train_tokenizer
    from searchrl.search.index import build_index

    root.mkdir(parents=True, exist_ok=True)
    task = generate(preset_config("tiny", seed=1))
    # The tokenizer also sees the unseen world's text, so its names are not all <unk> when evaluated.
    extra = [{"question": q["question"], "golds": q["golds"]} for q in UNSEEN_QUESTIONS]
    write_jsonl(root / "corpus.jsonl", task.corpus)
    build_index(root / "corpus.jsonl", root / "index", overwrite=True)
    write_jsonl(root / "train.jsonl", task.splits["train"][:4])
    write_jsonl(root / "dev.jsonl", task.splits["dev"][:2])
    texts = tokenizer_training_texts(
        list(task.corpus) + UNSEEN_CORPUS * 4, list(task.splits["train"]) + extra * 4
    )
    tok = train_tokenizer(texts, vocab_size=600)
    policy = build_policy(tok, TINY_ONE_LAYER)
    policy.save_pretrained(root / "policy")
    tok.save_pretrained(root / "policy")
    cfg = GRPORunConfig(
        mode="our_rollout",
        output_dir=str(root / "grpo"),
        policy_model_path=str(root / "policy"),
        train_file=str(root / "train.jsonl"),
        dev_file=str(root / "dev.jsonl"),
        index_dir=str(root / "index"),
        tool_schema_in_prompt=False,
        max_steps=1,
        per_device_train_batch_size=2,
        num_generations=2,
        max_turns=3,
        max_tool_calls=2,
        max_new_tokens_per_turn=48,
        max_episode_tokens=400,
        max_observation_tokens=64,
        eval_on_start=True,
        num_eval_questions=2,
        seed=5,
    )
    run_grpo(cfg)
    return GrpoRun(
        root / "grpo",
        root / "policy",
        root / "corpus.jsonl",
        root / "index",
        root / "train.jsonl",
        root / "dev.jsonl",
    )


@dataclass
class UnseenWorld:
    corpus: Path
    questions: Path
    index: Path


def unseen_world(root: Path) -> UnseenWorld:
    """Write the unseen corpus and questions under `root` and index the corpus with BM25."""
    from searchrl.search.index import build_index

    root.mkdir(parents=True, exist_ok=True)
    corpus, questions = root / "unseen-corpus.jsonl", root / "unseen-questions.jsonl"
    corpus.write_text("".join(json.dumps(r) + "\n" for r in UNSEEN_CORPUS))
    questions.write_text("".join(json.dumps(r) + "\n" for r in UNSEEN_QUESTIONS))
    build_index(corpus, root / "unseen-index", backend="bm25")
    return UnseenWorld(corpus, questions, root / "unseen-index")


def forced_turns(citation: str = "doc") -> Any:
    """A `generator_factory` that forces, per question, one search then an answer citing what it found.

    `citation="doc"` cites the document id (doc_id style), `"number"` cites `[1]` (number style).
    """
    from searchrl.env.protocol import format_answer, format_tool_call
    from searchrl.rollout.generator import HFGenerator, ScriptedPolicy

    cite = {"doc": lambda i: [["u1", "u3", "u4"][i]], "number": lambda i: ["1"]}[citation]
    turns = [
        [format_tool_call("search", {"query": q}), format_answer(a, cite(i))]
        for i, (q, a) in enumerate(UNSEEN_SCRIPT)
    ]

    def factory(model: Any, tokenizer: Any, config: Any) -> Any:
        return HFGenerator(model, tokenizer, config, forcing=ScriptedPolicy(tokenizer, turns))

    return factory
