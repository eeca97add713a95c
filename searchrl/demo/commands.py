"""`searchrl demo`: the offline demo end to end (data, index, tiny models, expert, SFT, eval, PPO, eval, report)."""

from __future__ import annotations

from pathlib import Path

import typer


def register(app: typer.Typer) -> None:
    @app.command("demo")
    def demo(
        smoke: bool = typer.Option(False, "--smoke", help="The same stages at toy size (about 3 minutes)."),
        config: Path | None = typer.Option(None, "--config", help="YAML file of DemoConfig fields."),
        out: str | None = typer.Option(
            None, "--out", help="Run directory (default runs/demo or runs/demo-smoke)."
        ),
        seed: int | None = typer.Option(None, "--seed", help="Seed of every stage."),
        quiet: bool = typer.Option(False, "--quiet", help="No progress lines."),
        compare_grpo: bool = typer.Option(
            False,
            "--compare-grpo",
            help="Also train GRPO (TRL's loop and our rollout) from the same warm start on PPO's budget and "
            "draw the three side by side in report.html.",
        ),
    ) -> None:
        """Run the offline demo: synthesise the task, index it, build and warm-start the tiny model, PPO, evaluate."""
        import json

        from searchrl.common.config import load_config
        from searchrl.demo.pipeline import DemoConfig, run_demo, smoke_config

        if config is not None:
            cfg = load_config(DemoConfig, config)
        elif smoke:
            cfg = smoke_config()
        else:
            cfg = DemoConfig()
        overrides = {}
        if out is not None:
            overrides["out_dir"] = out
        if seed is not None:
            overrides["seed"] = seed
        if quiet:
            overrides["progress_bar"] = False
        if compare_grpo:
            overrides["compare_grpo"] = True
        if overrides:
            import dataclasses

            cfg = dataclasses.replace(cfg, **overrides)
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
