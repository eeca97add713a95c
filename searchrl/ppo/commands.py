"""`searchrl train`: a PPO run from one YAML file (`PPOConfig`), end to end.

What it assembles, in order, from the config: the questions (`train_file`, `dev_file`), the search
engine (`index_dir`, built from `corpus_path` first if the folder does not exist yet, or `search_url`),
the environment with the config's budgets, the reward rubric (`reward_config_path`, else the default
rubric), the policy and tokenizer (`policy_model_path`, e.g. the SFT warm start; without one, a tiny
Qwen2 model and a BPE tokenizer are built from the task's own text so the command runs offline from
nothing), and the optional reference, critic and reward models. Then `PPOTrainer.train`.

Why a thin shell: everything the command does is `run_ppo(cfg)`, which the demo and tests call directly.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer
import yaml

from searchrl.common.config import ConfigError, load_config
from searchrl.common.io import read_jsonl
from searchrl.data.datasets import load_qa
from searchrl.env.environment import SearchEnvironment
from searchrl.ppo.config import PPOConfig
from searchrl.rewards.combine import default_rubric, load_rubric


def parse_set_options(pairs: list[str]) -> dict[str, Any]:
    """`["kl_coef=0.1", "report_to=[tensorboard]"]` -> `{"kl_coef": 0.1, "report_to": ["tensorboard"]}`."""
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--set {pair!r}: write FIELD=VALUE, e.g. --set kl_coef=0.1")
        try:
            out[key.strip()] = yaml.safe_load(value)
        except yaml.YAMLError as e:
            raise ConfigError(f"--set {pair!r}: the value is not valid YAML: {e}") from e
    return out


def _existing(path: str | None, field_name: str, how: str) -> Path:
    if not path:
        raise ConfigError(f"{field_name} is not set; {how}")
    p = Path(path)
    if not p.exists():
        raise ConfigError(f"{field_name}={path!r} does not exist; {how}")
    return p


SYNTH_HOW = "create the synthetic task with `searchrl data synth --size tiny --out runs/demo/data` (or `searchrl demo`)"


def load_questions(cfg: PPOConfig) -> tuple[list[dict], list[dict]]:
    """The train and dev rows (`question`, `golds`, ...). The test split is never read here."""
    train = load_qa(_existing(cfg.train_file, "train_file", SYNTH_HOW))
    dev = load_qa(_existing(cfg.dev_file, "dev_file", SYNTH_HOW)) if cfg.dev_file else []
    return train, dev


def environment_factory(cfg: PPOConfig, backend: Any, tokenizer: Any) -> Callable[[], Any]:
    """A fresh `SearchEnvironment` per episode with the config's budgets."""
    env_cfg = cfg.env_config()
    return lambda: SearchEnvironment(backend, env_cfg, tokenizer=tokenizer)


def load_or_build_policy(cfg: PPOConfig, train_rows: list[dict]) -> tuple[Any, Any]:
    """(policy, tokenizer): from `policy_model_path`, else a fresh tiny model over the task's text."""
    # transformers and trl: loaded when training starts, not for --help.
    from searchrl.models.io import load_policy, load_tokenizer
    from searchrl.models.tiny import TinyModelConfig, build_policy, tokenizer_training_texts, train_tokenizer

    if cfg.policy_model_path:
        path = _existing(cfg.policy_model_path, "policy_model_path", "train the SFT warm start first")
        tok_path = _existing(cfg.tokenizer_path or str(path), "tokenizer_path", "save the tokenizer there")
        return load_policy(path), load_tokenizer(tok_path)
    corpus = []
    if cfg.corpus_path and Path(cfg.corpus_path).exists():
        corpus = list(read_jsonl(cfg.corpus_path))
    tokenizer = train_tokenizer(tokenizer_training_texts(corpus, train_rows))
    return build_policy(tokenizer, TinyModelConfig(seed=cfg.seed)), tokenizer


