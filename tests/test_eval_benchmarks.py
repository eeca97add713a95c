"""`searchrl eval --benchmarks DIR`: Search-R1's seven QA sets by name, per-set EM/F1/searches, the unweighted
average with a stratified bootstrap CI, the split rule, and the report's Table-3 section.

The world is made here: a small corpus and its BM25 index, a run directory (config.yaml with the
search_r1 protocol, checkpoints/step-1/policy holding a tiny model and its tokenizer) and FlashRAG-style
set folders of different sizes (`<set>/test.jsonl` or `<set>/dev.jsonl`). Known answers come from scripted
turns forced through the real engine; the CLI test decodes the tiny model freely.
"""

from __future__ import annotations

import json
import re

import pytest
import torch
from typer.testing import CliRunner
from worlds import TINY_ONE_LAYER

from searchrl.cli import app
from searchrl.common.config import save_config
from searchrl.common.io import atomic_write_json, write_jsonl
from searchrl.common.trajectory import read_trajectories
from searchrl.env.protocol import format_answer, format_search_r1_call
from searchrl.evaluation.benchmarks import (
    BENCHMARKS,
    bootstrap_mean_of_means_ci,
    evaluate_benchmarks,
    find_benchmark_files,
)
from searchrl.evaluation.report import write_report
from searchrl.models.tiny import build_policy, tokenizer_training_texts, train_tokenizer
from searchrl.ppo.config import PPOConfig
from searchrl.rollout.generator import HFGenerator, ScriptedPolicy
from searchrl.search.index import build_index

runner = CliRunner()
PLACES = ["Orvel", "Tamsin", "Kesh", "Brindle", "Varro", "Quill", "Mossa", "Lune", "Pell", "Drest", "Harn"]
# Per set: (file split, [(entity index, answer the script gives, searches)]). Sizes differ on purpose, so
# the unweighted mean over sets differs from the mean over all questions.
PLAN: dict[str, tuple[str, list[tuple[int, str, int]]]] = {
    "nq": ("test", [(0, "Orvel", 1), (1, "tamsin.", 1), (2, "Wrong", 1)]),  # "tamsin." normalises to the gold
    "triviaqa": ("test", [(3, "Wrong", 1), (4, "Nope", 1)]),
    "popqa": ("dev", [(5, "Quill", 1), (6, "Mossa", 1)]),  # only dev here: not the split Search-R1 used
    "hotpotqa": ("dev", [(7, "Lune", 2), (8, "x", 2), (9, "y", 2), (10, "z", 2)]),
    "2wikimultihopqa": ("dev", [(0, "Orvel", 1), (1, "no", 1)]),
    "musique": ("dev", [(2, "Kesh", 1)]),
    "bamboogle": ("test", [(3, "no", 1), (4, "no", 1)]),
}
EXPECTED_EM = {"nq": 2 / 3, "triviaqa": 0.0, "popqa": 1.0, "hotpotqa": 0.25, "2wikimultihopqa": 0.5}
EXPECTED_EM |= {"musique": 1.0, "bamboogle": 0.0}


def _question(i: int) -> str:
    return f"Where does Entity{i} live"  # no '?': Search-R1's rule adds it


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    torch.manual_seed(0)
    root = tmp_path_factory.mktemp("bench")
    corpus = [
        {"id": f"e{i}", "title": f"Entity{i}", "contents": f"Entity{i} lives in {p}."}
        for i, p in enumerate(PLACES)
    ]
    write_jsonl(root / "corpus.jsonl", corpus)
    build_index(root / "corpus.jsonl", root / "index").search(["warm up"], 1)
    bench = root / "flashrag"
    for name, (split, items) in PLAN.items():
        rows = [
            {
                "id": f"{split}_{k}",
                "question": _question(i),
                "golden_answers": [PLACES[i], f"The {PLACES[i]}"],
            }
            for k, (i, _, _) in enumerate(items)
        ]
        write_jsonl(bench / name / f"{split}.jsonl", rows)
    # Distractors the split rule must not pick: NQ's dev (test exists) and HotpotQA's train.
    write_jsonl(bench / "nq" / "dev.jsonl", [{"id": "d", "question": "unused", "golden_answers": ["x"]}])
    write_jsonl(
        bench / "hotpotqa" / "train.jsonl", [{"id": "t", "question": "unused", "golden_answers": ["x"]}]
    )
    texts = [{"question": _question(i) + "?", "golds": [p]} for i, p in enumerate(PLACES)]
    tok = train_tokenizer(tokenizer_training_texts(corpus * 3, texts * 3), vocab_size=500)
    run = root / "run"
    config = PPOConfig(
        output_dir=str(run),
        index_dir=str(root / "index"),
        protocol="search_r1",
        topk=3,
        max_turns=4,
        max_tool_calls=3,
        max_new_tokens_per_turn=24,
        max_episode_tokens=500,
        progress_bar=False,
    )
    save_config(config, run / "config.yaml")
    policy = build_policy(tok, TINY_ONE_LAYER)
    folder = run / "checkpoints" / "step-1"
    policy.save_pretrained(folder / "policy")
    tok.save_pretrained(folder / "policy")
    atomic_write_json(folder / "trainer_state.json", {"global_step": 1})
    return {"root": root, "bench": bench, "run": run, "tok": tok}


