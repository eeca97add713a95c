"""The tiny offline model: tokenizer + trl's Qwen2.5 template, policy and value models, save/load."""

from __future__ import annotations

import unicodedata

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import Qwen2ForCausalLM, Qwen2ForSequenceClassification
from trl.chat_template_utils import is_chat_template_prefix_preserving, supports_tool_calling
from worlds import TINY_ONE_LAYER

from searchrl.models.io import load_policy, load_tokenizer, load_value_model
from searchrl.models.tiny import (
    PROTOCOL_TOKENS,
    TinyModelConfig,
    build_policy,
    build_value_model,
    qwen2_5_chat_template,
    tokenizer_training_texts,
    train_tokenizer,
    trl_chat_template_path,
)

CORPUS = [
    {"id": "d1", "title": "Varnholt", "contents": "Varnholt is a river town in Quessa, founded in 1412."},
    {"id": "d2", "title": "Quessa", "contents": "Quessa is a mountain province whose capital is Orlenn."},
]
QA = [{"id": "q1", "question": "In which province is Varnholt?", "golds": ["Quessa"]}]
SMALL = TINY_ONE_LAYER


@pytest.fixture(scope="module")
def tok():
    return train_tokenizer(tokenizer_training_texts(CORPUS * 3, QA * 3), vocab_size=400)


def test_special_tokens_pad_differs_from_eos_and_left_padding(tok):
    assert tok.eos_token == "<|im_end|>"
    assert tok.pad_token == "<|endoftext|>"
    assert tok.pad_token_id != tok.eos_token_id
    assert tok.padding_side == "left"
    for tag in PROTOCOL_TOKENS + ["<|im_start|>", "<|im_end|>"]:
        assert len(tok.encode(tag, add_special_tokens=False)) == 1, tag


def test_a_name_has_the_same_ids_wherever_it_stands(tok):
    # The agent copies names from the question (" Varnholt") into queries ('"Varnholt') and answers
    # (">Varnholt"); with Qwen's regex these were different ids, which a tiny model cannot learn to copy.
    def ids_of_word(text: str, word: str) -> list[int]:
        target = tok.encode(word, add_special_tokens=False)
        ids = tok.encode(text, add_special_tokens=False)
        for i in range(len(ids) - len(target) + 1):
            if ids[i : i + len(target)] == target:
                return target
        raise AssertionError(
            f"{word!r} is not tokenised on its own in {text!r}: {tok.convert_ids_to_tokens(ids)}"
        )

    for text in (
        "In which province is Varnholt?",
        '{"query": "Varnholt founded"}',
        "<answer>Varnholt [d1]</answer>",
    ):
        assert ids_of_word(text, "Varnholt") == tok.encode("Varnholt", add_special_tokens=False)


def test_a_lowercase_word_keeps_its_leading_space(tok):
    # " founded" is one token (not a space token and a word): ordinary text costs one token a word.
    ids = tok.encode("Varnholt founded", add_special_tokens=False)
    assert tok.convert_ids_to_tokens(ids) == ["Varnholt", "Ġfounded"]
    # the relation word reads the same in a question and in the query the agent writes
    in_question = tok.encode("Where was Varnholt founded?", add_special_tokens=False)
    assert ids[-1] in in_question


def test_protocol_tags_survive_decode(tok):
    text = '<tool_call>\n{"name": "search", "arguments": {"query": "Varnholt"}}\n</tool_call>'
    ids = tok.encode(text, add_special_tokens=False)
    assert tok.decode(ids) == text


@settings(max_examples=60, deadline=None)
@given(st.text(max_size=80))
def test_byte_level_round_trip_any_text(tok, text):
    # Like Qwen2.5's tokenizer, ours normalises to NFC first; NFC text comes back exactly.
    text = unicodedata.normalize("NFC", text)
    ids = tok.encode(text, add_special_tokens=False)
    assert tok.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False) == text


@pytest.fixture(scope="module")
def reloaded(tok, tmp_path_factory):
    # Saved next to a Qwen2 config.json, AutoTokenizer picks Qwen2Tokenizer, which rebuilds the pipeline.
    path = tmp_path_factory.mktemp("with_model")
    build_policy(tok, SMALL).save_pretrained(path)
    tok.save_pretrained(path)
    return load_tokenizer(path)


PIECES = [
    *"abc XYZ019'!?\n\t<>|_-éß",
    "Varnholt",
    "  ",
    "1203",
    *PROTOCOL_TOKENS,
    "<|im_end|>",
    "<|im_start|>",
]


@settings(max_examples=80, deadline=None)
@given(st.lists(st.sampled_from(PIECES), max_size=30).map("".join))
def test_reloaded_tokenizer_gives_the_same_ids(tok, reloaded, text):
    assert reloaded.encode(text, add_special_tokens=False) == tok.encode(text, add_special_tokens=False)


def test_chat_template_is_trls_file_and_trl_accepts_it(tok):
    assert trl_chat_template_path().name == "qwen2_5.jinja"
    assert tok.chat_template == qwen2_5_chat_template()
    assert supports_tool_calling(tok)
    assert is_chat_template_prefix_preserving(tok)
    # add_response_schema recognised the template: TRL's parse_response reads our tool calls.
    parsed = tok.parse_response(
        '<tool_call>\n{"name": "search", "arguments": {"query": "Quessa"}}\n</tool_call><|im_end|>', prefix=""
    )
    assert parsed["tool_calls"][0]["function"] == {"name": "search", "arguments": {"query": "Quessa"}}


