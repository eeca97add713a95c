"""`report.html`: one self-contained file with the plots, the tables and trajectories split into spans.

The trajectories come from the real rollout engine (tiny model, real BM25, scripted turns forced through
it) so they carry real prompt, action and observation spans; the metrics log uses the PPO trainer's
metric names. One test drives the real `PPOTrainer` for two steps and reports on that run.
"""

from __future__ import annotations

import base64
import html
import json
import re
from html.parser import HTMLParser

import pytest
import torch
from typer.testing import CliRunner
from worlds import TINY_ONE_LAYER, VARNHOLT_CORPUS, write_corpus_jsonl

from searchrl.cli import app
from searchrl.common.io import append_jsonl, atomic_write_json
from searchrl.common.trajectory import write_trajectories
from searchrl.env.config import EnvConfig
from searchrl.env.environment import SearchEnvironment
from searchrl.env.protocol import format_answer, format_tool_call
from searchrl.evaluation.loop import evaluate_policy
from searchrl.evaluation.report import render_trajectory, write_report
from searchrl.evaluation.targets import evaluate_run
from searchrl.models.tiny import build_policy, tokenizer_training_texts, train_tokenizer
from searchrl.rewards.combine import default_rubric
from searchrl.rollout.generator import GenerationConfig, HFGenerator, ScriptedPolicy
from searchrl.search.index import build_index

CORPUS = VARNHOLT_CORPUS[:4]
# Its own questions: the report breaks results down by hop count, so each carries `hops`.
QA = [
    {"id": "q1", "question": "In which province is Varnholt?", "golds": ["Quessa"], "hops": 1},
    {"id": "q2", "question": "Who founded Orlenn?", "golds": ["Amsel Drov"], "hops": 1},
    {"id": "q3", "question": "Where was the founder of Orlenn born?", "golds": ["Tiberk"], "hops": 2},
]
TINY = TINY_ONE_LAYER
SCRIPTS = [
    [format_tool_call("search", {"query": "Varnholt province"}), format_answer("Quessa", ["d1"])],
    [format_tool_call("search", {"query": "Orlenn founded"}), format_answer("Nobody", ["d9"])],
    [
        format_tool_call("search", {"query": "Orlenn founded"}),
        format_tool_call("search", {"query": "Amsel Drov born"}),
        format_answer("Tiberk", ["d4"]),
    ],
]


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    torch.manual_seed(0)
    root = tmp_path_factory.mktemp("reportworld")
    corpus = root / "corpus.jsonl"
    write_corpus_jsonl(corpus, CORPUS)
    backend = build_index(corpus, root / "index", backend="bm25")
    tok = train_tokenizer(tokenizer_training_texts(CORPUS * 4, QA * 4), vocab_size=400)
    policy = build_policy(tok, TINY)
    result = evaluate_policy(
        policy,
        tok,
        QA,
        lambda: SearchEnvironment(backend, EnvConfig(max_turns=4), tokenizer=tok),
        GenerationConfig(max_new_tokens_per_turn=80, max_episode_tokens=900),
        rubric=default_rubric(),
        n_resamples=100,
        generator_factory=lambda m, t, c: HFGenerator(m, t, c, forcing=ScriptedPolicy(t, SCRIPTS)),
    )
    return {"root": root, "tok": tok, "result": result, "policy": policy}


def fake_training_log(run, steps: int = 6) -> None:
    for step in range(1, steps + 1):
        row = {
            "step": step,
            "objective/scores": 0.1 * step,
            "objective/kl": 0.02 * step,
            "kl_coef": 0.05,
            "objective/entropy_per_token": 2.0 - 0.1 * step,
            "tools/calls_per_episode": 1.0 + 0.1 * step,
            "answer/length_words": 2.0,
            "reward/f1": 0.08 * step,
            "reward/format": 0.1,
            "reward/metric/exact_match": 0.5,
            "val/explained_variance": float("nan"),
            "rollout/logprob_max_abs_diff": 1e-6 * (step % 4),  # 1, 2, 3, 0, 1, 2 (e-6)
        }
        if step % 2 == 0:
            row |= {"eval/exact_match": 0.1 * step, "eval/f1": 0.12 * step}
        append_jsonl(run / "metrics.jsonl", row)


