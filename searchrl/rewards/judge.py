"""An optional model-judge reward: a local sequence-classification model scores (question, answer, documents).

What: `ModelJudgeReward(model_or_path, tokenizer)` is a reward function `Callable[[Trajectory], float]`.
It renders the question, the final answer and the documents this trajectory actually retrieved into one
text, runs a local scorer (`num_labels=1`) under `no_grad`, and returns the logit at the last token (or
its sigmoid, `squash=True`). In a `Rubric` it is one weighted entry with its own name, so it is logged
separately from the rule rewards. It never touches the network: paths load with `local_files_only`.

Why only one signal among many: a learned judge is biased and can be gamed (the seeds: build rewards
first from checkable facts). Give it a small weight next to exact match and citation support, or weight 0
to watch it as a metric. Its parameters are frozen; PPO's gradient never reaches it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from searchrl.common.trajectory import Trajectory
from searchrl.rewards.scoring import sequence_scores


def judge_text(traj: Trajectory, max_docs: int = 5, max_doc_chars: int = 400) -> str:
    """The judge's input: question, answer (with citations) and the retrieved documents, in that order."""
    cited = " ".join(f"[{c}]" for c in traj.citations)
    answer = (traj.answer or "").strip()
    lines = [f"Question: {traj.question.strip()}", f"Answer: {answer} {cited}".rstrip(), "Documents:"]
    for doc_id, text in list(traj.retrieved.items())[:max_docs]:
        lines.append(f"[{doc_id}] {' '.join(str(text).split())[:max_doc_chars]}")
    if len(lines) == 3:
        lines.append("(none retrieved)")
    return "\n".join(lines)


class ModelJudgeReward:
    """A frozen local seq-cls judge as a reward function; see the module docstring."""

    def __init__(
        self,
        model_path_or_model: str | Path | nn.Module,
        tokenizer: Any | None = None,
        max_length: int = 512,
        squash: bool = False,
        max_docs: int = 5,
        device: str | None = None,
    ) -> None:
        if isinstance(model_path_or_model, str | Path):
            model, tokenizer = _load_local(Path(model_path_or_model), tokenizer)
        else:
            model = model_path_or_model
            if tokenizer is None:
                raise ValueError("ModelJudgeReward: pass the tokenizer along with a model instance")
        if getattr(model.config, "num_labels", None) != 1:
            raise ValueError(
                f"ModelJudgeReward needs a sequence-classification model with num_labels=1, got "
                f"num_labels={getattr(model.config, 'num_labels', None)}"
            )
        if max_length < 16:
            raise ValueError(f"max_length must be >= 16 tokens, got {max_length}")
        self.model = model.to(device) if device else model
        self.model.eval()
        for p in self.model.parameters():
            p.requires_grad_(False)
        self.tokenizer = tokenizer
        self.max_length = max_length
        self.squash = squash
        self.max_docs = max_docs

    def _ids(self, text: str) -> list[int]:
        ids = [int(i) for i in self.tokenizer.encode(text, add_special_tokens=False)]
        # Keep the start: question and answer come first, so a cut drops only the tail of the documents.
        return ids[: self.max_length]

    @torch.no_grad()
    def score_texts(self, texts: list[str]) -> list[float]:
        """Judge scores of several rendered texts, one batched forward pass."""
        seqs = [self._ids(t) or [int(self.tokenizer.eos_token_id)] for t in texts]
        width = max(len(s) for s in seqs)
        device = next(self.model.parameters()).device
        ids = torch.zeros((len(seqs), width), dtype=torch.long)
        mask = torch.zeros((len(seqs), width), dtype=torch.long)
        for r, s in enumerate(seqs):
            ids[r, : len(s)] = torch.tensor(s)
            mask[r, : len(s)] = 1
        logits = _scores(self.model, ids.to(device), mask.to(device)).float().cpu()
        values = torch.sigmoid(logits) if self.squash else logits
        return [float(v) for v in values]

    def score_batch(self, trajs: list[Trajectory]) -> list[float]:
        return self.score_texts([judge_text(t, self.max_docs) for t in trajs])

    def __call__(self, traj: Trajectory) -> float:
        return self.score_texts([judge_text(traj, self.max_docs)])[0]


def _scores(model: nn.Module, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Last-real-token logits for decoder scorers with a `score` head (Qwen, Llama, the tiny model);
    otherwise the model's own pooling (BERT-style encoders read their first token), right-padded."""
    if hasattr(model, "score") and hasattr(model, getattr(model, "base_model_prefix", "") or "-"):
        return sequence_scores(model, ids, mask)
    return model(input_ids=ids, attention_mask=mask).logits[:, 0]


def _load_local(path: Path, tokenizer: Any | None) -> tuple[nn.Module, Any]:
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    if not path.is_dir():
        raise ValueError(
            f"model judge: {path} is not a local model directory; train one with `searchrl reward-model train` "
            "or save a sequence-classification model there (nothing is downloaded)"
        )
    model = AutoModelForSequenceClassification.from_pretrained(str(path), local_files_only=True, num_labels=1)
    tok = tokenizer or AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    return model, tok