def test_template_renders_tool_turns(tok):
    messages = [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "<tool_call>x</tool_call>"},
        {"role": "tool", "name": "search", "content": "RESULT"},
    ]
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text.endswith(
        "<|im_start|>user\n<tool_response>\nRESULT\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )


RECORD = "Order o-81824: white mug. Ordered on 22 February. Status: delivered on 27 February. Ship to 83 Gemun Way."
CALL = '<tool_call>\n{"name": "get_order", "arguments": {"order_id": "o-81824"}}\n</tool_call>'
ANSWER = "<answer>delivered on 27 February</answer>"


@pytest.fixture(scope="module")
def reading_tok():
    return train_tokenizer([RECORD, CALL, ANSWER] * 20, vocab_size=400, split="reading")


def _contains(ids: list[int], part: list[int]) -> bool:
    return any(ids[i : i + len(part)] == part for i in range(len(ids) - len(part) + 1))


def test_reading_split_reads_a_date_and_an_id_with_the_same_ids_in_a_record_and_in_the_answer(reading_tok):
    # The support demo copies the status's date out of the order record into the answer, and the order id
    # out of a search result into get_order: one to three tokens each, the same ids on both sides.
    record = reading_tok.encode(RECORD, add_special_tokens=False)
    date = reading_tok.encode(" on 27 February", add_special_tokens=False)
    assert reading_tok.convert_ids_to_tokens(date) == ["Ġon", "Ġ27", "ĠFebruary"]
    assert _contains(record, date) and _contains(reading_tok.encode(ANSWER, add_special_tokens=False), date)
    order_id = reading_tok.encode("81824", add_special_tokens=False)
    assert reading_tok.convert_ids_to_tokens(order_id) == ["81", "82", "4"]
    assert _contains(record, order_id) and _contains(
        reading_tok.encode(CALL, add_special_tokens=False), order_id
    )
    # the default split keeps one digit a token and the space apart, as the synthetic demo is measured with
    names = train_tokenizer([RECORD, CALL, ANSWER] * 20, vocab_size=400)
    assert names.convert_ids_to_tokens(names.encode(" 27", add_special_tokens=False)) == ["Ġ", "2", "7"]


def test_reading_split_survives_a_reload(reading_tok, tmp_path):
    build_policy(reading_tok, SMALL).save_pretrained(tmp_path)
    reading_tok.save_pretrained(tmp_path)
    again = load_tokenizer(tmp_path)
    for text in (RECORD, CALL, ANSWER, "12 345 6789 Mixed Case words 1a2b"):
        assert again.encode(text, add_special_tokens=False) == reading_tok.encode(
            text, add_special_tokens=False
        )


def test_unknown_split_is_refused():
    with pytest.raises(ValueError, match="split='digits' is not one of"):
        train_tokenizer(["abc"], vocab_size=400, split="digits")


def test_too_small_vocab_is_refused():
    with pytest.raises(ValueError, match="vocab_size"):
        train_tokenizer(["abc"], vocab_size=100)


def test_bad_head_config_is_refused(tok):
    with pytest.raises(ValueError, match="num_key_value_heads"):
        build_policy(tok, TinyModelConfig(num_attention_heads=4, num_key_value_heads=3))


def test_policy_and_value_models_round_trip(tok, tmp_path):
    policy = build_policy(tok, SMALL)
    value = build_value_model(tok, SMALL)
    assert isinstance(policy, Qwen2ForCausalLM) and isinstance(value, Qwen2ForSequenceClassification)
    assert policy.config.vocab_size == len(tok)
    assert value.config.num_labels == 1 and value.config.pad_token_id == tok.pad_token_id
    ids = torch.tensor([tok.encode("Varnholt is a river town", add_special_tokens=False)])
    with torch.no_grad():
        logits = policy(ids).logits
        score = value(ids).logits
    assert logits.shape == (1, ids.shape[1], len(tok)) and score.shape == (1, 1)

    policy.save_pretrained(tmp_path / "policy")
    tok.save_pretrained(tmp_path / "policy")
    value.save_pretrained(tmp_path / "value")
    tok2 = load_tokenizer(tmp_path / "policy")
    policy2 = load_policy(tmp_path / "policy")
    value2 = load_value_model(tmp_path / "value")
    assert tok2.encode("<answer>Quessa [d2]</answer>") == tok.encode("<answer>Quessa [d2]</answer>")
    assert tok2.chat_template == tok.chat_template and tok2.pad_token_id == tok.pad_token_id
    with torch.no_grad():
        assert torch.allclose(policy2(ids).logits, logits, atol=1e-6)
        assert torch.allclose(value2(ids).logits, score, atol=1e-6)


def test_build_is_seeded_and_leaves_global_rng_alone(tok):
    torch.manual_seed(123)
    before = torch.rand(1)
    torch.manual_seed(123)
    a = build_policy(tok, SMALL)
    after = torch.rand(1)
    b = build_policy(tok, SMALL)
    assert torch.equal(before, after)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters(), strict=True))


def test_load_tokenizer_refuses_pad_equal_eos(tok, tmp_path):
    tok.save_pretrained(tmp_path)
    broken = load_tokenizer(tmp_path)
    broken.pad_token = broken.eos_token
    broken.save_pretrained(tmp_path / "broken")
    with pytest.raises(ValueError, match="pad token equals EOS"):
        load_tokenizer(tmp_path / "broken")