def scripted_factory():
    """One generator per set (batch size >= every set's size), in Search-R1's column order."""
    scripts = [
        [
            [format_search_r1_call(f"Entity{i}")] * searches + [format_answer(answer)]
            for i, answer, searches in PLAN[b.name][1]
        ]
        for b in BENCHMARKS
    ]
    calls = iter(scripts)

    def factory(model, tokenizer, config):
        return HFGenerator(
            model, tokenizer, config, forcing=ScriptedPolicy(tokenizer, next(calls), append_eos=False)
        )

    return factory


@pytest.fixture(scope="module")
def suite(world):
    """The seven sets evaluated with scripted turns: (payload, JSON path)."""
    return evaluate_benchmarks(
        world["run"], world["bench"], batch_size=8, n_resamples=300, generator_factory=scripted_factory()
    )


def test_suite_scores_every_set_and_averages_them_unweighted(world, suite):
    payload, path = suite
    assert path == world["run"] / "eval" / "benchmarks-step-1.json"
    assert json.loads(path.read_text()) == json.loads(json.dumps(payload))
    sets = payload["benchmarks"]
    assert list(sets) == [b.name for b in BENCHMARKS]
    for name, em in EXPECTED_EM.items():
        assert sets[name]["exact_match"] == pytest.approx(em), name
        assert sets[name]["n"] == len(PLAN[name][1])
    assert sets["hotpotqa"]["searches_per_question"] == 2.0 and sets["nq"]["searches_per_question"] == 1.0
    assert sets["nq"]["f1"] == pytest.approx(2 / 3)
    # The split rule: test where there is one (NQ's dev is ignored), else dev; recorded against the paper's.
    assert [sets[n]["split"] for n in sets] == ["test", "test", "dev", "dev", "dev", "dev", "test"]
    assert sets["nq"]["file"].endswith("nq/test.jsonl")
    assert sets["hotpotqa"]["file"].endswith("hotpotqa/dev.jsonl")
    assert sets["popqa"]["matches_search_r1_split"] is False
    assert all(sets[n]["matches_search_r1_split"] for n in sets if n != "popqa")
    unweighted = sum(EXPECTED_EM.values()) / 7
    pooled = sum(em * len(PLAN[n][1]) for n, em in EXPECTED_EM.items()) / 16
    assert payload["average"]["exact_match"] == pytest.approx(unweighted)
    assert payload["exact_match"] == pytest.approx(unweighted) and abs(unweighted - pooled) > 0.04
    assert payload["average"]["searches_per_question"] == pytest.approx((6 + 2) / 7)
    lo, hi = payload["average"]["ci95"]["exact_match"]
    assert lo < unweighted < hi and lo >= 0.0 and hi <= 1.0
    assert payload["n"] == 16 and payload["split"] == "benchmarks" and payload["step"] == 1
    trajs = read_trajectories(path.with_name("benchmarks-step-1.trajectories.jsonl.gz"))
    assert [t.metadata["benchmark"] for t in trajs] == [b.name for b in BENCHMARKS for _ in PLAN[b.name][1]]
    assert trajs[0].question_id == "nq-test_0"  # unique across sets in one file
    user = next(m for m in trajs[0].messages if m["role"] == "user")["content"]
    assert user == _question(0) + "?"  # Search-R1's question rule


