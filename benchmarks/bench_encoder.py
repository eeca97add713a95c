"""Query encoding on the CPU: sentence-transformers' torch backend against its ONNX backend, side by side.

What: loads the bundled MiniLM with sentence-transformers (torch) and as ONNX: sentence-transformers'
`backend="onnx"` when it loads (it needs `optimum[onnxruntime]`, not a searchrl dependency, and optimum 2.3 does
not import beside transformers 5), else the same model exported here with `torch.onnx.export` and run by
onnxruntime directly with the same mean pooling and normalisation. It checks both give the same vectors (cosine),
and times, interleaved round by round (so machine load hits both alike), one query per call (the p50 of a
trainer's single search) and batches of 64 queries (a GRPO step's searches). Reports the ONNX/torch ratios.

Why: FlashRAG users found query encoding was 6.63 s of a 6.68 s search batch; the question for docs/search.md is
whether the ONNX runtime pays on these cores before searchrl depends on it.

Usage: ``python benchmarks/bench_encoder.py --json OUT [--threads 1]``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def load_torch(model_dir: Path):
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(model_dir), device="cpu", local_files_only=True)
    return lambda texts: model.encode(texts, batch_size=64, normalize_embeddings=True)


def load_onnx(model_dir: Path, threads: int):
    """sentence-transformers' ONNX backend, or (when optimum does not import) onnxruntime on an export of ours."""
    try:
        from sentence_transformers import SentenceTransformer

        model = SentenceTransformer(str(model_dir), device="cpu", backend="onnx", local_files_only=True)
        return "sentence-transformers backend=onnx", lambda t: model.encode(t, normalize_embeddings=True)
    except ImportError:
        pass
    import onnxruntime as ort
    import torch
    from transformers import AutoModel, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    hf = AutoModel.from_pretrained(str(model_dir)).eval()

    class LastHidden(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.hf = hf

        def forward(self, ids, mask, types):
            return self.hf(input_ids=ids, attention_mask=mask, token_type_ids=types).last_hidden_state

    path = model_dir / "model.onnx"
    names = ["input_ids", "attention_mask", "token_type_ids"]
    probe = tok(["a probe", "another probe text"], padding=True, return_tensors="pt")
    with torch.no_grad():
        torch.onnx.export(
            LastHidden(),
            tuple(probe[n] for n in names),
            str(path),
            input_names=names,
            output_names=["last_hidden_state"],
            dynamic_axes={n: {0: "batch", 1: "seq"} for n in [*names, "last_hidden_state"]},
            opset_version=17,
            dynamo=False,
        )
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    session = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])

    def encode(texts: list[str]) -> np.ndarray:
        out = []
        for i in range(0, len(texts), 64):
            enc = tok(texts[i : i + 64], padding=True, truncation=True, max_length=256, return_tensors="np")
            hidden = session.run(None, {n: enc[n].astype(np.int64) for n in names})[0]
            mask = enc["attention_mask"][..., None].astype(np.float32)
            pooled = (hidden * mask).sum(1) / np.maximum(mask.sum(1), 1e-9)  # mean pooling, as MiniLM's
            out.append(pooled / np.linalg.norm(pooled, axis=1, keepdims=True))
        return np.concatenate(out)

    return "onnxruntime on torch.onnx.export (opset 17)", encode


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", type=Path)
    ap.add_argument("--threads", type=int, default=1, help="torch and ONNX runtime threads")
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    import torch

    torch.set_num_threads(a.threads)
    os.environ["OMP_NUM_THREADS"] = str(a.threads)
    from searchrl.search.dense import resolve_model_path

    queries = [
        f"who was the {w} of the {v} in {1900 + i}?"
        for i, (w, v) in enumerate(
            [("founder", "city"), ("mayor", "club"), ("author", "treaty"), ("captain", "team")] * 32
        )
    ]
    out: dict = {
        "threads": a.threads,
        "cpus": os.cpu_count(),
        "load_avg_1m_start": round(os.getloadavg()[0], 2),
    }
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = Path(tmp) / "minilm"
        shutil.copytree(resolve_model_path(), model_dir)  # an ONNX export is written into the model's folder
        models = {"torch": load_torch(model_dir)}
        try:
            out["onnx_path"], models["onnx"] = load_onnx(model_dir, a.threads)
        except Exception as e:  # noqa: BLE001 - onnxruntime missing or the export failing: say so in the report
            out["onnx_error"] = f"{type(e).__name__}: {e}"[:300]
        vecs = {k: m(queries) for k, m in models.items()}
        if "onnx" in vecs:
            out["min_cosine_onnx_vs_torch"] = round(float((vecs["onnx"] * vecs["torch"]).sum(1).min()), 6)
        single = {k: [] for k in models}
        batch = {k: float("inf") for k in models}
        for _ in range(a.rounds):
            for name, m in models.items():
                for q in queries[:40]:
                    t = time.perf_counter()
                    m([q])
                    single[name].append((time.perf_counter() - t) * 1000)
                t = time.perf_counter()
                m(queries)
                batch[name] = min(batch[name], time.perf_counter() - t)
        for name in models:
            out[f"{name}_single_p50_ms"] = round(float(np.percentile(single[name], 50)), 2)
            out[f"{name}_batch64_queries_per_s"] = round(len(queries) / batch[name], 1)
        if "onnx" in models:
            out["onnx_vs_torch_single"] = round(out["torch_single_p50_ms"] / out["onnx_single_p50_ms"], 2)
            out["onnx_vs_torch_batched"] = round(
                out["onnx_batch64_queries_per_s"] / out["torch_batch64_queries_per_s"], 2
            )
    print(json.dumps(out, indent=2))
    if a.json:
        a.json.write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