def test_report_is_one_self_contained_file_with_plots_tables_and_spans(world, tmp_path):
    run = tmp_path / "run"
    fake_training_log(run)
    write_trajectories(run / "trajectories" / "step-000006.jsonl.gz", world["result"].trajectories)
    atomic_write_json(
        run / "eval" / "test-step-6.json",
        {"split": "test", "checkpoint": "step-6", "step": 6, **world["result"].summary},
    )
    summary = {
        "sft": {"test": {"exact_match": 0.4, "citation_support": 0.1}},
        "ppo": {"test": {"exact_match": 0.85, "citation_support": 0.3}},
        "wall_seconds": 12.5,
    }
    path = write_report(run, summary=summary, tokenizer=world["tok"])
    assert path == run / "report.html"
    text = path.read_text()
    # At a glance: next to exact match, the citation figures and the training diagnostics.
    glance = text[text.index("<h2>At a glance</h2>") : text.index("<h2>Summary</h2>")]
    cells = [re.sub(r"<[^>]+>", "", c).strip() for c in re.findall(r"<td>(.*?)</td>", glance)]
    assert cells[:4] == ["SFT policy (sft.test)", "0.400", "0.100", "n/a (no trajectories audited)"]
    assert cells[5:9] == ["PPO policy (ppo.test)", "0.850", "0.300", "n/a (no trajectories audited)"]
    i = cells.index("rollout/logprob_max_abs_diff")
    assert cells[i + 1 : i + 3] == ["max 3e-06 (step 3)", "last 2e-06 (step 6)"]
    i = cells.index("objective/kl")
    assert cells[i + 1 : i + 3] == ["mean 0.07 over 6 steps", "last 0.12 (step 6)"]
    assert cells[cells.index("dev exact match (eval/exact_match)") + 1] == "0.600 at step 6"
    assert sorted(p.name for p in run.iterdir() if p.suffix == ".html") == ["report.html"]
    # Self-contained: no external scripts, styles, images or fonts.
    assert 'src="http' not in text and "src='http" not in text and "<link" not in text
    assert "<script" not in text and "url(" not in text
    images = re.findall(r"src='data:image/png;base64,([A-Za-z0-9+/=]+)'", text)
    assert len(images) == 8  # reward, components, held-out EM, reward vs EM, KL, entropy, searches, length
    assert all(base64.b64decode(img)[:8] == b"\x89PNG\r\n\x1a\n" for img in images)
    for title in ("Training reward", "Reward components", "Held-out exact match", "KL and KL coefficient", "Training reward vs held-out EM",
                  "Entropy per action token", "Searches per episode", "Answer length"):  # fmt: skip
        assert f"alt='{title}'" in text
    # Tables: the summary, the eval JSON with CIs by hops, the audit verdicts.
    assert "ppo.test.exact_match" in text and "0.850" in text
    assert "ppo − sft" in text and "+0.450" in text  # the side-by-side held-out comparison
    assert "test-step-6.json" in text and "1-hop (n=2)" in text and "2-hop (n=1)" in text
    assert "Reward-hacking audit" in text and "fabricated_citations" in text
    # Trajectories: action and observation spans, decoded per span, told apart by class.
    assert text.count('class="span action"') >= 3 and text.count('class="span observation"') >= 2
    assert "Amsel Drov born" in text and "weaver born in Tiberk" in text


def test_each_span_is_decoded_from_its_own_tokens(world):
    tok = world["tok"]
    traj = world["result"].trajectories[2]
    page = render_trajectory(traj, tok)
    kinds = re.findall(r'class="span (\w+)"', page)
    assert kinds[0] == "prompt" and kinds.count("action") == 3 and kinds.count("observation") == 2
    for span in traj.spans:
        if span.kind == "action":
            decoded = tok.decode(traj.input_ids[span.start : span.end], skip_special_tokens=False)
            assert html.escape(decoded) in page
    # Without a tokenizer the stored span text is shown instead.
    assert "Amsel Drov born" in render_trajectory(traj, None).replace("&quot;", '"')


