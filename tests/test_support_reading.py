"""The support expert's reading examples: an order id out of a search result, an answer out of the last
observation, the item out of the question into the first search; labels on the copied span only."""

from __future__ import annotations

import dataclasses
import re
import tempfile
from pathlib import Path

import pytest

from searchrl.common.config import ConfigError
from searchrl.demo.stages import StageRunner
from searchrl.demo.support import prepare_support_world
from searchrl.demo.support_config import SupportDemoConfig, support_smoke_config
from searchrl.sft.examples import IGNORE_INDEX, action_turns
from searchrl.sft.support_expert import reading_examples


@pytest.fixture(scope="module")
def smoke_world():
    with tempfile.TemporaryDirectory() as tmp:
        return prepare_support_world(support_smoke_config(out_dir=tmp), Path(tmp), StageRunner(False))


def test_every_where_demonstration_lazy_or_not_reads_the_id_its_search_result_shows(smoke_world) -> None:
    tok, demos = smoke_world.tokenizer, smoke_world.demos
    where = [d for d in demos if d.metadata.get("hops") == 2]
    lazy = [d for d in where if d.metadata["expert_kind"] == "skip_lookup"]
    assert lazy and len(lazy) < len(where)  # both kinds are there to read from
    examples = reading_examples(tok, demos)
    assert len(examples) == len(where)  # every `where` demonstration, and no other question's
    for demo, example in zip(where, examples, strict=True):
        shown = re.search(r"^\[\d+\] Order o-(\d+)$", demo.observations[0], re.MULTILINE).group(1)
        labelled = [t for t in example["labels"] if t != IGNORE_INDEX]
        assert tok.decode(labelled) == shown  # the digits, nothing else
        start = action_turns(demo.action_mask)[1][0]
        assert example["input_ids"][:start] == [int(i) for i in demo.input_ids[:start]]
        call = example["input_ids"][start:]
        assert tok.decode(call).startswith("<tool_call>") and f'"o-{shown}"' in tok.decode(call)
        if demo.metadata["expert_kind"] == "expert" and not demo.metadata.get("followed_injection"):
            # the expert's own call, token for token
            end = action_turns(demo.action_mask)[1][1]
            assert call == [int(i) for i in demo.input_ids[start:end]]


def test_answer_examples_copy_the_answer_out_of_the_last_observation_and_skip_lazy_ones(smoke_world) -> None:
    tok, demos = smoke_world.tokenizer, smoke_world.demos
    copied = [
        d
        for d in demos
        if d.answer and d.observations and re.search(rf"\b{re.escape(d.answer)}\b", d.observations[-1])
    ]
    # a "no" inside "not" (a denied call's observation) is no copy of the answer
    assert any(d.answer == "no" and "not" in d.observations[-1] for d in demos) and not any(
        d.answer in ("yes", "no") for d in copied
    )
    wanted = [d for d in copied if d.metadata["expert_kind"] != "skip_lookup"]
    assert wanted and len(wanted) < len(copied) < len(demos)  # lazy answers and yes/no decisions left out
    examples = reading_examples(tok, demos, ["answer"])
    assert len(examples) == len(wanted)
    for demo, example in zip(wanted, examples, strict=True):
        end = action_turns(demo.action_mask)[-1][1]
        own_tokens = [int(i) for i in demo.input_ids[:end]]
        assert example["input_ids"] == own_tokens
        labelled = [t for t in example["labels"] if t != IGNORE_INDEX]
        assert tok.decode(labelled).strip() == demo.answer  # the answer, not its tags
        assert all(t == IGNORE_INDEX for t in example["labels"][: action_turns(demo.action_mask)[-1][0]])


def test_query_examples_label_what_the_first_search_copies_from_the_question(smoke_world) -> None:
    tok, demos = smoke_world.tokenizer, smoke_world.demos
    examples = reading_examples(tok, demos, ["query"])
    kinds = {d.question_id: d.metadata for d in demos}
    assert examples and len(examples) < len(demos)  # "order waiting in the warehouse" copies nothing
    by_prefix = {tuple(int(i) for i in d.input_ids[: action_turns(d.action_mask)[0][1]]): d for d in demos}
    for example in examples:
        demo = by_prefix[tuple(example["input_ids"])]
        labelled = tok.decode([t for t in example["labels"] if t != IGNORE_INDEX]).strip()
        query = demo.tool_calls[0].arguments["query"]
        assert query.endswith(labelled) and labelled in demo.question and labelled
        if kinds[demo.question_id].get("hops") == 2:  # a `where` question: the item, colour and all
            assert labelled == query.removeprefix("order ")


