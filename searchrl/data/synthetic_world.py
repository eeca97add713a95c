"""The synthetic world: invented entities, the facts between them, and the corpus that states those facts.

The world: countries, cities (located in a country; each country has a capital), organisations (founded
in a city), people (born in a city, employee of an organisation) and works (films directed by a person).
The names are made of random syllables (`NameMaker`), so a fact such as "Alda Korin was born in Port
Velmora." exists nowhere but in this corpus. Each fact is one short document whose title is its subject;
distractor documents mention the subject in passing or state a fact about a look-alike entity (same first
name, same "Port ..." prefix).

Every entity is assigned to train, dev or test (`WorldBuilder.assign_splits`, exact quotas per kind); the
questions (`searchrl.data.synthetic_questions`) follow their answer entity's split. Everything is drawn
from the builder's one `random.Random(config.seed)`, in a fixed order: the same config gives the same world.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from searchrl.common.config import ConfigError
from searchrl.data.synthetic_text import (
    ALIAS_SENTENCE,
    CITY_PREFIXES,
    CODAS,
    FACT_TEMPLATES,
    MENTION_TEMPLATES,
    ONSETS,
    ORG_SUFFIXES,
    VOWELS,
    WORK_NOUNS,
    template_words,
)

SPLITS = ("train", "dev", "test")


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
    """`subject` `relation` `obj` (entity keys), and the index of the corpus document stating it."""

    relation: str
    subject: str
    obj: str
    doc_index: int = -1


# -- names --------------------------------------------------------------------------------------------


class NameMaker:
    """Invented capitalised words, each used once in the whole world (so names never collide).

    With a `pool`, words are drawn from it first (in a seeded random order): a practice world re-uses
    another world's words, see `searchrl.data.synthetic.practice_world`.
    """

    def __init__(self, rng: random.Random, pool: Sequence[str] = ()):
        self.rng = rng
        self.used: set[str] = template_words()
        self.pool = list(pool)
        if self.pool:
            rng.shuffle(self.pool)

    def _syllable(self) -> str:
        return self.rng.choice(ONSETS) + self.rng.choice(VOWELS) + self.rng.choice(CODAS)

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


class WorldBuilder:
    """Builds one world from `config`: entities (`build`), their splits (`assign_splits`), then the corpus
    (`build_corpus`) and the questions draw from the same `rng`."""

    def __init__(
        self, config: SynthConfig, name_pool: Sequence[str] = (), forbidden_names: Iterable[str] = ()
    ):
        self.cfg = config
        self.rng = random.Random(config.seed)
        self.names = NameMaker(self.rng, name_pool)
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
            return f"{self.rng.choice(CITY_PREFIXES)} {core}", [core]
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
                return f"{core} {rng.choice(ORG_SUFFIXES)}", [core]

            self._add("org", *self.allowed(org))
        first_names = [self.names.word() for _ in range(cfg.first_name_pool)]
        for _ in range(cfg.num_people):
            self._add("person", *self.allowed(lambda: (f"{rng.choice(first_names)} {self.names.word()}", [])))
        for _ in range(cfg.num_works):
            self._add(
                "work", *self.allowed(lambda: (f"The {self.names.word()} {rng.choice(WORK_NOUNS)}", []))
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
    sentence = rng.choice(FACT_TEMPLATES[relation]).format(s=subject.name, o=obj.name)
    if relation == "located_in" and subject.aliases:
        sentence += ALIAS_SENTENCE.format(alias=subject.aliases[0])
    return sentence


def _lookalike_name(builder: WorldBuilder, ent: Entity) -> str:
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


def _distractor(builder: WorldBuilder, fact: Fact) -> dict[str, str]:
    rng = builder.rng
    subject = builder.entities[fact.subject]
    if rng.random() < 0.5:
        work = builder.entities[rng.choice(builder.by_kind["work"])]
        text = rng.choice(MENTION_TEMPLATES).format(s=subject.name, work=work.name)
        return {"title": subject.name, "contents": text}
    # A look-alike entity with the same relation to a random object of the right kind.
    name, _ = builder.allowed(lambda: (_lookalike_name(builder, subject), []))
    lookalike = Entity(key="", kind=subject.kind, name=name)
    obj_kind = builder.entities[fact.obj].kind
    obj = builder.entities[rng.choice(builder.by_kind[obj_kind])]
    return {"title": lookalike.name, "contents": _fact_sentence(rng, fact.relation, lookalike, obj)}


def build_corpus(builder: WorldBuilder) -> list[dict[str, str]]:
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
        corpus.append({"id": doc_id(n), "title": doc["title"], "contents": doc["contents"]})
    return corpus


def doc_id(n: int) -> str:
    """The id of the corpus's n-th document."""
    return f"d{n:06d}"
