"""The compact chat prompt: no tool schema in the template, one example call in the system turn."""

from __future__ import annotations

from searchrl.env.config import EnvConfig
from searchrl.env.environment import SearchEnvironment
from searchrl.env.protocol import format_tool_call, parse_turn
from searchrl.models.tiny import tokenizer_training_texts, train_tokenizer
from tests.test_env_environment import FakeBackend


def _prompt_ids(tok, env: SearchEnvironment, row: dict) -> list[int]:
    rendered = tok.apply_chat_template(env.reset(row), tools=env.tools or None, add_generation_prompt=True)
    return list(rendered["input_ids"] if hasattr(rendered, "keys") else rendered)


def test_compact_prompt_drops_the_schema_and_keeps_a_parseable_example_call() -> None:
    row = {"id": "q", "question": "What is the capital of France?", "golds": ["Paris"]}
    full = SearchEnvironment(FakeBackend(), EnvConfig())
    compact = SearchEnvironment(FakeBackend(), EnvConfig(tool_schema_in_prompt=False))
    assert full.tools and compact.tools == []
    system = compact.reset(row)[0]["content"]
    # The example call in the system prompt is a call the parser accepts.
    example = system[system.index("<tool_call>") : system.index("</tool_call>") + len("</tool_call>")]
    turn = parse_turn(example.replace("...", "capital of France"))
    assert turn.error is None and turn.tool_calls[0].name == "search"
    tok = train_tokenizer(tokenizer_training_texts([], [row]), vocab_size=400)
    assert len(_prompt_ids(tok, compact, row)) < len(_prompt_ids(tok, full, row)) / 2
    # The environment still executes chat-protocol calls.
    result = compact.step(format_tool_call("search", {"query": "capital of France"}))
    assert result.records[0].status == "ok" and result.tool_messages


def test_ppo_config_env_config_carries_protocol_budgets_and_prompt_style() -> None:
    from searchrl.ppo.config import PPOConfig

    cfg = PPOConfig(
        protocol="search_r1", max_turns=3, max_tool_calls=2, topk=2, max_observation_tokens=64,
        tool_schema_in_prompt=False, search_timeout_s=1.5,
    )  # fmt: skip
    env = cfg.env_config()
    assert (env.protocol, env.max_turns, env.max_tool_calls, env.topk) == ("search_r1", 3, 2, 2)
    assert (env.max_observation_tokens, env.tool_schema_in_prompt, env.search_timeout_s) == (64, False, 1.5)
    assert env.max_episode_tokens == cfg.max_episode_tokens
