"""The offline, verifiable default task: a seeded world of invented entities, a corpus that states its facts,
and single-hop and two-hop questions that only that corpus can answer.

Why synthetic: a search agent must be trainable and testable offline, on two CPU cores, with answers that
are checkable and never in a model's pre-training data. The names are made of random syllables, so a fact
such as "Alda Korin was born in Port Velmora." exists nowhere but in this corpus; a policy can only get it
right by searching. Sentences are templated and the vocabulary is small, so a tiny transformer can learn
the task and BM25 on the question's words finds the supporting document.

The world: countries, cities (located in a country; each country has a capital), organisations (founded
in a city), people (born in a city, employee of an organisation) and works (films directed by a person).
Each fact is one short document whose title is its subject; distractor documents mention the subject in
passing or state a fact about a look-alike entity (same first name, same "Port ..." prefix).

Splits: every entity is assigned to train, dev or test; a question belongs to the split of its answer
entity, and a train question never names a dev or test entity. So the test split's answers never appear
in train questions or train answers. Everything is drawn from one `random.Random(seed)`: the same config
gives byte-identical files.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from searchrl.common.config import ConfigError
from searchrl.common.io import atomic_write_json, write_jsonl

SPLITS = ("train", "dev", "test")

_ONSETS = (
    "b",
    "d",
    "f",
    "g",
    "k",
    "l",
    "m",
    "n",
    "p",
    "r",
    "s",
    "t",
    "v",
    "z",
    "br",
    "dr",
    "kr",
    "tr",
    "th",
    "sh",
)
_VOWELS = ("a", "e", "i", "o", "u")
_CODAS = ("", "", "", "n", "r", "l", "s")
_CITY_PREFIXES = ("Port", "Lake", "Mount", "Fort", "New")
_ORG_SUFFIXES = ("Institute", "Company", "Guild", "Society", "Foundry", "Press", "Bank", "Works")
_WORK_NOUNS = ("Chronicle", "Garden", "Voyage", "Song", "Mirror", "Harvest", "Lantern", "Tide")

# Fact documents: the sentence shares its relation word with the question ("born", "employee",
# "founded", "directed", "country", "capital") so BM25 without stemming still ranks it first.
_FACT_TEMPLATES: dict[str, tuple[str, ...]] = {
    "born_in": ("{s} was born in {o}.", "{s} was born in the city of {o}."),
    "employee_of": ("{s} is an employee of {o}.", "{s} works as an employee of {o}."),
    "founded_in": ("{s} was founded in {o}.", "{s} was founded in the city of {o}."),
    "directed_by": ("{s} is a film directed by {o}.", "{s} was directed by {o}."),
    "located_in": ("{s} is a city in the country of {o}.", "{s} lies in the country of {o}."),
    "capital_of": ("The capital of {s} is {o}.", "{o} is the capital of {s}."),
}
_ALIAS_SENTENCE = " It is also called {alias}."

_SINGLE_HOP_QUESTIONS: dict[str, tuple[str, ...]] = {
    "born_in": ("Where was {s} born?", "In which city was {s} born?"),
    "employee_of": ("Which organisation is {s} an employee of?", "Who is {s} an employee of?"),
    "founded_in": ("Where was {s} founded?", "In which city was {s} founded?"),
    "directed_by": ("Who directed {s}?", "Which person directed {s}?"),
    "located_in": ("In which country is {s}?", "Which country is {s} in?"),
    "capital_of": ("What is the capital of {s}?", "Which city is the capital of {s}?"),
}

# Two-hop: (name, first relation, second relation, question templates).
_TWO_HOP_CHAINS: tuple[tuple[str, str, str, tuple[str, ...]], ...] = (
    (
        "director_birthplace",
        "directed_by",
        "born_in",
        (
            "Where was the person who directed {s} born?",
            "In which city was the person who directed {s} born?",
        ),
    ),
    (
        "director_employer",
        "directed_by",
        "employee_of",
        ("Which organisation is the person who directed {s} an employee of?",),
    ),
    ("birth_country", "born_in", "located_in", ("In which country was {s} born?",)),
    (
        "employer_founding_city",
        "employee_of",
        "founded_in",
        ("Where was the organisation that {s} is an employee of founded?",),
    ),
    ("founding_country", "founded_in", "located_in", ("In which country was {s} founded?",)),
)

_MENTION_TEMPLATES = (
    "A review of {work} mentions {s} in passing.",
    "{s} appears in a footnote of {work}.",
)

# The word each fact document shares with its questions; an expert's query is the entity name plus it.
RELATION_WORDS = {
    "born_in": "born",
    "employee_of": "employee",
    "founded_in": "founded",
    "directed_by": "directed",
    "located_in": "country",
    "capital_of": "capital",
}

_ANSWER_TYPES = {"city": "place", "country": "place", "org": "organisation", "person": "person"}


@dataclass
class SynthConfig:
    """Sizes and seed of a synthetic world; every field has a help string for `--help` and the README."""

    seed: int = field(
        default=0, metadata={"help": "Random seed; the same config gives byte-identical files."}
    )
    num_countries: int = field(default=24, metadata={"help": "Countries (each has a capital city)."})
    num_cities: int = field(default=160, metadata={"help": "Cities; at least num_countries."})
    num_orgs: int = field(default=120, metadata={"help": "Organisations (each founded in a city)."})
    num_people: int = field(
        default=700, metadata={"help": "People (born in a city, employee of an organisation)."}
    )
    num_works: int = field(default=500, metadata={"help": "Films (each directed by a person)."})
    first_name_pool: int = field(
        default=120, metadata={"help": "Distinct first names shared by people, so look-alike names occur."}
    )
    city_alias_share: float = field(
        default=0.5, metadata={"help": "Share of cities named 'Port X' etc., with the bare 'X' as an alias."}
    )
    distractors_per_fact: int = field(
        default=1, metadata={"help": "Distractor documents per fact (mentions and look-alike entities)."}
    )
    train_questions: int = field(default=2000, metadata={"help": "Questions in the train split."})
    dev_questions: int = field(default=200, metadata={"help": "Questions in the dev split."})
    test_questions: int = field(
        default=200, metadata={"help": "Questions in the test split (never for training)."}
    )
    two_hop_share: float = field(default=0.4, metadata={"help": "Share of two-hop questions in each split."})
    dev_entity_share: float = field(
        default=0.12, metadata={"help": "Share of entities whose questions go to dev."}
    )
    test_entity_share: float = field(
        default=0.12, metadata={"help": "Share of entities whose questions go to test."}
    )

    def __post_init__(self) -> None:
        counts = ("num_countries", "num_cities", "num_orgs", "num_people", "num_works", "first_name_pool")
        for name in counts:
            if getattr(self, name) < 1:
                raise ConfigError(f"SynthConfig.{name} must be at least 1, got {getattr(self, name)}")
        for name in ("train_questions", "dev_questions", "test_questions", "distractors_per_fact"):
            if getattr(self, name) < 0:
                raise ConfigError(f"SynthConfig.{name} must be 0 or more, got {getattr(self, name)}")
        if self.num_cities < self.num_countries:
            raise ConfigError(
                f"SynthConfig.num_cities ({self.num_cities}) must be at least num_countries ({self.num_countries}): "
                "every country needs a capital"
            )
        for name in ("city_alias_share", "two_hop_share", "dev_entity_share", "test_entity_share"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ConfigError(f"SynthConfig.{name} must be between 0 and 1, got {getattr(self, name)}")
        if self.dev_entity_share + self.test_entity_share >= 1.0:
            raise ConfigError(
                "SynthConfig.dev_entity_share + test_entity_share must be below 1 (train needs entities)"
            )


# Presets for `searchrl data synth --size`: tiny for tests (a second), default for the demo.
SIZE_PRESETS: dict[str, dict[str, Any]] = {
    "tiny": dict(
        num_countries=6, num_cities=24, num_orgs=16, num_people=60, num_works=40, first_name_pool=15,
        train_questions=60, dev_questions=20, test_questions=20, dev_entity_share=0.15, test_entity_share=0.15,
    ),
    "small": dict(
        num_countries=12, num_cities=60, num_orgs=40, num_people=200, num_works=140, first_name_pool=40,
        train_questions=500, dev_questions=100, test_questions=100,
    ),
    "default": {},
    "large": dict(
        num_countries=60, num_cities=600, num_orgs=500, num_people=3000, num_works=2000, first_name_pool=400,
        train_questions=10000, dev_questions=500, test_questions=500,
    ),
}  # fmt: skip


def preset_config(size: str = "default", seed: int = 0, **overrides: Any) -> SynthConfig:
    """A `SynthConfig` from a named size preset, with field overrides."""
    if size not in SIZE_PRESETS:
        raise ConfigError(f"unknown size {size!r}; choose one of {list(SIZE_PRESETS)}")
    return SynthConfig(**{**SIZE_PRESETS[size], "seed": seed, **overrides})


@dataclass
class Entity:
    """One invented thing of the world; `aliases` are other names that count as correct answers."""

    key: str
    kind: str
    name: str
    aliases: list[str] = field(default_factory=list)
    split: str = "train"

    @property
    def golds(self) -> list[str]:
        return [self.name, *self.aliases]


@dataclass
class Fact:
    relation: str
    subject: str
    obj: str
    doc_index: int = -1


@dataclass
class SynthTask:
    """A generated task: the corpus and the question splits (plus the world, for tests and the viewer)."""

    config: SynthConfig
    corpus: list[dict[str, str]]
    splits: dict[str, list[dict[str, Any]]]
    entities: dict[str, Entity]

    def write(self, out_dir: str | Path) -> dict[str, Path]:
        """Write corpus.jsonl, train/dev/test.jsonl and synth_config.json; returns the paths."""
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        paths = {"corpus": out / "corpus.jsonl"}
        write_jsonl(paths["corpus"], self.corpus)
        for split in SPLITS:
            paths[split] = out / f"{split}.jsonl"
            write_jsonl(paths[split], self.splits[split])
        paths["config"] = out / "synth_config.json"
        atomic_write_json(paths["config"], dataclasses.asdict(self.config))
        return paths


# -- names --------------------------------------------------------------------------------------------


def _template_words() -> set[str]:
    texts = [t for ts in _FACT_TEMPLATES.values() for t in ts]
    texts += [t for ts in _SINGLE_HOP_QUESTIONS.values() for t in ts]
    texts += [t for chain in _TWO_HOP_CHAINS for t in chain[3]] + list(_MENTION_TEMPLATES) + [_ALIAS_SENTENCE]
    words = {w.strip(".,?{}").lower() for t in texts for w in t.split()}
    words |= {w.lower() for w in (*_CITY_PREFIXES, *_ORG_SUFFIXES, *_WORK_NOUNS)}
    return words


class _NameMaker:
    """Invented capitalised words, each used once in the whole world (so names never collide).

    With a `pool`, words are drawn from it first (in a seeded random order): a practice world re-uses
    another world's words, see `practice_world`.
    """

    def __init__(self, rng: random.Random, pool: Sequence[str] = ()):
        self.rng = rng
        self.used: set[str] = _template_words()
        self.pool = list(pool)
        if self.pool:
            rng.shuffle(self.pool)

    def _syllable(self) -> str:
        return self.rng.choice(_ONSETS) + self.rng.choice(_VOWELS) + self.rng.choice(_CODAS)

    def word(self) -> str:
        while self.pool:
            candidate = self.pool.pop()
            if candidate.lower() not in self.used:
                self.used.add(candidate.lower())
                return candidate
        for _ in range(10_000):
            candidate = "".join(self._syllable() for _ in range(self.rng.choice((2, 2, 2, 3)))).capitalize()
            if candidate.lower() not in self.used:
                self.used.add(candidate.lower())
                return candidate
        raise RuntimeError("ran out of invented words; the world is too large for the syllable inventory")


# -- the world ----------------------------------------------------------------------------------------


class _WorldBuilder:
    def __init__(
        self, config: SynthConfig, name_pool: Sequence[str] = (), forbidden_names: Iterable[str] = ()
    ):
        self.cfg = config
        self.rng = random.Random(config.seed)
        self.names = _NameMaker(self.rng, name_pool)
        # Lower-cased names (and aliases) no entity of this world may carry: a practice world's entities
        # never share a name with the held-out entities of the world it practises for.
        self.forbidden = {n.lower() for n in forbidden_names}
        self.entities: dict[str, Entity] = {}
        self.by_kind: dict[str, list[str]] = {"country": [], "city": [], "org": [], "person": [], "work": []}
        self.facts: list[Fact] = []
        # (relation, subject key) -> object key
        self.relation: dict[tuple[str, str], str] = {}

    def _add(self, kind: str, name: str, aliases: list[str] | None = None) -> Entity:
        key = f"{kind}:{len(self.by_kind[kind])}"
        ent = Entity(key=key, kind=kind, name=name, aliases=aliases or [])
        self.entities[key] = ent
        self.by_kind[kind].append(key)
        return ent

    def _fact(self, relation: str, subject: str, obj: str) -> None:
        self.facts.append(Fact(relation, subject, obj))
        self.relation[(relation, subject)] = obj

    def allowed(self, make: Callable[[], tuple[str, list[str]]]) -> tuple[str, list[str]]:
        """`make()`'s (name, aliases), drawn again while any of them is forbidden (one call when none is)."""
        for _ in range(1000):
            name, aliases = make()
            if not {name.lower(), *(a.lower() for a in aliases)} & self.forbidden:
                return name, aliases
        raise RuntimeError("could not draw a name outside forbidden_names; the name pool is too small")

    def city_name(self) -> tuple[str, list[str]]:
        core = self.names.word()
        if self.rng.random() < self.cfg.city_alias_share:
            return f"{self.rng.choice(_CITY_PREFIXES)} {core}", [core]
        return core, []

    def build(self) -> None:
        cfg, rng = self.cfg, self.rng
        for _ in range(cfg.num_countries):
            self._add("country", *self.allowed(lambda: (self.names.word(), [])))
        for _ in range(cfg.num_cities):
            self._add("city", *self.allowed(self.city_name))
        for _ in range(cfg.num_orgs):

            def org() -> tuple[str, list[str]]:
                core = self.names.word()
                return f"{core} {rng.choice(_ORG_SUFFIXES)}", [core]

            self._add("org", *self.allowed(org))
        first_names = [self.names.word() for _ in range(cfg.first_name_pool)]
        for _ in range(cfg.num_people):
            self._add("person", *self.allowed(lambda: (f"{rng.choice(first_names)} {self.names.word()}", [])))
        for _ in range(cfg.num_works):
            self._add(
                "work", *self.allowed(lambda: (f"The {self.names.word()} {rng.choice(_WORK_NOUNS)}", []))
            )

        countries, cities = self.by_kind["country"], self.by_kind["city"]
        # The first cities go round-robin so every country has at least one city to be its capital.
        city_country = {
            c: countries[i] if i < len(countries) else rng.choice(countries) for i, c in enumerate(cities)
        }
        for city in cities:
            self._fact("located_in", city, city_country[city])
        for country in countries:
            self._fact("capital_of", country, rng.choice([c for c in cities if city_country[c] == country]))
        for org in self.by_kind["org"]:
            self._fact("founded_in", org, rng.choice(cities))
        for person in self.by_kind["person"]:
            self._fact("born_in", person, rng.choice(cities))
            self._fact("employee_of", person, rng.choice(self.by_kind["org"]))
        for work in self.by_kind["work"]:
            self._fact("directed_by", work, rng.choice(self.by_kind["person"]))

    def assign_splits(self) -> None:
        """Exact quotas per kind (not coin flips), so small worlds still have held-out entities of each kind."""
        for keys in self.by_kind.values():
            order = list(keys)
            self.rng.shuffle(order)
            n_test = round(len(order) * self.cfg.test_entity_share)
            n_dev = round(len(order) * self.cfg.dev_entity_share)
            for i, key in enumerate(order):
                self.entities[key].split = "test" if i < n_test else "dev" if i < n_test + n_dev else "train"


