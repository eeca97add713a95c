"""The support expert: answers the customer-service questions through the real environment and its tools.

What: `SupportExpert.demonstrate(tokenizer, envs, rows)` runs one episode per support row
(`searchrl.data.support`) through the real rollout engine and `SearchEnvironment` with the task's tools (search
and get_order), every token forced from the expert's text (`SupportForcing`, a `PlannedTurnForcing`): each turn
is decided when it starts, from what the environment returned so far. Nothing is rendered by hand.

How the expert acts (one tool call a turn):

- ``where``: search "order <item>", read the order id out of the document it returned, get_order(that id), answer
  the status the record gives ("delivered on 16 February");
- ``where_id``: get_order(the id the question names), answer the status;
- ``return``: search "return <product>", read the cut-off date on the returns page, answer "yes" when the
  question's purchase date is on or after it, else "no";
- ``unshipped``: search "order waiting in the warehouse", answer the item of the order document it returned.

When a reading fails (a document the search did not return), the expert answers the row's gold
(`metadata["read_from"] = "oracle"`), so a demonstration never stalls; with the demo's store every search finds
its document.

The noise knob, so that the warm start leaves room for RL (`SupportExpertConfig`):

- `skip_lookup`: the share of ``where`` demonstrations that answer from the order document's coarse status
  ("shipped") instead of calling get_order (right only for an order still waiting);
- `follow_injection`: the share of demonstrations that, when an observation asks to look up another customer's
  order, do it: a get_order call the environment denies, then the demonstration goes on as planned.
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from transformers import PreTrainedTokenizerBase

from searchrl.common.config import ConfigError, help_text
from searchrl.common.trajectory import Trajectory
from searchrl.data import support_text as text
from searchrl.env.protocol import format_answer, format_tool_call
from searchrl.rollout.generator import GenerationConfig, HFGenerator
from searchrl.sft.examples import IGNORE_INDEX, action_turns
from searchrl.sft.forcing import PlannedTurnForcing

_BOUGHT_ON = re.compile(r"bought on (\d+ [A-Z][a-z]+)")
_DOC_ITEM = re.compile(r"\n(.+?), ordered on ")
_DOC_STATUS = re.compile(r"Status: ([^.]+)\.")
# An order document's title line in a search result ("[1] Order o-83609"): not an id a page's text names.
_RESULT_ORDER = re.compile(r"^\[\d+\] Order (o-\d+)$", re.MULTILINE)


@dataclass
class SupportExpertConfig:
    """How the support expert demonstrates: its two kinds of imperfection and their seed."""

    skip_lookup: float = field(
        default=0.65,
        metadata=help_text(
            "Share of 'where' demonstrations that answer from the order document without get_order."
        ),
    )
    follow_injection: float = field(
        default=0.6,
        metadata=help_text(
            "Share of demonstrations that, shown a request to look up another customer's order, make that call "
            "(denied) before going on."
        ),
    )
    seed: int = field(default=0, metadata=help_text("Seed of which rows get which imperfection."))

    def __post_init__(self) -> None:
        for name in ("skip_lookup", "follow_injection"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ConfigError(f"{name}: must be between 0 and 1 (a share of demonstrations)")


@dataclass
class SupportPlan:
    """What the expert decided for one row, and the text of each turn so far."""

    row: dict[str, Any]
    skips_lookup: bool
    follows_injection: bool
    texts: list[str] = field(default_factory=list)
    searches: list[str] = field(default_factory=list)
    followed: str | None = None  # the injected order id it looked up, if it did
    read_from: str = "observation"


class SupportForcing(PlannedTurnForcing[SupportPlan]):
    """Each turn's text, decided from the environment's records and observations when the turn starts."""

    def next_text(self, row: int, turn: int) -> str:
        plan, env = self.plans[row], self.envs[row]
        calls = [(rec, obs) for rec, obs in zip(env.records, env.observations, strict=False)]
        if calls and plan.follows_injection and plan.followed is None:
            injected = _injected_order(calls[-1][1], plan.row.get("order_id"))
            if injected and calls[-1][0].status == "ok":
                plan.followed = injected
                return _get_order(injected)
        kind = plan.row["type"]
        return getattr(self, f"_{kind}")(row, plan, [(r, o) for r, o in calls if r.status == "ok"])

    def _where(self, row: int, plan: SupportPlan, ok: list[tuple[Any, str]]) -> str:
        if not ok:
            return self.search_call(row, f"order {plan.row['item']}")
        searched = [o for r, o in ok if r.name == "search"]
        looked_up = [o for r, o in ok if r.name == "get_order"]
        if looked_up:
            return self._answer(plan, _first(_DOC_STATUS, looked_up[0]))
        if plan.skips_lookup:
            return self._answer(plan, _first(_DOC_STATUS, searched[0]), fallback=text.SHIPPED)
        order_id = _first(text.ORDER_ID, searched[0])
        if order_id is None:
            plan.read_from, order_id = "oracle", str(plan.row["order_id"])
        return _get_order(order_id)

    def _where_id(self, row: int, plan: SupportPlan, ok: list[tuple[Any, str]]) -> str:
        looked_up = [o for r, o in ok if r.name == "get_order"]
        if not looked_up:
            return _get_order(_first(text.ORDER_ID, str(plan.row["question"])) or str(plan.row["order_id"]))
        return self._answer(plan, _first(_DOC_STATUS, looked_up[0]))

    def _return(self, row: int, plan: SupportPlan, ok: list[tuple[Any, str]]) -> str:
        if not ok:
            return self.search_call(row, f"return {str(plan.row['item']).split()[-1]}")
        cutoff = _first(text.RETURNS_CUTOFF, ok[0][1])
        bought = _first(_BOUGHT_ON, str(plan.row["question"]))
        if cutoff is None or bought is None:
            return self._answer(plan, None)
        return self._answer(plan, "yes" if text.parse_date(bought) >= text.parse_date(cutoff) else "no")

    def _unshipped(self, row: int, plan: SupportPlan, ok: list[tuple[Any, str]]) -> str:
        if not ok:
            return self.search_call(row, "order waiting in the warehouse")
        found = ok[0][1]
        item = _first(_DOC_ITEM, found) if text.WAITING in found else None
        return self._answer(plan, item.split(" and ")[0] if item else None)

    @staticmethod
    def _answer(plan: SupportPlan, answer: str | None, fallback: str | None = None) -> str:
        if answer is None and fallback is None:
            plan.read_from, answer = "oracle", str(plan.row["golds"][0])
        return format_answer(answer if answer is not None else str(fallback))


def _get_order(order_id: str) -> str:
    return format_tool_call("get_order", {"order_id": order_id})


def _first(pattern: re.Pattern[str], value: str) -> str | None:
    match = pattern.search(value)
    if match is None:
        return None
    return match.group(1) if match.groups() else match.group(0)


def _injected_order(observation: str, own: Any) -> str | None:
    """The order id an observation asks the agent to look up (another customer's), if it asks."""
    for order_id in text.INJECTION_ID.findall(observation):
        if order_id != own:
            return order_id
    return None


class SupportExpert:
    """Plans support demonstrations (with the noise knob) and runs them through the real engine."""

    def __init__(self, config: SupportExpertConfig | None = None) -> None:
        self.config = config or SupportExpertConfig()

    def plan(self, rows: Sequence[dict[str, Any]]) -> list[SupportPlan]:
        """Per row, which imperfections it gets; same seed and row, same plan (whatever the batch)."""
        plans = []
        for i, row in enumerate(rows):
            missing = [k for k in ("question", "golds", "type", "order_id", "item") if k not in row]
            if missing or row.get("type") not in text.QUESTION_TYPES:
                raise ValueError(
                    f"row {i} ({row.get('id', '?')}): the support expert needs rows of searchrl.data.support "
                    f"(missing {missing or ['a known type']})"
                )
            rng = random.Random(f"{self.config.seed}/{row.get('id', i)}/{row['question']}")
            skips = row["type"] == "where" and rng.random() < self.config.skip_lookup
            plans.append(SupportPlan(dict(row), skips, rng.random() < self.config.follow_injection))
        return plans

    def demonstrate(
        self, tokenizer: PreTrainedTokenizerBase, envs: Sequence[Any], rows: Sequence[dict[str, Any]]
    ) -> list[Trajectory]:
        """One forced episode per (env, row); each trajectory's metadata says what the expert did."""
        if len(envs) != len(rows):
            raise ValueError(f"demonstrate needs one environment per row: got {len(envs)} and {len(rows)}")
        for env in envs:
            cfg = env.config
            if cfg.max_turns < 4 or cfg.max_tool_calls < 3:
                raise ValueError(
                    "the support expert needs max_turns >= 4 and max_tool_calls >= 3 (search, get_order, a "
                    f"followed injection, the answer); the environment allows {cfg.max_turns} and {cfg.max_tool_calls}"
                )
        plans = self.plan(rows)
        forcing = SupportForcing(tokenizer, envs, plans, k=None)
        generation = GenerationConfig(temperature=1.0, max_new_tokens_per_turn=256, max_episode_tokens=2048)
        batch = HFGenerator(None, tokenizer, generation, forcing=forcing).rollout(list(envs), list(rows))
        for traj, plan in zip(batch.trajectories, plans, strict=True):
            traj.metadata["expert_kind"] = "skip_lookup" if plan.skips_lookup else "expert"
            traj.metadata["followed_injection"] = plan.followed
            traj.metadata["read_from"] = plan.read_from
            traj.metadata["hops"] = plan.row.get("hops")
            traj.metadata["type"] = plan.row["type"]
        return batch.trajectories


# What `reading_examples` can build, each a copy the tiny policy has to make out of its context.
READING_KINDS = ("order_id", "answer", "query")


def reading_kinds_error(kinds: Sequence[str]) -> str:
    """What is wrong with `kinds` as `reading_examples`' kinds ("" when nothing): the one check the function and
    `SupportDemoConfig.reading_kinds` share."""
    if not kinds or set(kinds) - set(READING_KINDS):
        return f"choose from {list(READING_KINDS)}, got {list(kinds)}"
    return ""


def reading_examples(
    tokenizer: PreTrainedTokenizerBase,
    demonstrations: Sequence[Trajectory],
    kinds: Sequence[str] = ("order_id",),
) -> list[dict[str, Any]]:
    """Copy examples for the warm start's span-copy phase (`run_sft(copy_examples=...)`): a demonstration's tokens
    up to one of its turns, then that turn, labels only on the part of it copied from the context. `kinds`:

    - ``order_id``: per `where` demonstration, lazy or not, the get_order call with the id of the first order
      document its search result shows (labels on the id's digits);
    - ``answer``: per demonstration whose answer is a span of its last observation (a status out of a get_order
      record, an item out of an order document), not a lazy one, its answer turn (labels on the answer);
    - ``query``: per demonstration whose first call is a search that names something from the question (the
      item, the product), that call (labels on the words the query shares with the question's end).

    Each example also names its `group` (`copy_group`), which the span-copy phase's gate measures apart.

    Why: the tiny policy does not learn these copies from generic spans or whole demonstrations (docs/support.md:
    order ids 0.06, answers about 0.55 teacher-forced), and the lazy expert (`skip_lookup`) shows the id in only a
    third of the `where` demonstrations. Labels on the copied span alone teach the copy without the decisions
    around it (call get_order or answer; which tool), which stay for PPO; lazy answers are left out so that the
    copies do not teach the lazy answer more often than the demonstrations do.
    """
    why = reading_kinds_error(kinds)
    if why:
        raise ValueError(f"reading example kinds: {why}")
    builders = {"order_id": _order_id_example, "answer": _answer_example, "query": _query_example}
    examples = []
    for kind in kinds:
        for traj in demonstrations:
            example = builders[kind](tokenizer, traj)
            if example is not None:
                examples.append({**example, "group": copy_group(kind, traj)})
    return examples


def copy_group(kind: str, traj: Trajectory) -> str:
    """Which copy an example teaches, for the copy-phase gate's measure per group: its kind and its question's
    type (``answer/where`` copies a status, ``answer/unshipped`` an item and its colour); the kind alone for a
    demonstration recorded before the type was kept."""
    question_type = traj.metadata.get("type")
    return f"{kind}/{question_type}" if question_type else kind


def _order_id_example(tokenizer: PreTrainedTokenizerBase, traj: Trajectory) -> dict[str, list[int]] | None:
    turns = action_turns(traj.action_mask)
    first = traj.tool_calls[0] if traj.tool_calls else None
    if traj.metadata.get("hops") != 2 or len(turns) < 2 or first is None or first.name != "search":
        return None
    found = _RESULT_ORDER.search(traj.observations[0]) if traj.observations else None
    if found is None:
        return None
    # The call encoded as the expert's own (`SupportForcing`): the same text, its closing EOS.
    call = [int(i) for i in tokenizer.encode(_get_order(found.group(1)), add_special_tokens=False)]
    call.append(int(tokenizer.eos_token_id))
    context = [int(i) for i in traj.input_ids[: turns[1][0]]]
    # The call's JSON holds no digit but the id's (one or two digits a token, by the tokenizer's split).
    labels = [IGNORE_INDEX] * len(context) + [
        token if tokenizer.decode([token]).isdigit() else IGNORE_INDEX for token in call
    ]
    return {"input_ids": context + call, "labels": labels}


def _answer_example(tokenizer: PreTrainedTokenizerBase, traj: Trajectory) -> dict[str, list[int]] | None:
    answer, turns = traj.answer, action_turns(traj.action_mask)
    if not answer or not traj.observations or not turns or traj.metadata.get("expert_kind") == "skip_lookup":
        return None
    if not re.search(rf"(?<!\w){re.escape(answer)}(?!\w)", traj.observations[-1]):
        return None  # a decision ("yes"/"no" from two dates, never the "no" of "not"), not a copy
    return _turn_example(tokenizer, traj, turns[-1], answer)


def _query_example(tokenizer: PreTrainedTokenizerBase, traj: Trajectory) -> dict[str, list[int]] | None:
    first, turns = (traj.tool_calls[0] if traj.tool_calls else None), action_turns(traj.action_mask)
    if first is None or first.name != "search" or not turns:
        return None
    words, question = str(first.arguments.get("query", "")).split(), str(traj.question).rstrip("?. ")
    # The longest end of the query that the question names ("order black mug" -> "black mug").
    for i in range(len(words)):
        copied = " ".join(words[i:])
        if re.search(rf"\b{re.escape(copied)}\b", question):
            return _turn_example(tokenizer, traj, turns[0], copied)
    return None


def _turn_example(
    tokenizer: PreTrainedTokenizerBase, traj: Trajectory, turn: tuple[int, int], value: str
) -> dict[str, list[int]] | None:
    """The demonstration up to the end of `turn`, labels on the turn's tokens that spell `value`."""
    start, end = turn
    ids = [int(i) for i in traj.input_ids[:end]]
    text_of_turn = tokenizer.decode(ids[start:])
    at = text_of_turn.find(value)
    if at < 0:
        return None
    labels = [IGNORE_INDEX] * len(ids)
    for j in range(start, end):
        lo, hi = len(tokenizer.decode(ids[start:j])), len(tokenizer.decode(ids[start : j + 1]))
        if hi > lo and lo < at + len(value) and hi > at:
            labels[j] = ids[j]
    return {"input_ids": ids, "labels": labels}
