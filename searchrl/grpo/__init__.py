"""searchrl.grpo: TRL 1.16's GRPOTrainer on our environment, rubric and run directory (`searchrl grpo`).

`run_grpo(GRPORunConfig) -> run_dir` trains from a config; `build_grpo_trainer(...)` assembles the
trainer from objects already in memory (tests, benchmarks, the demo).
"""

from searchrl.grpo.config import GRPO_MODES, GRPORunConfig

__all__ = ["GRPO_MODES", "GRPORunConfig"]