# -- documents ----------------------------------------------------------------------------------------


def _fact_sentence(rng: random.Random, relation: str, subject: Entity, obj: Entity) -> str:
    sentence = rng.choice(_FACT_TEMPLATES[relation]).format(s=subject.name, o=obj.name)
    if relation == "located_in" and subject.aliases:
        sentence += _ALIAS_SENTENCE.format(alias=subject.aliases[0])
    return sentence


def _lookalike_name(builder: _WorldBuilder, ent: Entity) -> str:
    """A new name that shares every word but the distinctive one (first name, 'Port', 'Guild' stay)."""
    new = builder.names.word()
    if ent.kind == "person":
        return f"{ent.name.split()[0]} {new}"
    if ent.kind == "city" and ent.aliases:
        return f"{ent.name.split()[0]} {new}"
    if ent.kind == "org":
        return f"{new} {ent.name.split()[-1]}"
    if ent.kind == "work":
        return f"The {new} {ent.name.split()[-1]}"
    return new


def _distractor(builder: _WorldBuilder, fact: Fact) -> dict[str, str]:
    rng = builder.rng
    subject = builder.entities[fact.subject]
    if rng.random() < 0.5:
        work = builder.entities[rng.choice(builder.by_kind["work"])]
        text = rng.choice(_MENTION_TEMPLATES).format(s=subject.name, work=work.name)
        return {"title": subject.name, "contents": text}
    # A look-alike entity with the same relation to a random object of the right kind.
    name, _ = builder.allowed(lambda: (_lookalike_name(builder, subject), []))
    lookalike = Entity(key="", kind=subject.kind, name=name)
    obj_kind = builder.entities[fact.obj].kind
    obj = builder.entities[rng.choice(builder.by_kind[obj_kind])]
    return {"title": lookalike.name, "contents": _fact_sentence(rng, fact.relation, lookalike, obj)}