def test_the_report_and_the_viewer_give_every_token_the_same_kind(world):
    """One rule (`searchrl.common.trajectory.token_kinds`) for both: the same trajectory rendered by the report
    and served by the viewer has the same kind on every token, the chat template's glue inside an observation
    span included (the span says observation; the tokens around the document text are glue)."""
    from searchrl.viewer.server import token_rows

    tok = world["tok"]
    inner_glue = 0
    for traj in world["result"].trajectories:
        page = render_trajectory(traj, tok)
        from_report: list[str | None] = [None] * len(traj.input_ids)
        for kind, start, end in re.findall(r'class="span (\w+)" title="\w+: tokens (\d+)-(\d+)', page):
            for i in range(int(start), int(end)):
                assert from_report[i] is None, f"token {i} rendered twice"
                from_report[i] = kind
        from_viewer = [row["kind"] for row in token_rows(traj, tok)]
        assert from_report == from_viewer, traj.id
        observed = [i for s in traj.spans if s.kind == "observation" for i in range(s.start, s.end)]
        inner_glue += sum(from_viewer[i] == "glue" for i in observed)
    assert inner_glue > 0  # the case where the two rules used to disagree is exercised


def test_report_cli_on_a_run_that_has_just_started_and_on_folders_that_are_not_runs(tmp_path):
    started = tmp_path / "started"
    started.mkdir()
    (started / "config.yaml").write_text("seed: 3\n")  # what a run holds before its first step
    result = CliRunner().invoke(app, ["report", "--run", str(started)])
    assert result.exit_code == 0, result.output
    assert "No metrics logged yet" in (started / "report.html").read_text()
    wide = {"COLUMNS": "1000"}  # rich would otherwise wrap the long message
    missing = CliRunner().invoke(app, ["report", "--run", str(tmp_path / "nope")], env=wide)
    assert missing.exit_code != 0 and "no such file or directory" in missing.output
    empty = tmp_path / "empty"
    empty.mkdir()
    refused = CliRunner().invoke(app, ["report", "--run", str(empty)], env=wide)
    assert refused.exit_code != 0 and "not a run, a demo or a trajectories file" in refused.output
    assert "a demo directory" in refused.output and not (empty / "report.html").exists()