def load_side_models(cfg: PPOConfig) -> tuple[Any, Any, Any]:
    """(reference, critic, reward model), each None when its path is not set.

    Without `value_model_path` the critic starts from the reward model when one is given (TRL's
    examples did so), else the trainer builds it from the policy's backbone.
    """
    from searchrl.models.io import load_policy, load_value_model  # transformers and trl, as above

    ref = load_policy(cfg.ref_model_path) if cfg.ref_model_path else None
    reward_model = load_value_model(cfg.reward_model_path) if cfg.reward_model_path else None
    if cfg.value_model_path:
        value = load_value_model(cfg.value_model_path)
    elif cfg.reward_model_path and cfg.value_mode == "separate":
        value = load_value_model(cfg.reward_model_path)
    else:
        value = None
    return ref, value, reward_model


def load_reward_functions(cfg: PPOConfig) -> Any:
    if cfg.reward_config_path:
        return load_rubric(
            _existing(cfg.reward_config_path, "reward_config_path", "see configs/rewards_*.yaml")
        )
    return default_rubric()


def build_trainer(cfg: PPOConfig) -> Any:
    """Everything `searchrl train` assembles, as a ready `PPOTrainer`."""
    from searchrl.ppo.trainer import PPOTrainer  # transformers, trl and accelerate: not for --help

    train_rows, dev_rows = load_questions(cfg)
    backend = cfg.open_backend(read_timeout=cfg.search_timeout_s)
    policy, tokenizer = load_or_build_policy(cfg, train_rows)
    ref, value, reward_model = load_side_models(cfg)
    return PPOTrainer(
        cfg,
        tokenizer,
        policy,
        ref,
        reward_model,
        train_rows,
        value_model=value,
        reward_funcs=load_reward_functions(cfg),
        environment=environment_factory(cfg, backend, tokenizer),
        eval_dataset=dev_rows or None,
    )


def run_ppo(cfg: PPOConfig, resume: bool = False) -> Path:
    """Train as `cfg` says (continuing from the newest checkpoint with `resume`); return the run dir."""
    trainer = build_trainer(cfg)
    trainer.train(resume=resume)
    return Path(cfg.output_dir)


def train(
    config: Annotated[
        Path,
        typer.Option(
            "--config", help="PPOConfig YAML, e.g. configs/ppo_tiny.yaml (every field: see the file)."
        ),
    ],
    resume: Annotated[
        bool,
        typer.Option(
            "--resume",
            help="Continue from the newest complete checkpoint in output_dir (weights, optimizer, scheduler, "
            "KL controller, RNG, data position); starts fresh if there is none.",
        ),
    ] = False,
    output_dir: Annotated[
        str | None, typer.Option("--output-dir", help="Run directory (default: the config's output_dir).")
    ] = None,
    set_: Annotated[
        list[str] | None,
        typer.Option(
            "--set",
            help="Override any PPOConfig field: --set FIELD=VALUE (repeatable; values parsed as YAML).",
        ),
    ] = None,
) -> None:
    """Train a search agent with PPO (policy, reference, critic, optional reward model).

    The policy comes from policy_model_path (e.g. the SFT warm start); when that is null, a tiny Qwen2
    model and a BPE tokenizer are built from the task's corpus and train questions, so the command
    runs offline from nothing. A missing index_dir is built from corpus_path first.
    """
    try:
        overrides = parse_set_options(set_ or [])
        if output_dir is not None:
            overrides["output_dir"] = output_dir
        cfg = load_config(PPOConfig, config, overrides)
        run_dir = run_ppo(cfg, resume=resume)
    except (ConfigError, FileNotFoundError, ValueError) as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(code=2) from e
    typer.echo(str(run_dir))


def register(app: typer.Typer) -> None:
    app.command("train", help="PPO on the search task from a PPOConfig YAML (--resume continues a run).")(
        train
    )