def _build_corpus(builder: _WorldBuilder) -> list[dict[str, str]]:
    rng = builder.rng
    docs: list[dict[str, str]] = []
    for i, fact in enumerate(builder.facts):
        subject, obj = builder.entities[fact.subject], builder.entities[fact.obj]
        docs.append(
            {"title": subject.name, "contents": _fact_sentence(rng, fact.relation, subject, obj), "fact": i}
        )
        for _ in range(builder.cfg.distractors_per_fact):
            docs.append(_distractor(builder, fact))
    rng.shuffle(docs)
    corpus = []
    for n, doc in enumerate(docs):
        if "fact" in doc:
            builder.facts[doc["fact"]].doc_index = n
        corpus.append({"id": _doc_id(n), "title": doc["title"], "contents": doc["contents"]})
    return corpus


def _doc_id(n: int) -> str:
    return f"d{n:06d}"


# -- questions ----------------------------------------------------------------------------------------


def _candidates(builder: _WorldBuilder) -> list[dict[str, Any]]:
    """Every answerable question of the world, with its answer entity and the entity its text names."""
    rng = builder.rng
    doc_of = {(f.relation, f.subject): _doc_id(f.doc_index) for f in builder.facts}
    out: list[dict[str, Any]] = []
    for fact in builder.facts:
        out.append(
            {
                "relation": fact.relation,
                "hops": 1,
                "subject": fact.subject,
                "answer": fact.obj,
                "template": rng.choice(_SINGLE_HOP_QUESTIONS[fact.relation]),
                "supporting_doc_ids": [doc_of[(fact.relation, fact.subject)]],
                "bridge": None,
            }
        )
    for name, first, second, templates in _TWO_HOP_CHAINS:
        for (relation, subject), middle in builder.relation.items():
            if relation != first:
                continue
            answer = builder.relation[(second, middle)]
            out.append(
                {
                    "relation": name,
                    "hops": 2,
                    "subject": subject,
                    "answer": answer,
                    "template": rng.choice(templates),
                    "supporting_doc_ids": [doc_of[(first, subject)], doc_of[(second, middle)]],
                    "bridge": middle,
                }
            )
    return out