def test_report_on_a_real_ppo_run_with_offline_eval_and_audit(world, tmp_path):
    from searchrl.ppo.config import PPOConfig
    from searchrl.ppo.trainer import PPOTrainer

    root, tok = world["root"], world["tok"]
    data = tmp_path / "data"
    data.mkdir()
    rows = QA + [{**r, "id": r["id"] + "b"} for r in QA]
    for split in ("train", "dev", "test"):
        (data / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    args = PPOConfig(
        output_dir=str(tmp_path / "run"),
        train_file=str(data / "train.jsonl"),
        dev_file=str(data / "dev.jsonl"),
        index_dir=str(root / "index"),
        per_device_train_batch_size=3,
        total_episodes=6,
        num_ppo_epochs=1,
        max_turns=2,
        max_tool_calls=2,
        max_new_tokens_per_turn=16,
        max_episode_tokens=200,
        learning_rate=1e-3,
        save_steps=1,
        eval_steps=1,
        num_eval_questions=3,
        progress_bar=False,
    )
    from searchrl.search.index import load_index

    backend = load_index(root / "index")
    env_cfg = args.env_config()
    trainer = PPOTrainer(
        args,
        tok,
        build_policy(tok, TINY),
        None,
        None,
        rows,
        reward_funcs=default_rubric(),
        environment=lambda: SearchEnvironment(backend, env_cfg, tokenizer=tok),
        eval_dataset=QA,
    )
    trainer.train()
    run = tmp_path / "run"
    # PPOTrainer.evaluate: the offline loop (`evaluate_policy`) on the trainer's own parts.
    flat = trainer.evaluate(QA)
    assert {"eval/exact_match", "eval/f1", "eval/searches_per_question", "eval/reward"} <= set(flat)
    saved = json.loads((run / "eval" / "step-2.json").read_text())
    assert saved["step"] == 2 and saved["episode"] == trainer.episode
    assert {k: saved[k] for k in flat} == flat
    result, eval_path = evaluate_run(run, "test", "latest", n_resamples=50)
    assert eval_path.name == "test-step-2.json" and result.summary["n"] == 6
    path = write_report(run)
    text = path.read_text()
    assert "alt='KL and KL coefficient'" in text and "alt='Held-out exact match'" in text
    assert "test-step-2.json" in text and 'class="span action"' in text
    assert "verdict-" in text


# -- trainers side by side -------------------------------------------------------------------------------


class _SvgReader(HTMLParser):
    """Collects each comparison SVG (by its x axis) and the data of its polylines."""

    def __init__(self) -> None:
        super().__init__()
        self.plots: dict[str, dict[str, tuple[list[float], list[float], list[tuple[float, float]]]]] = {}
        self.current: str | None = None
        self.table_rows: list[list[str]] = []
        self._in_trainers = False
        self._cell: list[str] | None = None
        self._row: list[str] | None = None

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "svg" and "compare" in (a.get("class") or ""):
            self.current = a["data-x"]
            self.plots[self.current] = {}
        elif tag == "polyline" and self.current is not None:
            xs = [float(v) for v in a["data-x"].split(",")]
            ys = [float(v) for v in a["data-y"].split(",")]
            pts = [tuple(float(c) for c in p.split(",")) for p in a["points"].split()]
            self.plots[self.current][a["data-label"]] = (xs, ys, pts)
        elif tag == "table" and a.get("class") == "trainers":
            self._in_trainers = True
        elif self._in_trainers and tag == "tr":
            self._row = []
        elif self._in_trainers and tag in ("td", "th"):
            self._cell = []

    def handle_endtag(self, tag):
        if tag == "svg":
            self.current = None
        elif tag == "table":
            self._in_trainers = False
        elif self._in_trainers and tag in ("td", "th") and self._cell is not None and self._row is not None:
            self._row.append("".join(self._cell))
            self._cell = None
        elif self._in_trainers and tag == "tr" and self._row is not None:
            self.table_rows.append(self._row)
            self._row = None

    def handle_data(self, data):
        if self._cell is not None:
            self._cell.append(data)


def _eval_files(run) -> list[dict]:
    files = sorted((run / "eval").glob("step-*.json"), key=lambda p: int(p.stem.split("-")[1]))
    return [json.loads(p.read_text()) for p in files]


def _metrics_by_step(run) -> dict[int, dict]:
    out: dict[int, dict] = {}
    for line in (run / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        out.setdefault(row["step"], {}).update(row)
    return out


@pytest.fixture(scope="module")
def three_runs(world, tmp_path_factory):
    """Real tiny runs: PPO (2 steps) and GRPO in both modes (2 steps each), all evaluated every step."""
    from searchrl.grpo.config import GRPORunConfig
    from searchrl.grpo.trainer import build_grpo_trainer
    from searchrl.ppo.config import PPOConfig
    from searchrl.ppo.trainer import PPOTrainer
    from searchrl.search.index import load_index
    from searchrl.sections import with_sections_of

    root, tok = world["root"], world["tok"]
    out = tmp_path_factory.mktemp("three")
    backend = load_index(root / "index")
    ppo = PPOConfig(
        output_dir=str(out / "ppo"),
        per_device_train_batch_size=4,
        total_episodes=8,
        num_ppo_epochs=1,
        max_turns=2,
        max_tool_calls=1,
        max_new_tokens_per_turn=12,
        max_episode_tokens=48,
        max_observation_tokens=32,
        learning_rate=1e-3,
        temperature=1.0,
        save_steps=1,
        eval_steps=1,
        eval_on_start=True,
        num_eval_questions=3,
        progress_bar=False,
    )
    torch.manual_seed(0)
    PPOTrainer(
        ppo,
        tok,
        build_policy(tok, TINY),
        None,
        None,
        QA + [{**r, "id": r["id"] + "b"} for r in QA],
        reward_funcs=default_rubric(),
        environment=lambda: SearchEnvironment(backend, ppo.env_config(), tokenizer=tok),
        eval_dataset=QA,
    ).train()
    runs = {"PPO": out / "ppo"}
    for label, mode in (("GRPO (TRL loop)", "trl_loop"), ("GRPO (our rollout)", "our_rollout")):
        cfg = with_sections_of(
            GRPORunConfig,
            ppo,
            mode=mode,
            output_dir=str(out / mode),
            num_generations=2,
            eval_on_start=True,
            eval_batch_size=ppo.episodes_per_step,
        )
        torch.manual_seed(0)
        build_grpo_trainer(cfg, build_policy(tok, TINY), tok, backend, QA[:2], QA, default_rubric()).train()
        runs[label] = out / mode
    return runs


def test_side_by_side_draws_one_line_per_trainer_from_real_runs(three_runs, tmp_path):
    page = write_report(three_runs["PPO"], out=tmp_path / "report.html", compare=three_runs)
    text = page.read_text()
    assert "<h2>Trainers side by side</h2>" in text and "<script" not in text and "src='http" not in text
    reader = _SvgReader()
    reader.feed(text)
    assert set(reader.plots) == {"train_s", "episodes"}
    by_episodes = reader.plots["episodes"]
    assert list(by_episodes) == list(three_runs), "one line per trainer, in the order given"
    for label, run in three_runs.items():
        evals, logged = _eval_files(run), _metrics_by_step(run)
        xs, ys, pts = by_episodes[label]
        # x: the run's episode count at each evaluation (eval file, else that step's metrics line).
        assert xs == [float(e.get("episode", logged.get(e["step"], {}).get("episode"))) for e in evals]
        assert ys == pytest.approx([e["eval/exact_match"] for e in evals])
        assert len(pts) == len(evals) >= 2 and xs == sorted(xs) and xs[-1] == 8
    for label in ("PPO", "GRPO (TRL loop)", "GRPO (our rollout)"):  # every trainer records training seconds
        xs, _, pts = reader.plots["train_s"][label]
        evals = _eval_files(three_runs[label])
        assert [e["step"] for e in evals] == [0, 1, 2] and len(pts) == 3
        assert xs == pytest.approx([e["time/train_s"] for e in evals], rel=1e-5, abs=1e-5)
        # Pixel x grows with time: the polyline really follows the data.
        assert [p[0] for p in pts] == sorted(p[0] for p in pts)
    assert "Not drawn" not in text
    header, *rows = reader.table_rows
    assert header[:2] == ["trainer", "final dev EM"] and "seconds / step" in header
    assert [r[0] for r in rows] == list(three_runs)
    for row, run in zip(rows, three_runs.values(), strict=True):
        last = _eval_files(run)[-1]
        assert row[1] == f"{last['eval/exact_match']:.3f} (step 2)"
        assert row[header.index("episodes")] == "8" and row[header.index("steps")] == "2"


def test_report_cli_compare_option(three_runs, tmp_path):
    out = tmp_path / "cmp.html"
    args = ["report", "--run", str(three_runs["PPO"]), "--out", str(out), "--trajectories", "0"]
    for label, run in three_runs.items():
        args += ["--compare", f"{label}={run}"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    reader = _SvgReader()
    reader.feed(out.read_text())
    assert list(reader.plots["episodes"]) == list(three_runs)
    bad = CliRunner().invoke(app, ["report", "--run", str(three_runs["PPO"]), "--compare", "PPO"])
    assert bad.exit_code != 0 and "LABEL=DIR" in bad.output
    empty = tmp_path / "empty-run"
    (empty / "eval").mkdir(parents=True)
    # A wide terminal: rich would otherwise wrap the long temporary path inside the message.
    none = CliRunner().invoke(
        app, ["report", "--run", str(three_runs["PPO"]), "--compare", f"X={empty}"], env={"COLUMNS": "1000"}
    )
    assert none.exit_code != 0 and "no eval/step-N.json" in none.output, none.output


def test_curve_falls_back_to_the_metrics_log_and_names_missing_clocks(tmp_path):
    from searchrl.evaluation.compare import comparison_svg, read_trainer_curve

    run = tmp_path / "old-ppo"
    for step, em in ((1, 0.25), (3, 0.5), (2, 0.0)):  # written out of order: sorted by step
        atomic_write_json(run / "eval" / f"step-{step}.json", {"step": step, "eval/exact_match": em})
        append_jsonl(run / "metrics.jsonl", {"step": step, "episode": 4 * step})
    atomic_write_json(run / "eval" / "test-step-3.json", {"split": "test", "exact_match": 0.4})
    curve = read_trainer_curve("PPO", run)
    assert curve.steps == [1, 2, 3] and curve.exact_match == [0.25, 0.0, 0.5]
    assert curve.episodes == [4.0, 8.0, 12.0] and curve.train_s == [None, None, None]
    assert curve.seconds_per_step is None and curve.test["exact_match"] == 0.4
    svg = comparison_svg([curve], "train_s", "t", "training seconds")
    assert "<polyline" not in svg and "Not drawn (no training seconds recorded): PPO" in svg
    assert svg.count("<polyline") == 0
    assert comparison_svg([curve], "episodes", "t", "episodes").count('data-label="PPO"') == 1
