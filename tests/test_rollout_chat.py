"""Token glue around tool results: exactly the template's tokens, and exactly what TRL 1.16 computes."""

from __future__ import annotations

import unicodedata
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from trl import GRPOTrainer

from searchrl.env.environment import StepResult
from searchrl.models.tiny import tokenizer_training_texts, train_tokenizer
from searchrl.rollout.chat import (
    ChatTokenMeter,
    ToolGlue,
    inline_observation_ids,
    prompt_ids,
    render_conversation,
    tool_suffix_ids,
)

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "search",
            "description": "Search.",
            "parameters": {
                "type": "object",
                "properties": {"query": {"type": "string"}},
                "required": ["query"],
            },
        },
    }
]


@pytest.fixture(scope="module")
def tok():
    corpus = [{"title": "Varnholt", "contents": "Varnholt is a river town in Quessa."}] * 3
    return train_tokenizer(
        tokenizer_training_texts(corpus, [{"question": "Where?", "golds": ["Quessa"]}]), vocab_size=400
    )


def _trl_suffix(tok, tool_messages):
    # TRL's own implementation, called unbound on the few attributes it reads.
    fake = SimpleNamespace(
        processing_class=tok, _tokenizer=tok, chat_template=None, chat_template_kwargs={}, _is_vlm=False
    )
    return GRPOTrainer._get_tool_suffix_ids(fake, tool_messages)


# Tool results as the environment writes them: any text, but without chat special tokens (the
# environment's sanitiser neutralises those before they reach a tool message). NFC-normal text only: the
# tokenizer normalises to NFC (as Qwen2.5's does), so other text cannot decode back to itself whatever
# the glue (e.g. a CJK compatibility ideograph decodes as its canonical character).
tool_text = st.text(max_size=60).filter(lambda s: "<|" not in s and unicodedata.normalize("NFC", s) == s)


@settings(max_examples=40, deadline=None)
@given(st.lists(tool_text, min_size=1, max_size=3))
def test_suffix_equals_trls_and_decodes_to_the_template(tok, contents):
    messages = [{"role": "tool", "name": "search", "content": c} for c in contents]
    ours = ToolGlue(tok, TOOLS).suffix_ids(messages)
    assert ours == _trl_suffix(tok, messages)
    body = "".join(f"\n<tool_response>\n{c}\n</tool_response>" for c in contents)
    expected = f"\n<|im_start|>user{body}<|im_end|>\n<|im_start|>assistant\n"
    assert tok.decode(ours, skip_special_tokens=False) == expected


def test_prompt_plus_turn_plus_glue_renders_the_conversation(tok):
    messages = [{"role": "system", "content": "Answer."}, {"role": "user", "content": "Where is Varnholt?"}]
    turn = '<tool_call>\n{"name": "search", "arguments": {"query": "Varnholt"}}\n</tool_call>'
    tool = [{"role": "tool", "name": "search", "content": "[1] (id: d1) Varnholt\nA river town."}]
    ids = prompt_ids(tok, messages, TOOLS)
    ids += tok.encode(turn, add_special_tokens=False) + [tok.eos_token_id]
    ids += tool_suffix_ids(tok, tool, TOOLS)
    conversation = [*messages, {"role": "assistant", "content": turn}, *tool]
    assert tok.decode(ids, skip_special_tokens=False) == render_conversation(
        tok, conversation, TOOLS, add_generation_prompt=True
    )


def test_inline_observation_is_plain_text_tokens(tok):
    text = "\n\n<information>Doc 1 (id: d1, Title: Varnholt) A river town.</information>\n\n"
    ids = inline_observation_ids(tok, text)
    assert tok.decode(ids, skip_special_tokens=False) == text
    assert tok.eos_token_id not in ids


def test_suffix_needs_a_tool_message(tok):
    with pytest.raises(ValueError, match="at least one tool message"):
        ToolGlue(tok).suffix_ids([])


def test_chat_meter_counts_what_trl_inserts_and_measures_the_template_prefix_once(tok, monkeypatch):
    meter = ChatTokenMeter(tok)
    contents = ["[1] (id: d1) Varnholt\nVarnholt is a river town.", "No documents found."]
    for content in contents:
        message = {"role": "tool", "name": "search", "content": content}
        result = StepResult(done=False, tool_messages=[message])
        assert meter.observation_tokens(result) == len(_trl_suffix(tok, [message]))
    inline = StepResult(done=False, inline_observation="\n\n<information>x</information>\n\n")
    assert meter.observation_tokens(inline) == len(inline_observation_ids(tok, inline.inline_observation))
    assert meter.turn_tokens("Varnholt") == len(tok.encode("Varnholt", add_special_tokens=False)) + 1
    # The dummy prefix is rendered once per tool name, however many observations are counted.
    renders = []
    real = tok.apply_chat_template
    monkeypatch.setattr(
        tok,
        "apply_chat_template",
        lambda *a, **kw: renders.append(kw["add_generation_prompt"]) or real(*a, **kw),
    )
    for _ in range(3):
        meter.observation_tokens(
            StepResult(done=False, tool_messages=[{"role": "tool", "name": "search", "content": "a"}])
        )
    assert renders == [True, True, True]