def _split_of(builder: _WorldBuilder, cand: dict[str, Any]) -> str | None:
    """The split a candidate question may go to, or None (a train-answer question naming a held-out entity)."""
    answer_split = builder.entities[cand["answer"]].split
    if answer_split == "train" and builder.entities[cand["subject"]].split != "train":
        return None
    return answer_split


def _take(pool: list[dict[str, Any]], others: list[dict[str, Any]], n: int) -> list[dict[str, Any]]:
    taken = pool[:n]
    if len(taken) < n:  # not enough of this kind: fill with the other kind rather than fail
        taken += others[: n - len(taken)]
    return taken


def _sample_split(
    builder: _WorldBuilder, split: str, cands: list[dict[str, Any]], n: int
) -> list[dict[str, Any]]:
    if len(cands) < n:
        raise ConfigError(
            f"asked for {n} {split} questions but this world supports only {len(cands)}; "
            f"lower {split}_questions or raise num_people / num_works / {split}_entity_share"
        )
    builder.rng.shuffle(cands)
    two = [c for c in cands if c["hops"] == 2]
    one = [c for c in cands if c["hops"] == 1]
    n_two = round(n * builder.cfg.two_hop_share)
    chosen_two = _take(two, [], n_two)
    chosen_one = _take(one, two[len(chosen_two) :], n - len(chosen_two))
    chosen = chosen_one + chosen_two
    builder.rng.shuffle(chosen)
    return chosen


