"""What `searchrl eval` evaluates: a run's checkpoint (or any model), its data, its index and its settings.

What: `evaluate_run` resolves a target (`open_eval_target`: the run read through `RunReader`, the model folder
from `--model` or the run's `latest` / `step-N` / `best` / `initial` checkpoint), the questions
(`split_file`), the search engine (`search_for_eval`: `--index`, `--corpus`, the run's index or URL) and the
settings (`eval_setup`: the run's environment, generation limits and rubric unless given), runs the one
evaluation loop (`loop.evaluate_policy`) and writes the JSON with its trajectories beside it through the run
writer (`write_eval`). The benchmark suite (`benchmarks.py`) resolves its target the same way.
"""

from __future__ import annotations

import contextlib
import dataclasses
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from searchrl.common.trajectory import Trajectory
from searchrl.data.datasets import load_qa
from searchrl.env.config import EnvConfig
from searchrl.env.environment import SearchEnvironment
from searchrl.evaluation.loop import EvalResult, GeneratorFactory, evaluate_policy
from searchrl.evaluation.statistics import DEFAULT_BOOTSTRAP
from searchrl.rewards.combine import default_rubric
from searchrl.rollout.generator import GenerationConfig
from searchrl.run.errors import RunTargetError
from searchrl.run.reader import RunReader
from searchrl.run.writer import step_of, write_evaluation


def load_run_config(run_dir: str | Path) -> Any:
    """The run's `config.yaml` as its trainer's config (`PPOConfig` or `GRPORunConfig`, from manifest.json).

    `run_dir` may also be a demo directory (its PPO run's config). Raises FileNotFoundError when the run
    has no config.yaml and `RunTargetError` (a ValueError) when the path is not a run at all.
    """
    reader = RunReader(run_dir)
    root = reader.require_run("searchrl eval")
    if reader.config is None:
        raise FileNotFoundError(
            f"{root / 'config.yaml'}: no config.yaml, so {root} is not a run directory written by `searchrl train` "
            "or `searchrl grpo`; pass --model, --data and --index to evaluate a plain model folder"
        )
    return reader.config


def resolve_checkpoint(run_dir: str | Path, checkpoint: str = "latest") -> tuple[Path, str]:
    """(policy folder, checkpoint name) for `latest`, `step-N` or `N` in `RUN/checkpoints/` (read only)."""
    return RunReader(run_dir).checkpoint_policy(checkpoint)


def split_file(config: Any, split: str, data_dir: str | Path | None) -> Path:
    """The questions to evaluate: `data_dir` itself when it is a file, else `<data dir>/<split>.jsonl`.

    The data dir is `data_dir` or the folder of the run config's train/dev file. Raises FileNotFoundError
    saying what to pass when neither names one, or when the folder has no such split.
    """
    if data_dir is not None:
        path = Path(data_dir)
        if path.is_file():
            return path
        if not path.exists():
            raise FileNotFoundError(
                f"--data {path}: no such file or folder; pass a folder of <split>.jsonl files or one JSONL file of "
                "questions (rows with id, question, golds)"
            )
        if not (path / f"{split}.jsonl").is_file():
            present = sorted(p.name for p in path.glob("*.jsonl"))
            raise FileNotFoundError(
                f"--data {path}: no {split}.jsonl in this folder (it has {present or 'no .jsonl files'}); pass "
                "--split NAME for one of them, or --data FILE"
            )
        return path / f"{split}.jsonl"
    if config is not None:
        known = {"train": config.train_file, "dev": config.dev_file}
        if known.get(split):
            return Path(known[split])
        for anchor in (config.dev_file, config.train_file):
            if anchor:
                return Path(anchor).parent / f"{split}.jsonl"
    raise FileNotFoundError(
        f"cannot tell where the {split!r} split lives: the run config names no train_file/dev_file; "
        "pass --data DIR (the folder of train/dev/test.jsonl) or --data FILE (a JSONL file of questions)"
    )


