"""The expert for real questions (HotpotQA, SQuAD): demonstrations through the real environment, for SFT.

What: `RealExpert.demonstrate(tokenizer, envs, rows)` runs one episode per `searchrl.data.realqa` row through
the real `HFGenerator` and `SearchEnvironment`, every token of every turn forced (`RealExpertForcing`, a
`TokenForcing`) and no model run (`HFGenerator(None, ...)`, as `ExpertPolicy.demonstrate` replays the
synthetic expert). A demonstration's ids, masks and spans are therefore exactly what a policy writing the
same text would have produced; nothing is rendered by hand.

How it acts, deciding turn t only when it starts (after observation t-1 reached the environment):

1. search the question text itself (BM25 ranks a supporting paragraph first for about three quarters of
   the questions; `searchrl.data.realqa.supporting_recall`);
2. while a supporting paragraph has not been shown yet and searches are left (`max_searches`), search its
   title: for a HotpotQA bridge question that is the bridge entity, named in the first paragraph; for a
   comparison question the other entity, named in the question. SQuAD's one paragraph shares its title
   with the whole article, so by default SQuAD gets the question search only (`title_search_sources`);
3. answer `<answer>GOLD [n]</answer>`: the shortest gold answer that a shown document contains (the row's
   first gold when none does, e.g. "yes"/"no"), citing, by the label the environment showed, the shown
   documents that contain it (supporting ones first), else the shown supporting documents.

Why the oracle knows the supporting titles: it demonstrates the protocol and a search strategy a policy
can learn (copy the question, then a name it read), on training questions only. What it cannot do from
the text alone it does not pretend to: `supported_demonstration` tells which demonstrations really show
their answer (a cited document contains it, or for a yes/no comparison every supporting paragraph was
shown), and the demo trains only on those, so the warm start never learns to answer what it did not read.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from transformers import PreTrainedTokenizerBase

from searchrl.common.config import ConfigError
from searchrl.common.trajectory import Trajectory
from searchrl.env.protocol import format_answer
from searchrl.rewards.qa import contains_answer, normalize_answer
from searchrl.rollout.generator import GenerationConfig, HFGenerator
from searchrl.sft.forcing import PlannedTurnForcing, question_query

REAL_EXPERT = "real_expert"
REQUIRED_FIELDS = ("question", "golds", "supporting_doc_ids", "supporting_titles")
YES_NO = ("yes", "no")
REAL_SOURCES = ("hotpotqa", "squad")


@dataclass
class RealExpertConfig:
    """How the real-question expert searches and answers."""

    max_searches: int = field(
        default=2,
        metadata={
            "help": "Most searches per demonstration: the question first, then the titles of supporting "
            "paragraphs not shown yet. The environment must allow this many tool calls and one more turn."
        },
    )
    title_search_sources: list[str] = field(
        default_factory=lambda: ["hotpotqa"],
        metadata={
            "help": f"Sources ({list(REAL_SOURCES)}) whose missing supporting paragraphs are searched by title "
            "after the question search. SQuAD is off by default: its paragraphs share the article's title."
        },
    )
    k: int = field(
        default=1,
        metadata={"help": "Documents per search (the 'k' of a chat tool call; search_r1 uses topk)."},
    )
    max_query_chars: int = field(
        default=256,
        metadata={"help": "A question longer than this is cut at a word boundary to be the query."},
    )

    def __post_init__(self) -> None:
        if self.max_searches < 1:
            raise ConfigError(f"max_searches: must be >= 1 (the question search), got {self.max_searches}")
        unknown = sorted(set(self.title_search_sources) - set(REAL_SOURCES))
        if unknown:
            raise ConfigError(
                f"title_search_sources: unknown source(s) {unknown}; choose from {list(REAL_SOURCES)}"
            )
        if self.k < 1:
            raise ConfigError(f"k: must be >= 1, got {self.k}")
        if self.max_query_chars < 8:
            raise ConfigError(f"max_query_chars: must be >= 8, got {self.max_query_chars}")


@dataclass
class _Plan:
    """What the expert has decided for one row so far."""

    row: dict[str, Any]
    texts: list[str] = field(default_factory=list)
    searches: list[str] = field(default_factory=list)
    answer: str | None = None
    cited: list[str] = field(default_factory=list)  # document ids


def _shown(env: Any) -> dict[str, str]:
    """Documents the episode has shown so far (doc id -> shown title and text), in the order shown."""
    return dict(getattr(env, "retrieved", {}) or {})


def choose_answer(golds: Sequence[str], shown: dict[str, str]) -> str:
    """The shortest gold that a shown document contains (whole words, normalised); else the first gold."""
    visible = [g for g in golds if normalize_answer(g) and any(contains_answer(t, g) for t in shown.values())]
    if visible:
        return min(visible, key=lambda g: (len(normalize_answer(g).split()), len(g)))
    return str(golds[0])


def choose_citations(answer: str, shown: dict[str, str], supporting: Sequence[str]) -> list[str]:
    """Shown documents that contain `answer` (supporting ones first); else the shown supporting documents."""
    holding = [d for d, text in shown.items() if contains_answer(text, answer)]
    if holding:
        return sorted(holding, key=lambda d: (d not in supporting, list(shown).index(d)))
    return [d for d in shown if d in supporting]


class RealExpertForcing(PlannedTurnForcing[_Plan]):
    """A `TokenForcing` that decides each turn's text when the turn starts, from the environment's state."""

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        envs: Sequence[Any],
        plans: Sequence[_Plan],
        config: RealExpertConfig,
    ) -> None:
        super().__init__(tokenizer, envs, plans, config.k)
        self.config = config

    def next_text(self, row: int, turn: int) -> str:
        return self._next_text(row, self.plans[row])

    def _next_text(self, row: int, plan: _Plan) -> str:
        env = self.envs[row]
        r = plan.row
        if not plan.searches:
            return self.search_call(row, question_query(str(r["question"]), self.config.max_query_chars))
        shown = _shown(env)
        supporting = [str(d) for d in r["supporting_doc_ids"]]
        titles = [str(t) for t in r["supporting_titles"]]
        if str(r.get("source", "")) in self.config.title_search_sources:
            answer_now = choose_answer(r["golds"], shown)
            complete = all(d in shown for d in supporting)
            # A bridge answer already read (in a supporting paragraph) needs no second hop.
            read_in_support = any(contains_answer(shown[d], answer_now) for d in supporting if d in shown)
            done = complete or (r.get("type") != "comparison" and read_in_support)
            if not done and len(plan.searches) < self.config.max_searches:
                missing = [t for d, t in zip(supporting, titles, strict=False) if d not in shown]
                untried = [t for t in dict.fromkeys(missing) if t not in plan.searches]
                if untried:
                    return self.search_call(row, untried[0])
        plan.answer = choose_answer(r["golds"], shown)
        plan.cited = choose_citations(plan.answer, shown, supporting)
        label = getattr(env, "citation_label", None)
        return format_answer(plan.answer, [label(d) if label else d for d in plan.cited])


class RealExpert:
    """Plans and replays demonstrations for `searchrl.data.realqa` rows (see the module docstring)."""

    def __init__(self, config: RealExpertConfig | None = None) -> None:
        self.config = config or RealExpertConfig()

    @staticmethod
    def check_rows(rows: Sequence[dict[str, Any]]) -> None:
        for i, row in enumerate(rows):
            missing = [k for k in REQUIRED_FIELDS if k not in row]
            if missing or not row.get("golds"):
                raise ValueError(
                    f"row {i} ({row.get('id', '?')}): the real expert needs rows with {list(REQUIRED_FIELDS)} and "
                    f"at least one gold (missing: {missing or ['golds']}); build them with `searchrl data realqa` "
                    "(searchrl.data.realqa)"
                )

    def check_budgets(self, envs: Sequence[Any]) -> None:
        """One turn per search plus one to answer, and `max_searches` tool calls."""
        need_turns, need_calls = self.config.max_searches + 1, self.config.max_searches
        for env in envs:
            cfg = getattr(env, "config", None)
            if cfg is not None and (cfg.max_turns < need_turns or cfg.max_tool_calls < need_calls):
                raise ValueError(
                    f"the real expert makes up to {need_calls} searches and then answers: it needs max_turns >= "
                    f"{need_turns} and max_tool_calls >= {need_calls}, the environment allows {cfg.max_turns} and "
                    f"{cfg.max_tool_calls}; raise them, or lower RealExpertConfig.max_searches"
                )

    def demonstrate(
        self,
        tokenizer: PreTrainedTokenizerBase,
        envs: Sequence[Any],
        rows: Sequence[dict[str, Any]],
        generation: GenerationConfig | None = None,
    ) -> list[Trajectory]:
        """One forced, model-free episode per (env, row). Metadata: `expert_kind`, `expert_searches`,
        `expert_answer`, `expert_cited`, `supported` (see `supported_demonstration`), `source`, `type`."""
        if len(envs) != len(rows):
            raise ValueError(f"demonstrate needs one environment per row: got {len(envs)} and {len(rows)}")
        self.check_rows(rows)
        self.check_budgets(envs)
        plans = [_Plan(row=dict(r)) for r in rows]
        forcing = RealExpertForcing(tokenizer, envs, plans, self.config)
        generation = generation or GenerationConfig(max_new_tokens_per_turn=256, max_episode_tokens=2048)
        batch = HFGenerator(None, tokenizer, generation, forcing=forcing).rollout(list(envs), list(rows))
        for traj, plan in zip(batch.trajectories, plans, strict=True):
            traj.metadata.update(
                expert_kind=REAL_EXPERT,
                expert_searches=list(plan.searches),
                expert_answer=plan.answer,
                expert_cited=list(plan.cited),
                source=plan.row.get("source"),
                type=plan.row.get("type"),
                hops=plan.row.get("hops"),
            )
            traj.metadata["supported"] = supported_demonstration(traj, plan.row)
        return batch.trajectories


def supported_demonstration(traj: Trajectory, row: dict[str, Any]) -> bool:
    """Did the demonstration answer what it read? Answered, with a cited shown document containing the
    answer, or (a yes/no answer) with every supporting paragraph shown and cited."""
    if traj.termination != "answered" or traj.answer is None:
        return False
    cited = [d for d in traj.citations if d in traj.retrieved]
    if any(contains_answer(traj.retrieved[d], traj.answer) for d in cited):
        return True
    supporting = set(row.get("supporting_doc_ids", []))
    return normalize_answer(traj.answer) in YES_NO and bool(supporting) and supporting <= set(cited)
