"""The offline, verifiable default task: a seeded world of invented entities, a corpus that states its facts,
and single-hop and two-hop questions that only that corpus can answer.

Why synthetic: a search agent must be trainable and testable offline, on two CPU cores, with answers that
are checkable and never in a model's pre-training data. The names are made of random syllables, so a fact
such as "Alda Korin was born in Port Velmora." exists nowhere but in this corpus; a policy can only get it
right by searching. Sentences are templated and the vocabulary is small, so a tiny transformer can learn
the task and BM25 on the question's words finds the supporting document.

Where each part lives: `synthetic_world` (the config, entities, facts and corpus), `synthetic_questions`
(which questions each split gets), `synthetic_text` (the sentences and templates both use); this module
puts them together (`generate`), names the size presets, writes a task to disk (`SynthTask.write`) and
builds practice worlds for demonstrations (`practice_world`).

Splits: every entity is assigned to train, dev or test; a question belongs to the split of its answer
entity, and a train question never names a dev or test entity. So the test split's answers never appear
in train questions or train answers. Everything is drawn from one `random.Random(seed)`: the same config
gives byte-identical files.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from searchrl.common.config import ConfigError
from searchrl.common.io import atomic_write_json, write_jsonl
from searchrl.data.synthetic_questions import question_splits
from searchrl.data.synthetic_text import template_words
from searchrl.data.synthetic_world import SPLITS, Entity, SynthConfig, WorldBuilder, build_corpus

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


def generate(
    config: SynthConfig | None = None, *, name_pool: Sequence[str] = (), forbidden_names: Iterable[str] = ()
) -> SynthTask:
    """Build the world, its corpus and the question splits, all from `config.seed`.

    `name_pool` (words names are drawn from first) and `forbidden_names` (names no entity may carry) are
    for `practice_world`; without them the world is exactly what the seed gives.
    """
    config = config or SynthConfig()
    builder = WorldBuilder(config, name_pool, forbidden_names)
    builder.build()
    builder.assign_splits()
    corpus = build_corpus(builder)
    splits = question_splits(builder, config)
    return SynthTask(config=config, corpus=corpus, splits=splits, entities=builder.entities)


# -- practice worlds ----------------------------------------------------------------------------------


def name_words(task: SynthTask) -> list[str]:
    """The invented words `task`'s entity names are made of (sorted; "Port", "Guild", "The" ... left out)."""
    fixed = template_words()
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
