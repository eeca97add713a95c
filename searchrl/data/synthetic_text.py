"""The words and sentences of the synthetic world: name parts, fact sentences and question templates.

Why apart: the world generator writes its corpus with these sentences, the question sampler asks with these
templates, and the synthetic expert (`searchrl.sft.expert`) reads a bridge entity out of a retrieved fact
sentence and searches with a relation's word; all of them must agree on the same wording.

Fact documents share their relation word with their questions ("born", "employee", "founded", "directed",
"country", "capital"), so BM25 without stemming ranks the supporting document first. `relation_chain` says
which fact relations a question's relation walks and `expert_queries` the searches an expert would issue.
"""

from __future__ import annotations

from typing import Any

ONSETS = (
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
VOWELS = ("a", "e", "i", "o", "u")
CODAS = ("", "", "", "n", "r", "l", "s")
CITY_PREFIXES = ("Port", "Lake", "Mount", "Fort", "New")
ORG_SUFFIXES = ("Institute", "Company", "Guild", "Society", "Foundry", "Press", "Bank", "Works")
WORK_NOUNS = ("Chronicle", "Garden", "Voyage", "Song", "Mirror", "Harvest", "Lantern", "Tide")

# Fact documents: the sentence shares its relation word with the question ("born", "employee",
# "founded", "directed", "country", "capital") so BM25 without stemming still ranks it first.
FACT_TEMPLATES: dict[str, tuple[str, ...]] = {
    "born_in": ("{s} was born in {o}.", "{s} was born in the city of {o}."),
    "employee_of": ("{s} is an employee of {o}.", "{s} works as an employee of {o}."),
    "founded_in": ("{s} was founded in {o}.", "{s} was founded in the city of {o}."),
    "directed_by": ("{s} is a film directed by {o}.", "{s} was directed by {o}."),
    "located_in": ("{s} is a city in the country of {o}.", "{s} lies in the country of {o}."),
    "capital_of": ("The capital of {s} is {o}.", "{o} is the capital of {s}."),
}
ALIAS_SENTENCE = " It is also called {alias}."

SINGLE_HOP_QUESTIONS: dict[str, tuple[str, ...]] = {
    "born_in": ("Where was {s} born?", "In which city was {s} born?"),
    "employee_of": ("Which organisation is {s} an employee of?", "Who is {s} an employee of?"),
    "founded_in": ("Where was {s} founded?", "In which city was {s} founded?"),
    "directed_by": ("Who directed {s}?", "Which person directed {s}?"),
    "located_in": ("In which country is {s}?", "Which country is {s} in?"),
    "capital_of": ("What is the capital of {s}?", "Which city is the capital of {s}?"),
}

# Two-hop: (name, first relation, second relation, question templates).
TWO_HOP_CHAINS: tuple[tuple[str, str, str, tuple[str, ...]], ...] = (
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

MENTION_TEMPLATES = (
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


def template_words() -> set[str]:
    """Every lower-cased word of the templates and name parts: never an invented name (they would collide)."""
    texts = [t for ts in FACT_TEMPLATES.values() for t in ts]
    texts += [t for ts in SINGLE_HOP_QUESTIONS.values() for t in ts]
    texts += [t for chain in TWO_HOP_CHAINS for t in chain[3]] + list(MENTION_TEMPLATES) + [ALIAS_SENTENCE]
    words = {w.strip(".,?{}").lower() for t in texts for w in t.split()}
    words |= {w.lower() for w in (*CITY_PREFIXES, *ORG_SUFFIXES, *WORK_NOUNS)}
    return words


def relation_chain(relation: str) -> tuple[str, ...]:
    """The fact relations a question's relation walks: ("born_in",) or ("directed_by", "born_in")."""
    if relation in FACT_TEMPLATES:
        return (relation,)
    for name, first, second, _ in TWO_HOP_CHAINS:
        if name == relation:
            return (first, second)
    raise KeyError(
        f"unknown relation {relation!r}; known: {sorted(FACT_TEMPLATES) + [c[0] for c in TWO_HOP_CHAINS]}"
    )


def expert_queries(row: dict[str, Any]) -> list[str]:
    """The search queries an expert would issue for a synthetic row, one per hop (for SFT demonstrations).

    Hop 1 searches the entity the question names with the first relation's word; hop 2 searches the
    bridge entity (which the hop-1 document names) with the second relation's word.
    """
    chain = relation_chain(row["relation"])
    entities = [row["subject"]] + ([row["bridge"]] if len(chain) == 2 else [])
    return [f"{entity} {RELATION_WORDS[rel]}" for entity, rel in zip(entities, chain, strict=True)]
