"""Numbered sources (`EnvConfig.citation_style="number"`): documents labelled [1], [2], ... across an episode,
cited by number, resolved back to document ids for rewards and the audit."""

from __future__ import annotations

import pytest
from test_env_environment import FakeBackend, call, make_env

from searchrl.common.config import ConfigError
from searchrl.common.trajectory import Trajectory
from searchrl.env.config import EnvConfig
from searchrl.env.environment import SearchEnvironment
from searchrl.env.protocol import format_answer, format_search_r1_call
from searchrl.rewards.citation import CitationReward, classify_citations


def answer(env: SearchEnvironment, text: str):
    return env.step(text)


def as_trajectory(env: SearchEnvironment) -> Trajectory:
    return Trajectory(
        id="t",
        question_id="q1",
        question=env.question,
        golds=["Paris"],
        input_ids=[1],
        action_mask=[1],
        logprobs=[0.0],
        prompt_length=0,
        retrieved=dict(env.retrieved),
        answer=env.answer,
        citations=list(env.citations),
    )


def test_numbers_run_on_across_searches_and_a_document_shown_again_keeps_its_number() -> None:
    env = make_env(citation_style="number", topk=1)
    first = env.step(call("capital France")).tool_messages[0]["content"]
    assert first.startswith("[1] Paris\n") and "id:" not in first and "d1" not in first
    second = env.step(call("Berlin Germany")).tool_messages[0]["content"]
    assert second.startswith("[2] Berlin\n")
    again = env.step(call("capital France")).tool_messages[0]["content"]
    assert again.startswith("[1] Paris\n")
    assert env.source_numbers == {"d1": 1, "d2": 2}
    assert env.citation_label("d2") == "2" and env.citation_label("d9") == "d9"


def test_a_cited_number_resolves_to_its_document_and_an_unknown_one_is_fabricated() -> None:
    env = make_env(citation_style="number", topk=1, max_turns=5)
    env.step(call("capital France"))
    env.step(call("Berlin Germany"))
    result = answer(env, format_answer("Paris", ["1"]))
    assert result.citations == ["d1"] and env.citations == ["d1"] and env.cited_labels == ["1"]
    assert CitationReward()(as_trajectory(env)) == 1.0
    env = make_env(citation_style="number", topk=1)
    env.step(call("capital France"))
    answer(env, format_answer("Paris", ["7"]))
    assert classify_citations(as_trajectory(env)) == [("7", "fabricated")]
    env = make_env(citation_style="number", topk=1)
    env.step(call("capital France"))
    answer(env, format_answer("Paris", ["d1"]))  # the id itself, never shown in this style, still resolves
    assert classify_citations(as_trajectory(env)) == [("d1", "supported")]


def test_doc_id_style_is_unchanged() -> None:
    env = make_env(topk=1)
    content = env.step(call("capital France")).tool_messages[0]["content"]
    assert content.startswith("[1] (id: d1) Paris\n")
    answer(env, format_answer("Paris", ["1"]))
    assert env.citations == ["1"]  # a rank is not an id here: it cites nothing retrieved
    assert classify_citations(as_trajectory(env)) == [("1", "fabricated")]


def test_a_document_cut_off_by_the_observation_limit_gets_no_number() -> None:
    long_docs = [
        ("d1", "Paris", "Paris capital France " + "word " * 12),
        ("d2", "Lyon", "Lyon capital France " + "word " * 12),
        ("d3", "Berlin", "Berlin Germany"),
    ]
    env = make_env(FakeBackend(long_docs), citation_style="number", topk=2, max_observation_tokens=20)
    content = env.step(call("capital France")).tool_messages[0]["content"]
    assert "[1] Paris" in content and "[2]" not in content
    assert env.source_numbers == {"d1": 1}
    nxt = env.step(call("Berlin Germany")).tool_messages[0]["content"]
    assert nxt.startswith("[2] Berlin")


def test_a_retracted_observation_takes_its_numbers_back() -> None:
    env = make_env(citation_style="number", topk=1)
    env.step(call("capital France"))
    env.finish("token_budget", observation_shown=False)
    assert env.source_numbers == {} and env.retrieved == {}


def test_prompts_and_hints_speak_of_numbers() -> None:
    env = make_env(citation_style="number", tool_schema_in_prompt=False)
    assert "[n]" in env.system_prompt and "[doc_id]" not in env.system_prompt
    env = make_env(citation_style="number", protocol="search_r1")
    assert "[n]" in env.system_prompt
    result = env.step(format_search_r1_call("capital France"))
    assert "Doc 1 (Title: Paris)" in result.inline_observation and "d1" not in result.inline_observation
    env = make_env(citation_style="number", max_tool_calls=1, max_turns=5)
    env.step(call("capital France"))
    over = env.step(call("Berlin")).tool_messages[0]["content"]
    assert "[n]" in over and "[doc_id]" not in over


def test_an_unknown_style_is_refused() -> None:
    with pytest.raises(ConfigError, match="citation_style"):
        EnvConfig(citation_style="title")


def test_the_expert_cites_the_number_it_was_shown(synthetic_index) -> None:
    from searchrl.models.tiny import tokenizer_training_texts, train_tokenizer
    from searchrl.rewards.combine import default_rubric
    from searchrl.sft.expert import ExpertConfig, ExpertPolicy

    synthetic = synthetic_index(0)
    task, backend = synthetic.task, synthetic.backend
    rows = task.splits["train"][:24]
    tok = train_tokenizer(tokenizer_training_texts(task.corpus, rows), vocab_size=600)
    cfg = EnvConfig(citation_style="number", topk=1, max_turns=4, max_tool_calls=3)
    envs = [SearchEnvironment(backend, cfg, tokenizer=tok) for _ in rows]
    demos = ExpertPolicy(ExpertConfig(noise=0.0, k=1)).demonstrate(None, tok, envs, rows)
    rubric = default_rubric()
    two_hop = [d for d in demos if len(d.tool_calls) == 2]
    assert two_hop, "the tiny world has two-hop questions"
    for demo in demos:
        assert demo.metadata["cited_labels"] == [str(len(demo.tool_calls))]  # one document per search
        assert demo.citations[0] in demo.retrieved
        _, breakdown = rubric.score(demo)
        assert breakdown["citation"] == pytest.approx(0.2)  # supported, at the rubric's weight
