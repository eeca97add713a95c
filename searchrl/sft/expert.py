"""The expert policy: solves synthetic questions through the real environment, for the SFT warm start.

What: `ExpertPolicy.demonstrate(model, tokenizer, envs, rows)` runs one episode per synthetic row through
the real `HFGenerator` and the real `SearchEnvironment`, but every token of every turn is forced from the
expert's text (`ExpertForcing`, a `TokenForcing`). So a demonstration's ids, masks, spans and logprobs are
exactly what a policy that wrote the same text would have produced: nothing is rendered by hand.

How the expert acts (chat protocol, one tool call per turn):

1. hop 1: search "<entity the question names> <relation word>" (`synthetic.expert_queries`);
2. two-hop questions: read the hop-1 observation, find the fact sentence about the subject and take
   its object as the bridge entity, then search "<bridge> <second relation word>". If retrieval did not
   surface (or the observation truncated) the fact sentence, the expert falls back to the oracle bridge
   name from the row (`bridge_source = "oracle"` in the trajectory's metadata), so a demonstration never
   stalls on a retrieval miss;
3. answer `<answer>ANSWER [doc_id]</answer>`, with the answer read from the retrieved fact sentence (the
   row's first gold when the sentence is absent) and the id of the retrieved document that states it.

Turn t's text is decided only when turn t starts, after observation t-1 reached the environment; the
forcing hook reads the environment's state (`records`, `retrieved`) at that moment, so the generator
needed no change.

The noise knob: with probability `noise` a demonstration is imperfect, of one kind drawn from
`noise_kinds` among those that apply to the row (so the warm start leaves room for RL):

- ``no_search``: answers at once, without searching, with a guess (another row's answer of the same type);
- ``one_hop``: a two-hop question answered after the first hop, with the bridge entity;
- ``no_citation``: the right path and answer, but no citation;
- ``wrong_entity``: searches another row's subject and answers from what that search returned.
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from transformers import PreTrainedModel, PreTrainedTokenizerBase

from searchrl.common.config import ConfigError
from searchrl.common.trajectory import Trajectory

# FACT_TEMPLATES: the corpus's fact sentences per relation. Reading the bridge entity "from the retrieved
# text" needs their shapes; they are the data room's, imported rather than restated.
from searchrl.data.synthetic_text import (
    FACT_TEMPLATES,
    RELATION_WORDS,
    expert_queries,
    relation_chain,
)
from searchrl.env.protocol import format_answer
from searchrl.rollout.generator import GenerationConfig, HFGenerator
from searchrl.sft.forcing import PlannedTurnForcing

EXPERT = "expert"
NOISE_KINDS: tuple[str, ...] = ("no_search", "one_hop", "no_citation", "wrong_entity")


@dataclass
class ExpertConfig:
    """How the expert demonstrates: its noise, search depth and seed."""

    noise: float = field(
        default=0.0,
        metadata={"help": "Share of demonstrations in [0, 1] that are imperfect (one of noise_kinds)."},
    )
    noise_kinds: list[str] = field(
        default_factory=lambda: list(NOISE_KINDS),
        metadata={"help": f"Kinds of imperfect demonstration to draw from; any of {list(NOISE_KINDS)}."},
    )
    k: int = field(default=3, metadata={"help": "Documents per expert search (the 'k' of its tool call)."})
    seed: int = field(default=0, metadata={"help": "Seed of which rows get which imperfection."})

    def __post_init__(self) -> None:
        if not 0.0 <= self.noise <= 1.0:
            raise ConfigError(f"noise: must be between 0 and 1 (a share of demonstrations), got {self.noise}")
        unknown = sorted(set(self.noise_kinds) - set(NOISE_KINDS))
        if unknown:
            raise ConfigError(f"noise_kinds: unknown kind(s) {unknown}; choose from {list(NOISE_KINDS)}")
        if self.noise > 0 and not self.noise_kinds:
            raise ConfigError("noise_kinds: empty while noise > 0; name at least one kind or set noise to 0")
        if self.k < 1:
            raise ConfigError(f"k: must be >= 1, got {self.k}")


# -- reading documents ----------------------------------------------------------------------------------


def _template_regex(template: str, subject: str) -> re.Pattern[str]:
    """A regex for one fact template with the subject filled in and the object captured."""
    head, _, tail = template.partition("{o}")
    parts = []
    for piece in (head, tail):
        s_head, s_sep, s_tail = piece.partition("{s}")
        # The lookbehind keeps "Kala Rin" from matching inside a longer look-alike name "Bokala Rin".
        subject_re = r"(?<![\w])" + re.escape(subject) if s_sep else ""
        parts.append(re.escape(s_head) + subject_re + re.escape(s_tail))
    # An entity name never holds a period, so the object runs to the sentence's full stop.
    return re.compile(parts[0] + r"(?P<o>[^.\n]+?)" + parts[1])


def read_fact_object(text: str, relation: str, subject: str) -> str | None:
    """The object of the fact `relation(subject, ?)` if `text` states it in a corpus sentence, else None."""
    # Longest template first: "born in the city of {o}." must win over "born in {o}." on the same sentence.
    for template in sorted(FACT_TEMPLATES.get(relation, ()), key=len, reverse=True):
        match = _template_regex(template, subject).search(text)
        if match:
            return match.group("o").strip()
    return None


def find_fact(
    retrieved: dict[str, str], doc_ids: Sequence[str], relation: str, subject: str
) -> tuple[str, str] | None:
    """(doc_id, object) of the first document, in rank order, that states `relation(subject, ?)`."""
    for doc_id in doc_ids:
        obj = read_fact_object(retrieved.get(doc_id, ""), relation, subject)
        if obj:
            return doc_id, obj
    return None


# -- one row's plan ------------------------------------------------------------------------------------


@dataclass
class _Episode:
    """What the expert knows and has decided for one row."""

    row: dict[str, Any]
    kind: str
    guess: str  # a wrong answer for "no_search"
    decoy_subject: str  # the entity searched by "wrong_entity"
    texts: list[str] = field(default_factory=list)  # decided turn texts, in order
    bridge_source: str | None = None
    searches: list[str] = field(default_factory=list)

    @property
    def chain(self) -> tuple[str, ...]:
        return relation_chain(str(self.row["relation"]))


class ExpertForcing(PlannedTurnForcing[_Episode]):
    """A `TokenForcing` that decides each turn's text when the turn starts, from the env's state then."""

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        envs: Sequence[Any],
        episodes: Sequence[_Episode],
        k: int = 3,
    ) -> None:
        super().__init__(tokenizer, envs, episodes, k)

    # -- text of a turn --------------------------------------------------------------------------------
    def next_text(self, row: int, turn: int) -> str:
        return self._next_text(row, self.plans[row], turn)

    def _next_text(self, row: int, ep: _Episode, turn: int) -> str:
        env = self.envs[row]
        chain = ep.chain
        if ep.kind == "no_search":
            return format_answer(ep.guess)
        if ep.kind == "wrong_entity":
            return self._wrong_entity_turn(row, ep, turn, env)
        if turn == 0:
            return self.search_call(row, expert_queries(ep.row)[0])
        hop1 = self._read_hop(env, turn_index=0, relation=chain[0], subject=str(ep.row["subject"]))
        if len(chain) == 1:
            return self._answer(ep, hop1, fallback=str(ep.row["golds"][0]), env=env)
        if ep.kind == "one_hop":  # stop after the first hop: the bridge is answered as if it were the answer
            return self._answer(ep, hop1, fallback=str(ep.row.get("bridge") or ep.row["golds"][0]), env=env)
        if turn == 1:
            bridge = hop1[1] if hop1 else None
            ep.bridge_source = "retrieved" if bridge else "oracle"
            bridge = bridge or str(ep.row["bridge"])
            return self.search_call(row, f"{bridge} {RELATION_WORDS[chain[1]]}")
        bridge = ep.searches[1].rsplit(" ", 1)[0]
        hop2 = self._read_hop(env, turn_index=1, relation=chain[1], subject=bridge)
        return self._answer(ep, hop2, fallback=str(ep.row["golds"][0]), env=env)

    def _wrong_entity_turn(self, row: int, ep: _Episode, turn: int, env: Any) -> str:
        relation = ep.chain[0]
        if turn == 0:
            return self.search_call(row, f"{ep.decoy_subject} {RELATION_WORDS[relation]}")
        found = self._read_hop(env, turn_index=0, relation=relation, subject=ep.decoy_subject)
        return self._answer(ep, found, fallback=ep.guess, env=env)

    @staticmethod
    def _read_hop(env: Any, turn_index: int, relation: str, subject: str) -> tuple[str, str] | None:
        """(doc_id, object) read from the documents the search of turn `turn_index` returned."""
        records = [r for r in getattr(env, "records", []) if r.turn_index == turn_index and r.status == "ok"]
        doc_ids = [d for r in records for d in r.doc_ids]
        return find_fact(dict(getattr(env, "retrieved", {}) or {}), doc_ids, relation, subject)

    @staticmethod
    def _answer(ep: _Episode, found: tuple[str, str] | None, fallback: str, env: Any = None) -> str:
        answer = found[1] if found else fallback
        cite = [found[0]] if found and ep.kind != "no_citation" else []
        # The label the environment showed the document with (its number, or its id).
        label = getattr(env, "citation_label", None)
        return format_answer(answer, [label(c) for c in cite] if label else cite)


# -- the expert ----------------------------------------------------------------------------------------


class ExpertPolicy:
    """Plans demonstrations (with the noise knob) and runs them through the real engine."""

    def __init__(self, config: ExpertConfig | None = None) -> None:
        self.config = config or ExpertConfig()

    def applicable_kinds(self, row: dict[str, Any]) -> list[str]:
        """The noise kinds that make sense for `row` (``one_hop`` only for two-hop questions)."""
        two_hop = len(relation_chain(str(row["relation"]))) == 2
        return [k for k in self.config.noise_kinds if k != "one_hop" or two_hop]

    def plan(self, rows: Sequence[dict[str, Any]]) -> list[_Episode]:
        """Decide, per row, which demonstration kind it gets; same seed and rows, same plan."""
        for i, row in enumerate(rows):
            missing = [k for k in ("question", "golds", "relation", "subject") if k not in row]
            if missing:
                raise ValueError(
                    f"row {i} ({row.get('id', '?')}): the expert needs synthetic rows with {missing}; "
                    "generate them with `searchrl data synth` (searchrl.data.synthetic)"
                )
        episodes = []
        for i, row in enumerate(rows):
            # One generator per row, keyed by the row itself: a row gets the same plan whichever batch it
            # is demonstrated in (one seed per call would repeat the same draws in every 64-row chunk).
            rng = random.Random(f"{self.config.seed}/{row.get('id', i)}/{row['question']}")
            kinds = self.applicable_kinds(row)
            imperfect = rng.random() < self.config.noise and bool(kinds)
            kind = rng.choice(kinds) if imperfect else EXPERT
            episodes.append(
                _Episode(
                    row=row,
                    kind=kind,
                    guess=_guess_for(rows, i, rng),
                    decoy_subject=_decoy_subject(rows, i, rng),
                )
            )
        return episodes

    def demonstrate(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        envs: Sequence[Any],
        rows: Sequence[dict[str, Any]],
        generation: GenerationConfig | None = None,
    ) -> list[Trajectory]:
        """One forced episode per (env, row); each trajectory's metadata says its kind and bridge source."""
        if len(envs) != len(rows):
            raise ValueError(f"demonstrate needs one environment per row: got {len(envs)} and {len(rows)}")
        _check_budgets(envs, rows)
        episodes = self.plan(rows)
        forcing = ExpertForcing(tokenizer, envs, episodes, k=self.config.k)
        generation = generation or GenerationConfig(
            temperature=1.0, max_new_tokens_per_turn=256, max_episode_tokens=2048
        )
        batch = HFGenerator(model, tokenizer, generation, forcing=forcing).rollout(list(envs), list(rows))
        for traj, ep in zip(batch.trajectories, episodes, strict=True):
            traj.metadata["expert_kind"] = ep.kind
            traj.metadata["bridge_source"] = ep.bridge_source
            traj.metadata["expert_searches"] = list(ep.searches)
        return batch.trajectories


