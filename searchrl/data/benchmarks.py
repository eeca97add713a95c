"""Search-R1's seven evaluation sets: their names, the split the paper took each from, its published scores,
and where a set's questions sit in a FlashRAG-style folder.

What: `BENCHMARKS` (the sets in the column order of Search-R1's Tables 2 and 3), `benchmark_by_name`,
`find_benchmark_files` (each set's `<dir>/<name>/test.jsonl`, else `dev.jsonl`) and `SEARCH_R1_PAPER_EM`.

Why here, in `data/`: these are facts about the data, read by `searchrl data convert --by-source` (which
names each set's file by the split Search-R1 used), by the suite evaluation
(`searchrl.evaluation.benchmarks`) and by the report's Table-3 section; none of them needs a model.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Benchmark:
    """One of Search-R1's evaluation sets: its folder name, its column label and the split the paper used."""

    name: str
    label: str
    search_r1_split: str
    in_domain: bool = False  # trained on (NQ, HotpotQA train), marked with a dagger in the paper
    aliases: tuple[str, ...] = ()


# Search-R1's column order (Tables 2 and 3).
BENCHMARKS: tuple[Benchmark, ...] = (
    Benchmark("nq", "NQ", "test", in_domain=True, aliases=("natural_questions",)),
    Benchmark("triviaqa", "TriviaQA", "test", aliases=("tqa", "trivia_qa")),
    Benchmark("popqa", "PopQA", "test"),
    Benchmark("hotpotqa", "HotpotQA", "dev", in_domain=True, aliases=("hotpot_qa",)),
    Benchmark("2wikimultihopqa", "2WikiMultiHopQA", "dev", aliases=("2wiki", "2wikimqa")),
    Benchmark("musique", "Musique", "dev"),
    Benchmark("bamboogle", "Bamboogle", "test"),
)
SPLIT_ORDER = ("test", "dev")

# Search-R1's published exact match (arXiv 2503.09516 v5, Tables 2-3, as reprinted in LLDS arXiv 2512.04220 and
# corroborated by several reproductions; see docs/search_r1.md): per set in BENCHMARKS order, then the average.
# Comparable only within one setup: wiki-18, e5 top-3, trained on NQ + HotpotQA, the paper's prompt.
SEARCH_R1_PAPER_EM: tuple[tuple[str, tuple[float, ...], float], ...] = (
    ("Qwen2.5-7B-Base PPO", (0.480, 0.638, 0.457, 0.433, 0.382, 0.196, 0.432), 0.431),
    ("Qwen2.5-7B-Base GRPO", (0.395, 0.560, 0.388, 0.326, 0.297, 0.125, 0.360), 0.350),
    ("Qwen2.5-3B-Base PPO", (0.406, 0.587, 0.435, 0.284, 0.273, 0.049, 0.088), 0.303),
    ("Qwen2.5-3B-Base GRPO", (0.421, 0.583, 0.413, 0.297, 0.274, 0.066, 0.128), 0.312),
    ("Qwen2.5-7B RAG (no RL)", (0.349, 0.585, 0.392, 0.299, 0.235, 0.058, 0.208), 0.304),
)


def benchmark_by_name(name: str) -> Benchmark:
    """A set by its name or an alias (case-insensitive); a ValueError lists the names."""
    key = name.strip().lower()
    for b in BENCHMARKS:
        if key == b.name or key in b.aliases or key == b.label.lower():
            return b
    raise ValueError(f"unknown benchmark {name!r}; the sets are {', '.join(b.name for b in BENCHMARKS)}")


@dataclass
class BenchmarkFile:
    """Where one set's questions were found and whether that is the split Search-R1 evaluated."""

    benchmark: Benchmark
    path: Path
    split: str

    @property
    def matches_search_r1(self) -> bool:
        return self.split == self.benchmark.search_r1_split


def find_benchmark_files(
    benchmarks_dir: str | Path, sets: Sequence[str] | None = None
) -> list[BenchmarkFile]:
    """Each asked set's file in `benchmarks_dir` (`<name>/test.jsonl`, else `<name>/dev.jsonl`).

    `sets=None` asks for all seven: a missing one is an error naming what is there, so an "average over
    seven sets" is never silently an average over fewer; pass the names you have instead.
    """
    root = Path(benchmarks_dir)
    if not root.is_dir():
        raise FileNotFoundError(
            f"--benchmarks {root}: no such folder; pass a folder with one sub-folder per set, e.g. nq/test.jsonl, "
            "hotpotqa/dev.jsonl (FlashRAG's layout)"
        )
    wanted = [benchmark_by_name(s) for s in sets] if sets else list(BENCHMARKS)
    if len({b.name for b in wanted}) != len(wanted):
        raise ValueError(f"--sets {list(sets or [])}: a set is named twice")
    found: list[BenchmarkFile] = []
    missing: list[str] = []
    for b in wanted:
        folders = [root / n for n in (b.name, *b.aliases, b.label) if (root / n).is_dir()]
        hit = next(
            (
                (folder / f"{split}.jsonl", split)
                for folder in folders
                for split in SPLIT_ORDER
                if (folder / f"{split}.jsonl").is_file()
            ),
            None,
        )
        if hit is None:
            missing.append(b.name)
        else:
            found.append(BenchmarkFile(b, hit[0], hit[1]))
    if missing:
        present = sorted(p.name for p in root.iterdir() if p.is_dir())
        raise FileNotFoundError(
            f"--benchmarks {root}: no test.jsonl or dev.jsonl for {', '.join(missing)} (sub-folders here: "
            f"{present or 'none'}); add them, or pass --sets with the sets you have "
            f"(e.g. --sets {','.join(f.benchmark.name for f in found) or 'nq'})"
        )
    return found


__all__ = [
    "BENCHMARKS",
    "SEARCH_R1_PAPER_EM",
    "SPLIT_ORDER",
    "Benchmark",
    "BenchmarkFile",
    "benchmark_by_name",
    "find_benchmark_files",
]