def _resolve_model(
    reader: Any, config: Any, model: str | Path | None, checkpoint: str | None
) -> tuple[Path, str]:
    """(model folder, name for file names) from --model, or the run's checkpoint (latest/step-N/initial)."""
    if model is not None:
        if checkpoint not in (None, "latest"):
            raise ValueError(
                f"--model {model} and --checkpoint {checkpoint} both name the model to evaluate; give one of them"
            )
        return Path(model), Path(model).name
    if reader is None:
        raise ValueError("give a run directory (--run) or a model folder (--model)")
    if checkpoint == "initial":
        # The policy the run started from (e.g. the SFT warm start): the baseline every gain is measured against.
        initial = reader.initial_policy()
        if initial is None:
            raise ValueError(
                f"--checkpoint initial needs a run whose config.yaml names policy_model_path ({reader.root} names "
                "none and is not a demo's PPO run); pass --model DIR instead"
            )
        return initial, "initial"
    return reader.checkpoint_policy(checkpoint or "latest")


def evaluate_run(
    run_dir: str | Path | None,
    split: str = "test",
    checkpoint: str | None = "latest",
    model: str | Path | None = None,
    data_dir: str | Path | None = None,
    index_dir: str | Path | None = None,
    output: str | Path | None = None,
    batch_size: int = 16,
    limit: int | None = None,
    seed: int = 0,
    n_resamples: int = DEFAULT_BOOTSTRAP,
    env_config: Any = None,
    generation_config: GenerationConfig | None = None,
    rubric: Any = None,
    corpus: str | Path | None = None,
    generator_factory: GeneratorFactory | None = None,
) -> tuple[EvalResult, Path]:
    """Evaluate a run's checkpoint, or any model folder, on a split; write JSON and trajectories.

    The run (`run_dir`: a PPO or GRPO run directory, or a demo directory, read through `RunReader`) gives
    the prompt, protocol, citation style, budgets, rubric and, by default, the data, index and model. Any
    of them can be replaced: `model` (a base model, the SFT policy, a checkpoint folder; or `checkpoint`
    `latest` / `step-N` / `initial` = the run's starting policy, `policy_model_path` or the demo's
    `sft/policy`), `data_dir` (a folder of `<split>.jsonl` or one JSONL file; rows need id, question,
    golds), `index_dir` (a `searchrl index` folder) or `corpus` (a JSONL corpus with id, title, contents,
    indexed with BM25 into a temporary folder for this evaluation), and `env_config`,
    `generation_config`, `rubric`. Without a run, `model`, `data_dir` and an index or corpus are needed.
    `generator_factory` swaps the rollout engine, as in `evaluate_policy` (tests force turns through it).

    The JSON goes to `RUN/eval/<split>-<checkpoint>.json` (or `output`), the trajectories beside it as
    `<same name>.trajectories.jsonl.gz`. Returns the result and the JSON path.
    """
    check_search_args(index_dir, corpus)
    reader, root, config, model_dir, name = open_eval_target(run_dir, model, checkpoint)
    if data_dir is None and reader is not None and reader.split_file(split) is not None:
        data_dir = reader.split_file(split)
        if not Path(data_dir).is_file():
            raise FileNotFoundError(
                f"{data_dir}: the run has no {split!r} split there; pass --data DIR or --data FILE"
            )
    rows_path = split_file(config, split, data_dir)
    with search_for_eval(reader, config, index_dir, corpus) as (backend, search):
        return _evaluate_target(
            reader,
            root,
            config,
            model_dir,
            name,
            rows_path,
            limit,
            backend,
            search,
            output,
            dict(
                split=split,
                env_config=env_config,
                generation_config=generation_config,
                rubric=rubric,
                batch_size=batch_size,
                seed=seed,
                n_resamples=n_resamples,
                generator_factory=generator_factory,
            ),
        )


def check_search_args(index_dir: str | Path | None, corpus: str | Path | None) -> None:
    """`--index` and `--corpus` are alternatives; a corpus must be a file."""
    if corpus is not None and index_dir is not None:
        raise ValueError("--index and --corpus both name the search engine; give one of them")
    if corpus is not None and not Path(corpus).is_file():
        raise FileNotFoundError(f"--corpus {corpus}: no such file; pass a JSONL corpus (id, title, contents)")