def _row(builder: _WorldBuilder, split: str, index: int, cand: dict[str, Any]) -> dict[str, Any]:
    subject, answer = builder.entities[cand["subject"]], builder.entities[cand["answer"]]
    return {
        "id": f"{split}-{index:05d}",
        "question": cand["template"].format(s=subject.name),
        "golds": answer.golds,
        "hops": cand["hops"],
        "supporting_doc_ids": cand["supporting_doc_ids"],
        "answer_type": _ANSWER_TYPES[answer.kind],
        "relation": cand["relation"],
        "subject": subject.name,
        "bridge": builder.entities[cand["bridge"]].name if cand["bridge"] else None,
    }


def relation_chain(relation: str) -> tuple[str, ...]:
    """The fact relations a question's relation walks: ("born_in",) or ("directed_by", "born_in")."""
    if relation in _FACT_TEMPLATES:
        return (relation,)
    for name, first, second, _ in _TWO_HOP_CHAINS:
        if name == relation:
            return (first, second)
    raise KeyError(
        f"unknown relation {relation!r}; known: {sorted(_FACT_TEMPLATES) + [c[0] for c in _TWO_HOP_CHAINS]}"
    )


def expert_queries(row: dict[str, Any]) -> list[str]:
    """The search queries an expert would issue for a synthetic row, one per hop (for SFT demonstrations).

    Hop 1 searches the entity the question names with the first relation's word; hop 2 searches the
    bridge entity (which the hop-1 document names) with the second relation's word.
    """
    chain = relation_chain(row["relation"])
    entities = [row["subject"]] + ([row["bridge"]] if len(chain) == 2 else [])
    return [f"{entity} {RELATION_WORDS[rel]}" for entity, rel in zip(entities, chain, strict=True)]


