"""SearchToolEnv: the shape TRL 1.16's environment_factory probes, and a real GRPOTrainer that accepts it."""

from __future__ import annotations

import inspect
import json
import os
import time

import pytest
from transformers.utils import get_json_schema
from worlds import TINY_ONE_LAYER

from searchrl.env.config import EnvConfig
from searchrl.env.trl_adapter import SearchToolEnv, make_environment_factory
from searchrl.search.base import Hit, SearchUnavailable
from searchrl.search.index import IndexFormatError

DOCS = [
    ("d1", "Paris", "Paris is the capital of France."),
    ("d2", "Berlin", "Berlin is the capital of Germany."),
]


class TinyBackend:
    """In-memory backend: every doc sharing a word with the query, plus a call log."""

    fingerprint = "tiny-v1"

    def __init__(self, delay_s: float = 0.0, fail: Exception | None = None) -> None:
        self.calls: list[list[str]] = []
        self.delay_s = delay_s
        self.fail = fail

    def search(self, queries: list[str], k: int) -> list[list[Hit]]:
        self.calls.append(list(queries))
        if self.delay_s:
            time.sleep(self.delay_s)
        if self.fail is not None:
            raise self.fail
        out = []
        for q in queries:
            words = set(q.lower().split())
            out.append(
                [
                    Hit(d, 1.0, t, x)
                    for d, t, x in DOCS
                    if words & set(f"{t} {x}".lower().rstrip(".").split())
                ][:k]
            )
        return out


def test_trl_probe_finds_exactly_reset_search_and_get_reward() -> None:
    # What GRPOTrainer does: functions on the class; public ones besides reset/get_reward become tools.
    public = {
        name for name, _ in inspect.getmembers(SearchToolEnv, inspect.isfunction) if not name.startswith("_")
    }
    assert public == {"reset", "search", "get_reward"}
    schema = get_json_schema(SearchToolEnv.search)
    assert schema["function"]["name"] == "search"
    assert schema["function"]["parameters"]["properties"] == {
        "query": {"type": "string", "description": "The search words."}
    }
    assert schema["function"]["parameters"]["required"] == ["query"]
    assert inspect.signature(SearchToolEnv.reset).return_annotation in ("str | None", str | None)


def test_reset_search_and_reward_of_one_episode() -> None:
    backend = TinyBackend()
    env = make_environment_factory(backend, EnvConfig(max_tool_calls=2))()
    prompt = [{"role": "user", "content": "What is the capital of France?"}]
    assert env.reset(prompt=prompt, golds=["Paris"]) is None
    assert env.environment.question == "What is the capital of France?"
    assert env.environment.row["golds"] == ["Paris"]
    assert env.search("capital France").startswith("[1] (id: d1) Paris\n")
    assert env.get_reward() == 0.0
    empty = env.search("   ")
    assert empty.startswith("Error (invalid_arguments)") and "must not be empty" in empty
    assert env.search("Berlin").startswith("[1] (id: d2)")
    assert "budget used up" in env.search("Paris")  # third search: over budget, never sent
    assert backend.calls == [["capital France"], ["Berlin"]]
    assert env.get_reward() == pytest.approx(-0.2)  # two calls that did not succeed
    assert env.search("Paris").startswith("Error (over_budget)")  # trying again ends the episode ...
    assert env.search("Paris").startswith("Error: the episode has ended (max_tool_calls)")  # ... for good
    assert len(backend.calls) == 2
    env.reset(question="Where is Berlin?", prompt=prompt)  # pooled instance: a clean new episode
    assert env.environment.question == "Where is Berlin?" and env.get_reward() == 0.0


def test_adapter_keeps_our_deadline_and_failure_observations() -> None:
    slow = make_environment_factory(TinyBackend(delay_s=2.0), EnvConfig(search_timeout_s=0.2))()
    slow.reset(prompt=[{"role": "user", "content": "q"}])
    started = time.perf_counter()
    assert slow.search("Paris").startswith("Error (timeout)")
    assert time.perf_counter() - started < 1.5
    down = make_environment_factory(
        TinyBackend(fail=SearchUnavailable("refused")), EnvConfig(max_retries=0)
    )()
    down.reset(prompt="q")
    assert down.search("Paris").startswith("Error (unavailable)") and down.get_reward() < 0


def test_factory_from_an_index_directory(tmp_path) -> None:
    from searchrl.search.index import build_index

    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"id": d, "title": t, "contents": x}) + "\n" for d, t, x in DOCS))
    build_index(corpus, tmp_path / "index", backend="bm25")
    factory = make_environment_factory(tmp_path / "index", EnvConfig(topk=1, search_timeout_s=120))
    env = factory()
    env.reset(prompt=[{"role": "user", "content": "q"}])
    assert env.search("capital of Germany").startswith("[1] (id: d2) Berlin")
    assert factory().environment.backend is env.environment.backend  # one index shared by the pool
    # An index directory opens through the search room's one opener, which says what is wrong.
    with pytest.raises(IndexFormatError, match="index directory not found"):
        make_environment_factory(tmp_path / "nowhere")
    (tmp_path / "half").mkdir()
    with pytest.raises(IndexFormatError, match="no meta.json"):
        make_environment_factory(tmp_path / "half")
    with pytest.raises(TypeError, match="Backend"):
        make_environment_factory(42)  # type: ignore[arg-type]


def test_grpo_trainer_accepts_the_factory_and_calls_search(tmp_path) -> None:
    """A real TRL GRPOTrainer with our factory: init validates it, one training step runs the tool loop."""
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from searchrl.models.tiny import build_policy, tokenizer_training_texts, train_tokenizer

    rows = [{"title": t, "contents": x} for _, t, x in DOCS]
    qa = [{"question": "What is the capital of France?", "golds": ["Paris"]}]
    tokenizer = train_tokenizer(tokenizer_training_texts(rows * 3, qa * 3), vocab_size=400)
    model = build_policy(tokenizer, TINY_ONE_LAYER)
    backend = TinyBackend()
    factory = make_environment_factory(backend, EnvConfig())
    dataset = Dataset.from_list(
        [{"prompt": [{"role": "user", "content": qa[0]["question"]}], "golds": ["Paris"]}] * 2
    )
    args = GRPOConfig(
        output_dir=str(tmp_path / "grpo"),
        max_steps=1,
        per_device_train_batch_size=2,
        num_generations=2,
        max_completion_length=12,
        max_tool_calling_iterations=1,
        report_to=[],
        logging_steps=1,
        save_strategy="no",
        use_cpu=True,
        bf16=False,
    )
    trainer = GRPOTrainer(
        model=model, processing_class=tokenizer, args=args, train_dataset=dataset, environment_factory=factory
    )
    tool_names = sorted(t.__name__ for t in trainer.tools)
    assert tool_names == ["search"]
    assert all(isinstance(e, SearchToolEnv) for pool in trainer._environment_pool.values() for e in pool)
    trainer.train()  # an untrained policy seldom calls the tool; what matters is that TRL drives our env
    assert trainer.state.global_step == 1
    pooled = [e for pool in trainer._environment_pool.values() for e in pool]
    # TRL reset every pooled instance with the dataset row (its `golds` column reached our env).
    assert pooled and all(
        e.environment.row is not None and e.environment.row["golds"] == ["Paris"] for e in pooled
    )
    assert all(e.environment.question == "What is the capital of France?" for e in pooled)