def _check_budgets(envs: Sequence[Any], rows: Sequence[dict[str, Any]]) -> None:
    """The expert needs one turn per hop plus one to answer, and one search per hop."""
    for env, row in zip(envs, rows, strict=True):
        cfg = getattr(env, "config", None)
        if cfg is None:
            continue
        hops = len(relation_chain(str(row["relation"])))
        if cfg.max_turns < hops + 1 or cfg.max_tool_calls < hops:
            raise ValueError(
                f"row {row.get('id', '?')}: a {hops}-hop demonstration needs max_turns >= {hops + 1} and "
                f"max_tool_calls >= {hops}, the environment allows {cfg.max_turns} and {cfg.max_tool_calls}; "
                "raise them in EnvConfig"
            )


def _guess_for(rows: Sequence[dict[str, Any]], i: int, rng: random.Random) -> str:
    """Another row's answer of the same type (a plausible but wrong guess); a fixed word if none."""
    row = rows[i]
    golds = {str(g) for g in row.get("golds", [])}
    same_type = [
        str(r["golds"][0])
        for j, r in enumerate(rows)
        if j != i and r.get("answer_type") == row.get("answer_type") and r.get("golds")
    ]
    candidates = [g for g in same_type if g not in golds]
    return rng.choice(candidates) if candidates else "unknown"


def _decoy_subject(rows: Sequence[dict[str, Any]], i: int, rng: random.Random) -> str:
    """Another row's subject with the same first relation (so the decoy search finds a real fact)."""
    row = rows[i]
    first = relation_chain(str(row["relation"]))[0]
    others = [
        str(r["subject"])
        for j, r in enumerate(rows)
        if j != i
        and r.get("subject") != row.get("subject")
        and relation_chain(str(r["relation"]))[0] == first
    ]
    if not others:
        others = [str(r["subject"]) for j, r in enumerate(rows) if r.get("subject") != row.get("subject")]
    return rng.choice(others) if others else str(row["subject"])