def generate(
    config: SynthConfig | None = None, *, name_pool: Sequence[str] = (), forbidden_names: Iterable[str] = ()
) -> SynthTask:
    """Build the world, its corpus and the question splits, all from `config.seed`.

    `name_pool` (words names are drawn from first) and `forbidden_names` (names no entity may carry) are
    for `practice_world`; without them the world is exactly what the seed gives.
    """
    config = config or SynthConfig()
    builder = _WorldBuilder(config, name_pool, forbidden_names)
    builder.build()
    builder.assign_splits()
    corpus = _build_corpus(builder)
    by_split: dict[str, list[dict[str, Any]]] = {s: [] for s in SPLITS}
    for cand in _candidates(builder):
        split = _split_of(builder, cand)
        if split is not None:
            by_split[split].append(cand)
    wanted = {"train": config.train_questions, "dev": config.dev_questions, "test": config.test_questions}
    splits = {
        split: [
            _row(builder, split, i, c)
            for i, c in enumerate(_sample_split(builder, split, by_split[split], n))
        ]
        for split, n in wanted.items()
    }
    return SynthTask(config=config, corpus=corpus, splits=splits, entities=builder.entities)


# -- practice worlds ----------------------------------------------------------------------------------


def name_words(task: SynthTask) -> list[str]:
    """The invented words `task`'s entity names are made of (sorted; "Port", "Guild", "The" ... left out)."""
    fixed = _template_words()
    words = {w for ent in task.entities.values() for w in ent.name.split() if w.lower() not in fixed}
    return sorted(words)


def held_out_names(task: SynthTask, splits: Iterable[str] = ("dev", "test")) -> set[str]:
    """Lower-cased names and aliases of `task`'s entities assigned to `splits`."""
    wanted = set(splits)
    return {g.lower() for ent in task.entities.values() if ent.split in wanted for g in ent.golds}


def practice_world(task: SynthTask, seed: int, train_questions: int | None = None) -> SynthTask:
    """Another world built from `task`'s name words but with its own facts, for demonstrations only.

    Why: the tiny model is trained from scratch, so a token it has never had to write is a token it will
    never write (measured: a copy task on names whose tokens were never a training target scores 0 on
    them, however well it copies the others). A real pretrained model has written every name piece
    before. Practice worlds give the tiny one the same: the same words recombined into other entities
    with other, random facts, so each word of a held-out name is written somewhere in training while
    none of the held-out facts is stated anywhere but in `task`'s own corpus.

    Guarantees (tested): no practice entity is named, or aliased, like a dev or test entity of `task`;
    so no practice question's subject, bridge or gold is a held-out name. Every question goes to the
    practice world's train split (it has no dev or test split). Deterministic in (`task`, `seed`).
    """
    config = dataclasses.replace(
        task.config,
        seed=seed,
        dev_entity_share=0.0,
        test_entity_share=0.0,
        dev_questions=0,
        test_questions=0,
        train_questions=task.config.train_questions if train_questions is None else train_questions,
    )
    return generate(config, name_pool=name_words(task), forbidden_names=held_out_names(task))
