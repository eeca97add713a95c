"""The compact chat prompt: no tool schema in the template, one example call in the system turn."""

from __future__ import annotations

from searchrl.env.environment import EnvConfig, SearchEnvironment
from searchrl.env.protocol import format_tool_call, parse_turn
from searchrl.models.tiny import train_tokenizer, tokenizer_training_texts
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