def open_run(run_dir: str | Path | None) -> tuple[Any, Path | None, Any]:
    """(RunReader, run root, run config) of an evaluation's `--run`, or Nones without one."""
    reader = RunReader(run_dir) if run_dir is not None else None
    if reader is not None and reader.kind == "trajectories":
        raise RunTargetError(
            f"--run {run_dir}: searchrl eval needs a run directory or a demo directory (its config, checkpoints, "
            "data and index), not a trajectories file; pass the run the file came from"
        )
    root = reader.require_run("searchrl eval") if reader is not None else None
    config = load_run_config(run_dir) if run_dir is not None else None
    return reader, root, config


def open_eval_target(
    run_dir: str | Path | None, model: str | Path | None, checkpoint: str | None
) -> tuple[Any, Path | None, Any, Path, str]:
    """(RunReader, run root, run config, model folder, checkpoint name) of an evaluation: `open_run`, then
    `--model`, else the run's `checkpoint`; FileNotFoundError when that folder is missing."""
    reader, root, config = open_run(run_dir)
    model_dir, name = _resolve_model(reader, config, model, checkpoint)
    if not model_dir.is_dir():
        raise FileNotFoundError(f"{model_dir}: model folder not found")
    return reader, root, config, model_dir, name


def eval_setup(
    reader: Any,
    root: Path | None,
    config: Any,
    model_dir: Path,
    env_config: Any = None,
    generation_config: GenerationConfig | None = None,
    rubric: Any = None,
) -> tuple[Any, Any, Any, GenerationConfig, Any]:
    """(policy, tokenizer, env config, generation config, rubric) of an evaluation: the model folder's policy,
    and each setting as given, else the run's (`RunReader.environment`, `default_generation_config`,
    `RunReader.rubric`; without a run, the defaults)."""
    policy, tokenizer = load_policy_for_eval(reader, config, model_dir)
    if env_config is None:
        env_config = reader.environment() if reader is not None else EnvConfig()
    gen_cfg = generation_config or default_generation_config(config, env_config)
    if rubric is None:
        rubric = reader.rubric() if reader is not None else default_rubric()
    return policy, tokenizer, env_config, gen_cfg, rubric


def default_eval_output(root: Path | None, model_dir: Path, stem: str) -> Path:
    """`RUN/eval/<stem>.json`, or beside the model folder (`<model>/../eval/`) without a run."""
    base = root / "eval" if root is not None else model_dir.parent / "eval"
    return base / f"{stem}.json"


def write_eval(output: Path, payload: dict[str, Any], trajectories: Sequence[Trajectory]) -> None:
    """An evaluation's JSON and its trajectories beside it, through the run writer (`write_evaluation`)."""
    write_evaluation(output, payload, trajectories)


@contextlib.contextmanager
def search_for_eval(
    reader: Any, config: Any, index_dir: str | Path | None, corpus: str | Path | None
) -> Iterator[tuple[Any, dict[str, str]]]:
    """(backend, what it is for the JSON): `--corpus` (a temporary BM25 index, removed afterwards), `--index`,
    else the run's index folder, else the run's search URL."""
    uses_url = (
        bool(getattr(config, "search_url", None)) and getattr(config, "search_backend", "http") == "http"
    )
    if (
        index_dir is None
        and corpus is None
        and reader is not None
        and reader.index_dir is not None
        and not uses_url
    ):
        index_dir = reader.index_dir
    if corpus is not None:
        from searchrl.search.index import build_index  # bm25s and numba: only when a search is opened

        with tempfile.TemporaryDirectory(prefix="searchrl-eval-index-") as tmp:
            yield build_index(corpus, Path(tmp) / "index", backend="bm25"), {"corpus": str(corpus)}
        return
    from searchrl.search.index import SearchConfig, open_backend  # bm25s and numba, as above

    if index_dir is not None and not Path(index_dir).is_dir():
        raise FileNotFoundError(
            f"--index {index_dir}: no such folder; pass a folder built by `searchrl index`, or --corpus FILE "
            "(rows with id, title, contents) to index one for this evaluation"
        )
    if index_dir is None and (
        config is None or not (config.index_dir or getattr(config, "search_url", None))
    ):
        raise FileNotFoundError(
            "no search index: the run config names no index_dir and --index was not given; build one with "
            "`searchrl index --corpus FILE --out DIR` and pass --index DIR, or pass --corpus FILE"
        )
    if index_dir is not None:
        backend = open_backend(SearchConfig(index=str(index_dir)))  # the search room's one opener
    else:
        backend = config.open_backend(read_timeout=config.search_timeout_s)
    yield backend, {"index": str(index_dir if index_dir is not None else getattr(config, "search_url", ""))}