def test_each_reading_example_names_its_group_a_kind_and_its_question_type(smoke_world) -> None:
    tok, demos = smoke_world.tokenizer, smoke_world.demos
    assert all(d.metadata["type"] in {"where", "where_id", "return", "unshipped"} for d in demos)
    groups = set()
    for demo in demos:
        for kind in ("order_id", "answer", "query"):
            for example in reading_examples(tok, [demo], [kind]):
                assert example["group"] == f"{kind}/{demo.metadata['type']}"
                groups.add(example["group"])
    # a status out of a record and an item out of an order document are two copies, measured apart
    assert {"order_id/where", "answer/where", "answer/unshipped", "query/where"} <= groups
    assert not any(g.startswith("answer/return") for g in groups)  # yes / no is a decision, not a copy


def test_reading_examples_refuse_an_unknown_kind(smoke_world) -> None:
    with pytest.raises(ValueError, match="choose from"):
        reading_examples(smoke_world.tokenizer, smoke_world.demos, ["status"])


def test_with_the_reading_split_an_id_and_a_date_are_read_in_tokens_of_up_to_two_digits(
    tmp_path: Path,
) -> None:
    cfg = dataclasses.replace(support_smoke_config(out_dir=str(tmp_path)), tokenizer_split="reading")
    world = prepare_support_world(cfg, tmp_path, StageRunner(False))
    tok, demos = world.tokenizer, world.demos
    id_examples = reading_examples(tok, demos, ["order_id"])
    assert id_examples
    pairs = 0
    for example in id_examples:
        labelled = [t for t in example["labels"] if t != IGNORE_INDEX]
        assert re.fullmatch(r"\d{5}", tok.decode(labelled))  # every token of the id, and only the id
        assert all(1 <= len(tok.decode([t])) <= 2 for t in labelled)
        pairs += sum(len(tok.decode([t])) == 2 for t in labelled)
    assert pairs > len(id_examples)  # mostly two digits a token: fewer steps to copy than five
    dated = [e for e in reading_examples(tok, demos, ["answer"]) if re.search(r" \d+ [A-Z]", _answer(tok, e))]
    assert dated
    for example in dated:
        answer = [t for t in example["labels"] if t != IGNORE_INDEX]
        day = next(t for t in answer if tok.decode([t]).strip().isdigit())
        assert tok.decode([day]).startswith(" ")  # " 27": the day and its space in one token
        # the same ids stand in the order record the answer is read from
        record = example["input_ids"][: example["labels"].index(answer[0])]
        assert any(record[i : i + len(answer) - 1] == answer[1:] for i in range(len(record)))


def _answer(tok, example: dict) -> str:
    return tok.decode([t for t in example["labels"] if t != IGNORE_INDEX])


def test_an_unknown_tokenizer_split_is_refused_by_the_config() -> None:
    with pytest.raises(ConfigError, match="tokenizer_split: 'digits' is not one of"):
        SupportDemoConfig(tokenizer_split="digits")


def test_answer_f1_weight_gives_a_status_read_with_a_wrong_day_partial_credit_and_the_lazy_answer_none() -> (
    None
):
    from searchrl.common.trajectory import Trajectory
    from searchrl.demo.support import support_rubric

    def reward(answer: str, weight: float) -> float:
        traj = Trajectory(id="t", question_id="q", question="Where is my red mug?",
                          golds=["delivered on 19 April"], answer=answer)  # fmt: skip
        return support_rubric(0.5, weight).evaluate(traj)[0]

    wrong_day, lazy, right = "delivered on 29 April", "shipped", "delivered on 19 April"
    assert reward(wrong_day, 0.5) - reward(wrong_day, 0.0) == pytest.approx(0.5 * 0.75)
    assert reward(lazy, 0.5) == reward(lazy, 0.0)
    assert reward(right, 0.5) - reward(right, 0.0) == pytest.approx(0.5)
    assert reward(right, 0.5) > reward(wrong_day, 0.5) > reward(lazy, 0.5)
    with pytest.raises(ConfigError, match="answer_f1_weight: a weight in"):
        SupportDemoConfig(answer_f1_weight=1.5)
