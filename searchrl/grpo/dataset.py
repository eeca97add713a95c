"""What GRPO's trainer is fed: a conversational prompt dataset built by our environment, and its row columns.

TRL's `GRPOTrainer` takes a `datasets.Dataset` whose `prompt` column it renders. Here the prompt is exactly
what `SearchEnvironment.reset` shows, so TRL's tool loop (`trl_loop`), our engine (`our_rollout`) and the SFT
warm start all start an episode from the same messages. `ROW_COLUMNS` are the fields of a row that travel
with it (TRL hands them back with each batch, and our environments need `golds`, `id` and, when rows carry
one, `principal`: the user each episode acts for); nested row fields stay out of Arrow.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from searchrl.env.config import EnvConfig
from searchrl.env.environment import SearchEnvironment
from searchrl.search.base import Backend

# Dataset columns handed to TRL (and back to our environments); nested row fields stay out of Arrow.
ROW_COLUMNS = ("id", "question", "golds", "principal")


def prompt_dataset(rows: Sequence[dict[str, Any]], backend: Backend, env_config: EnvConfig) -> Any:
    """A conversational `datasets.Dataset`: `prompt` = the environment's [system, user] messages.

    The prompt is what `SearchEnvironment.reset` shows, so TRL's loop and our engine start from the same
    messages (TRL renders the tool schema of `SearchToolEnv.search`, our engine the environment's).
    """
    from datasets import Dataset

    env = SearchEnvironment(backend, env_config)
    # A principal column only when some row acts for someone (then every row has it, None: public only).
    with_principal = any(row.get("principal") is not None for row in rows)
    out = []
    for i, row in enumerate(rows):
        if "question" not in row or "golds" not in row:
            raise ValueError(f"training row {i} needs 'question' and 'golds', got keys {sorted(row)}")
        clean = {
            "id": str(row.get("id", i)),
            "question": str(row["question"]),
            "golds": [str(g) for g in row["golds"]],
        }
        if with_principal:
            clean["principal"] = row.get("principal")
        out.append({"prompt": env.reset(clean), **clean})
    return Dataset.from_list(out)