def test_report_renders_the_table_3_section_from_the_suite(world, suite):
    payload, _ = suite
    page = write_report(world["run"]).read_text()
    assert "<h2>Benchmarks (Search-R1's Table 3 layout)</h2>" in page
    table = re.search(r"<table class='benchmarks-em'>(.*?)</table>", page, re.S).group(1)
    header = re.findall(r"<th>(.*?)</th>", table)
    assert header == [
        "model · checkpoint",
        *[b.label + ("†" if b.in_domain else "") for b in BENCHMARKS],
        "Avg",
    ]
    assert header[1:5] == ["NQ†", "TriviaQA", "PopQA", "HotpotQA†"]
    first = re.findall(r"<td>(.*?)</td>", table.split("</tr>")[1])
    values = [float(c.split(" ")[0]) for c in first[1:]]
    expected = [payload["benchmarks"][b.name]["exact_match"] for b in BENCHMARKS]
    assert values == pytest.approx([*expected, payload["average"]["exact_match"]], abs=5e-4)
    # All seven sets evaluated, so the paper's average is shown beside ours.
    assert "Qwen2.5-7B-Base PPO (paper)" in table and "0.431" in table
    assert "PopQA dev n=2 (not the paper&#x27;s split)" in page  # html-escaped


def test_cli_eval_benchmarks_on_the_tiny_model(world):
    out = world["root"] / "two-sets.json"
    result = runner.invoke(
        app,
        ["eval", "--run", str(world["run"]), "--benchmarks", str(world["bench"]), "--sets", "nq,HotpotQA"]
        + ["--limit", "2", "--bootstrap", "50", "--out", str(out)],
    )
    assert result.exit_code == 0, result.output
    payload = json.loads(out.read_text())
    assert list(payload["benchmarks"]) == ["nq", "hotpotqa"] and payload["n"] == 4
    assert payload["limit_per_set"] == 2 and payload["average"]["sets"] == ["nq", "hotpotqa"]
    assert "NQ†" in result.output and "Avg" in result.output and "wrote" in result.output
    for name in ("nq", "hotpotqa"):
        assert 0.0 <= payload["benchmarks"][name]["exact_match"] <= 1.0
        assert payload["benchmarks"][name]["termination"]  # the tiny model really ran


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--sets", "nq"], "--sets picks sets of --benchmarks DIR"),
        (["--benchmarks", "{bench}", "--sets", "squad"], "unknown benchmark 'squad'"),
        (["--benchmarks", "{bench}", "--data", "{bench}"], "--benchmarks and --data both name the questions"),
        (["--benchmarks", "{root}/nowhere"], "no such folder"),
    ],
)
def test_cli_refuses_bad_benchmark_requests(world, args, message):
    args = [a.format(bench=world["bench"], root=world["root"]) for a in args]
    result = runner.invoke(app, ["eval", "--run", str(world["run"]), *args])
    assert result.exit_code != 0
    assert message in " ".join(re.sub("[│╭╮╰╯─]", " ", result.output).split()), result.output


def test_a_missing_set_is_named_with_what_is_there(tmp_path, world):
    partial = tmp_path / "partial"
    for name in ("nq", "hotpotqa"):
        write_jsonl(partial / name / "test.jsonl", [{"id": "a", "question": "q", "golden_answers": ["g"]}])
    with pytest.raises(FileNotFoundError) as err:
        find_benchmark_files(partial)
    text = str(err.value)
    assert "no test.jsonl or dev.jsonl for triviaqa, popqa, 2wikimultihopqa, musique, bamboogle" in text
    assert "['hotpotqa', 'nq']" in text and "--sets nq,hotpotqa" in text
    assert [f.benchmark.name for f in find_benchmark_files(partial, ["hotpotqa", "nq"])] == ["hotpotqa", "nq"]


def test_stratified_bootstrap_weights_sets_equally():
    # A big set of ones and a small set of zeros: the mean over sets is always 0.5 (a pooled mean, 0.98).
    assert bootstrap_mean_of_means_ci([[1.0] * 100, [0.0] * 2], 200, seed=1) == (0.5, 0.5)
    groups = [[1.0, 0.0, 1.0, 1.0], [0.0, 0.0, 1.0]]
    lo, hi = bootstrap_mean_of_means_ci(groups, 500, seed=3)
    assert lo < (0.75 + 1 / 3) / 2 < hi
    assert bootstrap_mean_of_means_ci(groups, 500, seed=3) == (lo, hi)  # seeded
    with pytest.raises(ValueError, match="every group needs at least one value"):
        bootstrap_mean_of_means_ci([[1.0], []])
