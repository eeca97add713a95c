"""Can the demos' tiny model learn to copy an order id? The same toy at several learning rates, side by side.

Why (issue 26): the support demo's warm start does not read an order id out of a search result (teacher-forced
0.06). This isolates the copy: each example is a search result line "[1] Order o-DDDDD", 3-30 filler words, then
the start of a get_order call; the loss is on the id's five digits only, and the score is on 200 held-out ids.
The policy is `TinyModelConfig()` with the support tokenizer's pre-tokenizer (one token a digit), trained with
AdamW from scratch, one model per learning rate, same data order.

Measured (1 torch thread, 2 shared cores, `--steps 300 --lrs 3e-3 1e-3`, seed 0): at 3e-3, the warm start's
learning rate, held-out exact copies 0.04 after 300 steps (digit accuracy 0.62); at 1e-3 0.52 at step 100, 0.95 at
200, 1.00 at 300. With the support demo's own tokenizer (issue 26's closing note): 3e-3 0.00 after 600 steps
(digit accuracy 0.25), 1e-3 1.00 at 300.

    python benchmarks/digit_copy.py --steps 400 --lrs 3e-3 1e-3 --json .bench/digit_copy.json
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path
from typing import Any

import torch

from searchrl.models.tiny import TinyModelConfig, build_policy, train_tokenizer

WORDS = [
    "white",
    "teapot",
    "blue",
    "shirt",
    "ordered",
    "on",
    "April",
    "by",
    "Lane",
    "Road",
    "Status",
    "shipped",
    "the",
    "and",
    "red",
    "lamp",
    "kettle",
]
CALL = '{"name": "get_order", "arguments": {"order_id": "o-'


def toy_tokenizer():
    rng = random.Random(1)
    texts = [
        f"[1] Order o-{rng.randrange(10**5):05d}\n{' '.join(rng.sample(WORDS, 8))}\n{CALL}"
        for _ in range(500)
    ]
    return train_tokenizer(texts, vocab_size=400)


def example(
    tok, rng: random.Random, prefix_words: int = 0, distractors: bool = False
) -> tuple[list[int], list[int]]:
    """A result line with an id, filler, the call's start; labels on the id's digits. `prefix_words` words
    before the result (a real episode's prompt and first call stand there); `distractors`: a date and a street
    number in the filler, other digits to tell apart as in a real result."""
    oid = "".join(rng.choice("0123456789") for _ in range(5))
    filler = " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 30)))
    if distractors:
        filler = f"ordered on {rng.randint(1, 28)} April, {rng.randint(1, 99)} Leri Lane. {filler}"
    prefix = "".join(f"{rng.choice(WORDS)} " for _ in range(prefix_words))
    context = tok.encode(f"{prefix}[1] Order o-{oid}\n{filler}\n{CALL}")
    digits = tok.encode(oid)
    return context + digits, [-100] * len(context) + digits


def batch(tok, rng: random.Random, n: int, **shape: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    examples = [example(tok, rng, **shape) for _ in range(n)]
    width = max(len(ids) for ids, _ in examples)
    ids = torch.full((n, width), tok.pad_token_id)
    labels = torch.full((n, width), -100)
    attention = torch.zeros(n, width, dtype=torch.long)
    for i, (x, y) in enumerate(examples):
        ids[i, : len(x)], labels[i, : len(y)], attention[i, : len(x)] = torch.tensor(x), torch.tensor(y), 1
    return ids, labels, attention


@torch.no_grad()
def held_out_scores(model, test) -> dict[str, float]:
    ids, labels, attention = test
    model.eval()
    predicted = model(input_ids=ids, attention_mask=attention).logits.argmax(-1)[:, :-1]
    model.train()
    target = labels[:, 1:]
    scored = target != -100
    right = (predicted == target) & scored
    return {
        "exact": float((right | ~scored).all(1).float().mean()),
        "digit_accuracy": float(right.sum() / scored.sum()),
    }


def run(lr: float, steps: int, every: int, seed: int, **shape: Any) -> list[dict[str, float]]:
    torch.manual_seed(seed)
    tok = toy_tokenizer()
    model = build_policy(tok, TinyModelConfig(seed=seed))
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    rng, test = random.Random(seed), batch(tok, random.Random(10_000 + seed), 200, **shape)
    history, start = [], time.time()
    for step in range(1, steps + 1):
        ids, labels, attention = batch(tok, rng, 64, **shape)
        loss = model(input_ids=ids, attention_mask=attention, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        if step % every == 0 or step == steps:
            row = {"lr": lr, "step": step, "loss": loss.item(), **held_out_scores(model, test)}
            history.append({**row, "seconds": round(time.time() - start, 1)})
            print(json.dumps(history[-1]), flush=True)
    return history


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=400, help="Optimizer steps per learning rate.")
    parser.add_argument("--every", type=int, default=50, help="Steps between two held-out scores.")
    parser.add_argument(
        "--lrs", type=float, nargs="+", default=[3e-3, 1e-3], help="Learning rates to compare."
    )
    parser.add_argument("--seed", type=int, default=0, help="Seed of the model and the data.")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads.")
    parser.add_argument("--prefix-words", type=int, default=0, help="Words before the result line.")
    parser.add_argument(
        "--distractors", action="store_true", help="A date and a street number in the result (other digits)."
    )
    parser.add_argument("--json", type=Path, default=None, help="Write every score here.")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    shape = {"prefix_words": args.prefix_words, "distractors": args.distractors}
    results = {str(lr): run(lr, args.steps, args.every, args.seed, **shape) for lr in args.lrs}
    final = {lr: rows[-1]["exact"] for lr, rows in results.items()}
    print(json.dumps({"final_exact": final}))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