def _evaluate_target(
    reader: Any,
    root: Path | None,
    config: Any,
    model_dir: Path,
    name: str,
    rows_path: Path,
    limit: int | None,
    backend: Any,
    search: dict[str, str],
    output: str | Path | None,
    options: dict[str, Any],
) -> tuple[EvalResult, Path]:
    split = options.get("split")
    rows = load_qa(rows_path, limit=limit)
    policy, tokenizer, env_cfg, gen_cfg, rubric = eval_setup(
        reader,
        root,
        config,
        model_dir,
        options["env_config"],
        options["generation_config"],
        options["rubric"],
    )
    result = evaluate_policy(
        policy,
        tokenizer,
        rows,
        lambda: SearchEnvironment(backend, env_cfg, tokenizer=tokenizer),
        gen_cfg,
        rubric=rubric,
        batch_size=options["batch_size"],
        seed=options["seed"],
        n_resamples=options["n_resamples"],
        generator_factory=options["generator_factory"],
    )
    output = Path(output) if output is not None else default_eval_output(root, model_dir, f"{split}-{name}")
    step = 0 if name == "initial" else step_of(name)
    payload = {
        "split": split,
        "checkpoint": name,
        "step": step,
        "model": str(model_dir),
        "run": None if root is None else str(root),
        "trainer": None if reader is None else reader.trainer,
        "data": str(rows_path),
        **search,
        "num_questions": len(rows),
        "generation_config": result.generation_config,
        "env_config": dataclasses.asdict(env_cfg),
        **result.summary,
    }
    write_eval(output, payload, result.trajectories)
    return result, output


def load_policy_for_eval(reader: Any, config: Any, model_dir: Path) -> tuple[Any, Any]:
    """(policy, tokenizer) of a model folder; the tokenizer from the folder, else the run's. A LoRA checkpoint
    (an adapter folder) is merged into its base model, found from any working directory
    (`searchrl.run.adapter`; the run's starting policy is the fallback)."""
    # trl, datasets and pyarrow come with the model loaders: loaded when a model is.
    from searchrl.models.io import load_policy, load_tokenizer
    from searchrl.run.adapter import adapter_base_dir, is_adapter_dir, load_adapter_policy

    tok_dir = model_dir if (model_dir / "tokenizer_config.json").exists() else None
    if tok_dir is None and config is not None and config.tokenizer_path:
        tok_dir = Path(config.tokenizer_path)
    if tok_dir is None and reader is not None:
        tok_dir = reader.tokenizer_dir()
    if tok_dir is None:
        raise FileNotFoundError(
            f"{model_dir}: no tokenizer files here and the run config names no tokenizer_path"
        )
    if is_adapter_dir(model_dir):
        # The starting policy as recorded: `adapter_base_dir` resolves it near the adapter itself.
        start = reader.recorded_initial_policy() if reader is not None else None
        return load_adapter_policy(model_dir, adapter_base_dir(model_dir, [start])), load_tokenizer(tok_dir)
    return load_policy(model_dir), load_tokenizer(tok_dir)


def default_generation_config(config: Any, env_cfg: Any) -> GenerationConfig:
    """The run's rollout limits, or (no run) 64 tokens a turn within the environment's token budget."""
    if config is not None:
        return config.generation_config()
    return GenerationConfig(max_new_tokens_per_turn=64, max_episode_tokens=env_cfg.max_episode_tokens)
