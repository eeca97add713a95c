"""The baselines' forced turns (`searchrl.sft.forcing.BaselineForcing`): closed book forces `<answer>`, naive RAG
the question as its one search and then `<answer>`, the zero-shot agent nothing; a whole turn ends as its
protocol ends it, a prefix is continued by the model. Through a real rollout of a tiny untrained policy."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from worlds import TINY_ONE_LAYER

from searchrl.env.config import EnvConfig
from searchrl.env.environment import SearchEnvironment
from searchrl.env.protocol import ANSWER_OPEN, format_search_r1_call, format_tool_call
from searchrl.models.tiny import build_policy, tokenizer_training_texts, train_tokenizer
from searchrl.rollout.generator import GenerationConfig, HFGenerator
from searchrl.search.base import Hit
from searchrl.sft.forcing import BaselineForcing, baseline_forcing, question_query

DOCS = [
    ("d1", "Glass Harbor", "Glass Harbor is a film shot in Veland."),
    ("d2", "Veland", "Veland is a land."),
]
ROWS = [
    {"id": "q1", "question": "Where was   Glass Harbor shot?", "golds": ["Veland"]},
    {"id": "q2", "question": "What is Veland?", "golds": ["a land"]},
]


class TitleBackend:
    """Finds the documents whose title words the query shares."""

    fingerprint = "titles"

    def search(self, queries: list[str], k: int) -> list[list[Hit]]:
        def hits(query: str) -> list[Hit]:
            words = set(query.lower().replace("?", "").split())
            found = [d for d in DOCS if words & set(d[1].lower().split())]
            return [Hit(doc_id, 1.0, title, text) for doc_id, title, text in found[:k]]

        return [hits(q) for q in queries]


@pytest.fixture(scope="module")
def tok() -> Any:
    corpus = [{"title": t, "contents": c} for _, t, c in DOCS]
    return train_tokenizer(tokenizer_training_texts(corpus * 4, ROWS * 4), vocab_size=400)


def forced_turn(forcing: BaselineForcing, row: int, turn: int) -> list[int]:
    """The ids `forcing` forces at the start of turn `turn` of row `row` (empty: none)."""
    ids: list[int] = []
    while (token := forcing(row, turn, len(ids))) is not None:
        ids.append(token)
    return ids


def env_of(protocol: str) -> SimpleNamespace:
    return SimpleNamespace(config=EnvConfig(protocol=protocol))


def test_naive_rag_forces_the_question_search_then_the_answer_tag(tok: Any) -> None:
    row = {"question": "Who wrote   it?"}
    forcing = BaselineForcing("naive_rag", tok, [env_of("search_r1")], [row])
    turns = [forced_turn(forcing, 0, t) for t in range(3)]
    assert [tok.decode(t) for t in turns[:2]] == ["<search>Who wrote it?</search>", "<answer>"]
    assert turns[2] == [] and forcing.plans[0].searches == ["Who wrote it?"]
    # The chat protocol: the call names no k (the environment's top-k) and ends the turn with EOS; the answer
    # tag is a prefix the model continues, so no EOS after it.
    chat = BaselineForcing("naive_rag", tok, [env_of("chat")], [row])
    search, answer = forced_turn(chat, 0, 0), forced_turn(chat, 0, 1)
    assert search[-1] == tok.eos_token_id and tok.eos_token_id not in answer
    assert tok.decode(search[:-1]) == format_tool_call("search", {"query": "Who wrote it?"})
    assert tok.decode(answer) == ANSWER_OPEN


def test_closed_book_forces_only_the_answer_tag_and_zero_shot_nothing(tok: Any) -> None:
    closed = BaselineForcing("closed_book", tok, [env_of("search_r1")], [ROWS[0]])
    assert tok.decode(forced_turn(closed, 0, 0)) == ANSWER_OPEN and forced_turn(closed, 0, 1) == []
    assert baseline_forcing("zero_shot", tok, [env_of("chat")], ROWS[:1]) is None
    assert baseline_forcing(None, tok, [env_of("chat")], ROWS[:1]) is None
    assert forced_turn(BaselineForcing("zero_shot", tok, [env_of("chat")], ROWS[:1]), 0, 0) == []
    with pytest.raises(ValueError, match="oracle"):
        baseline_forcing("oracle", tok, [env_of("chat")], ROWS[:1])


def test_a_question_longer_than_the_limit_is_cut_at_a_word_boundary() -> None:
    assert question_query("  one two   three ") == "one two three"
    assert question_query("alpha beta gamma", limit=12) == "alpha beta"
    assert question_query("abcdefghijkl", limit=5) == "abcde"


@pytest.mark.parametrize("protocol", ["search_r1", "chat"])
def test_forced_turns_in_a_real_rollout(tok: Any, protocol: str) -> None:
    policy = build_policy(tok, TINY_ONE_LAYER)
    config = EnvConfig(protocol=protocol, topk=1, max_turns=3, max_tool_calls=1)
    generation = GenerationConfig(temperature=0.0, max_new_tokens_per_turn=40, max_episode_tokens=600)

    def rollout(baseline: str) -> list[Any]:
        envs = [SearchEnvironment(TitleBackend(), config, tokenizer=tok) for _ in ROWS]
        forcing = baseline_forcing(baseline, tok, envs, ROWS)
        return HFGenerator(policy, tok, generation, forcing=forcing).rollout(envs, ROWS).trajectories

    for traj, row in zip(rollout("naive_rag"), ROWS, strict=True):
        actions = [span.text for span in traj.spans if span.kind == "action"]
        query = question_query(row["question"])
        if protocol == "search_r1":
            assert actions[0] == format_search_r1_call(query)
        else:
            assert actions[0].startswith(format_tool_call("search", {"query": query}))
        call = traj.tool_calls[
            0
        ]  # the search ran with the environment's top-k and found the title's document
        assert call.status == "ok" and call.arguments == {"query": query, "k": 1} and call.doc_ids
        assert actions[1].startswith(ANSWER_OPEN)
    for traj in rollout("closed_book"):
        assert [s.text for s in traj.spans if s.kind == "action"][0].startswith(ANSWER_OPEN)
        assert not traj.tool_calls
