"""The trajectory viewer: a local web page over a run, a demo, or one trajectories file.

What: `create_app(target)` is a small FastAPI app that serves one HTML page (vanilla JS, no CDN, no
external assets) and a JSON API over the target's trajectory sources (`searchrl.run.reader.RunReader`):
a run's training steps (`RUN/trajectories/step-*.jsonl.gz`) and its evaluations' trajectories
(`RUN/eval/*.trajectories.jsonl.gz`); for a demo directory also the evaluations its layout lists (the
synthetic demo's: the SFT and PPO policies on the hidden test split,
`DEMO/eval/{sft,ppo}-test.trajectories.jsonl.gz`) and its other runs' training steps (the GRPO runs, after
`--compare-grpo`); for a single file, that file. Every endpoint takes ``source`` (an id from
``/api/summary``; default: the first source, a run's training steps):

* ``GET /api/summary``                  target, kind, the sources, and for the chosen source its steps,
  termination reasons, counts and the tokenizer used;
* ``GET /api/trajectories``             the list, filtered by ``step``, ``min_reward``, ``max_reward``,
  ``correct`` (``yes``/``no``: exact match against the golds), ``denied`` (``yes``/``no``: a tool call was
  denied for the episode's principal), ``termination`` and ``q`` (text);
* ``GET /api/trajectories/{key}``       one trajectory token by token: text, kind (prompt / action /
  observation / glue, `searchrl.common.trajectory.token_kinds`: the report colours by the same rule),
  sampling logprob, and the advantage, KL and value the PPO step computed (saved by `PPOTrainer` in
  `metadata` when `save_trajectories` is on), where the score was placed (the last
  action token), the reward breakdown and every tool call with its arguments, status and latency.

Why a viewer: a search agent's failures are quiet (a timeout is an observation, a forged tag is
defanged text, a reward lands on one token); reading one trajectory with its per-token numbers is the
fastest way to see what the policy was rewarded for.

Token texts are decoded one id at a time with the run's own tokenizer (`RunReader.tokenizer_dir`: the
newest checkpoint's ``policy/`` folder, else the starting policy's), loaded from disk only: nothing is
downloaded. Without one the page still works and shows the spans' text instead of per-token pieces.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

from fastapi import FastAPI, HTTPException, Query
from fastapi.responses import JSONResponse, Response

from searchrl.common.trajectory import TERMINATION_REASONS, Trajectory, read_trajectories, token_kinds
from searchrl.rewards.qa import exact_match
from searchrl.run.errors import RunTargetError
from searchrl.run.reader import RunReader
from searchrl.run.sources import TrajectorySource
from searchrl.run.writer import step_of

STATIC_FILES = {
    "index.html": "text/html; charset=utf-8",
    "app.js": "text/javascript; charset=utf-8",
    "style.css": "text/css; charset=utf-8",
}
CORRECT_CHOICES = ("yes", "no")


@dataclass
class Entry:
    """One trajectory and where it came from: its source, step (None for an evaluation) and position."""

    key: str
    step: int | None
    index: int
    file: str
    traj: Trajectory
    source: str = "train"


def check_run_dir(target: str | Path) -> RunReader:
    """The target's reader, or a `RunTargetError` saying what is wrong and what the viewer accepts.

    Accepted: a run directory (PPO or GRPO), a demo directory, or one trajectories file. A target with
    no trajectories at all (no `trajectories/` folder and no evaluation trajectories) is refused.
    """
    reader = RunReader(target)
    sources = reader.trajectory_sources()
    if not any(s.files() or (s.folder is not None and s.folder.is_dir()) for s in sources):
        raise RunTargetError(
            f"{reader.target}: has no trajectories: no trajectories/ folder and no evaluation trajectories. "
            "Train with save_trajectories on (PPOConfig / GRPORunConfig save_trajectories: true) so the run "
            "writes trajectories/step-*.jsonl.gz, or run `searchrl eval --run RUN` (it writes "
            "RUN/eval/*.trajectories.jsonl.gz); or pass a trajectories file"
        )
    return reader


def _finite(x: Any) -> float | None:
    """JSON has no NaN/inf: such numbers travel as null."""
    if x is None:
        return None
    x = float(x)
    return x + 0.0 if math.isfinite(x) else None  # + 0.0 turns -0.0 into 0.0 for display


class RunData:
    """Reads a target's trajectory sources, re-reading a file only when it changed (a live run grows)."""

    def __init__(self, target: str | Path) -> None:
        self.reader = check_run_dir(target)
        self.root = self.reader.target
        self._files: dict[Path, tuple[float, list[Entry]]] = {}
        self._lock = threading.Lock()
        self._tokenizer: Any = None
        self._tokenizer_source: str | None = None
        self._tokenizer_tried = False

    # -- sources and trajectories -----------------------------------------------------------------
    def sources(self) -> list[TrajectorySource]:
        """Listed again on every call: a live run's first trajectories or a new evaluation appear."""
        return self.reader.trajectory_sources()

    def source(self, source_id: str | None) -> TrajectorySource:
        """The source named `source_id` (the first one when None); KeyError naming the ids otherwise."""
        sources = self.sources()
        if source_id is None:
            return sources[0]
        for s in sources:
            if s.id == source_id:
                return s
        raise KeyError(source_id)

    def entries(self, source_id: str | None = None) -> list[Entry]:
        source = self.source(source_id)
        out: list[Entry] = []
        with self._lock:
            for path in source.files():
                out.extend(self._read_file(path, source))
        return out

    def _read_file(self, path: Path, source: TrajectorySource) -> list[Entry]:
        mtime = path.stat().st_mtime
        cached = self._files.get(path)
        if cached is not None and cached[0] == mtime and all(e.source == source.id for e in cached[1]):
            return cached[1]
        file_step = step_of(path.name)
        entries = []
        for i, traj in enumerate(read_trajectories(path)):
            raw = traj.metadata.get("step", file_step)
            step = int(raw) if raw is not None else None
            key = f"{step}-{i}" if step is not None else str(i)
            entries.append(Entry(key=key, step=step, index=i, file=path.name, traj=traj, source=source.id))
        self._files[path] = (mtime, entries)
        return entries

    def get(self, key: str, source_id: str | None = None) -> Entry:
        for entry in self.entries(source_id):
            if entry.key == key:
                return entry
        raise KeyError(key)

    # -- tokenizer -------------------------------------------------------------------------------
    def tokenizer(self) -> Any:
        """The run's tokenizer (local files only, `RunReader.tokenizer_dir`), or None when it has none."""
        if not self._tokenizer_tried:
            self._tokenizer_tried = True
            path = self.reader.tokenizer_dir()
            if path is not None:
                from transformers import AutoTokenizer

                self._tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
                base = self.reader.demo_root or self.reader.root
                try:
                    self._tokenizer_source = str(path.relative_to(base)) if base is not None else str(path)
                except ValueError:
                    self._tokenizer_source = str(path)
        return self._tokenizer

    @property
    def tokenizer_source(self) -> str | None:
        self.tokenizer()
        return self._tokenizer_source


# -- what the API returns ----------------------------------------------------------------------------


def is_correct(traj: Trajectory) -> bool:
    return bool(traj.golds) and exact_match(traj.answer or "", traj.golds) == 1.0


def summary_row(entry: Entry) -> dict[str, Any]:
    t = entry.traj
    return {
        "key": entry.key,
        "source": entry.source,
        "step": entry.step,
        "index": entry.index,
        "id": t.id,
        "question": t.question,
        "golds": t.golds,
        "answer": t.answer,
        "reward": _finite(t.reward),
        "correct": is_correct(t),
        "termination": t.termination,
        "num_turns": t.num_turns,
        "num_tool_calls": len(t.tool_calls),
        "failed_tool_calls": sum(1 for c in t.tool_calls if c.status != "ok"),
        "denied_tool_calls": denied_calls(t),
        "num_tokens": len(t.input_ids),
        "num_action_tokens": t.num_action_tokens,
        "injection_attempts": int(t.metadata.get("injection_attempts", 0) or 0),
    }


def denied_calls(traj: Trajectory) -> int:
    """Tool calls refused for the episode's principal (acting beyond its authority)."""
    return sum(1 for c in traj.tool_calls if c.status == "permission_denied")


def per_token(traj: Trajectory, name: str) -> list[float | None]:
    values = traj.metadata.get(name)
    n = len(traj.input_ids)
    if not isinstance(values, list):
        return [None] * n
    values = [_finite(v) for v in values[:n]]
    return values + [None] * (n - len(values))


def token_rows(traj: Trajectory, tokenizer: Any) -> list[dict[str, Any]]:
    kinds = token_kinds(traj, tokenizer)
    advantages, kls, values = (per_token(traj, k) for k in ("advantages", "kl", "values"))
    decode = _decoder(tokenizer) if tokenizer is not None else None
    texts = [decode(i) for i in traj.input_ids] if decode else _texts_from_spans(traj)
    rows = []
    for i, token_id in enumerate(traj.input_ids):
        rows.append(
            {
                "i": i,
                "id": int(token_id),
                "text": texts[i],
                "kind": kinds[i],
                "logprob": _finite(traj.logprobs[i]) if i < len(traj.logprobs) else None,
                "advantage": advantages[i],
                "kl": kls[i],
                "value": values[i],
            }
        )
    return rows


def _decoder(tokenizer: Any):
    @lru_cache(maxsize=65536)
    def decode(token_id: int) -> str:
        return tokenizer.decode([token_id], skip_special_tokens=False, clean_up_tokenization_spaces=False)

    return decode


def _texts_from_spans(traj: Trajectory) -> list[str]:
    """Without a tokenizer: each span's text on its first token, the id on the others."""
    texts = [f"⟨{i}⟩" for i in traj.input_ids]
    for span in traj.spans:
        if span.text and 0 <= span.start < len(texts):
            texts[span.start] = span.text
            for i in range(span.start + 1, min(span.end, len(texts))):
                texts[i] = ""
    return texts


def detail(entry: Entry, tokenizer: Any) -> dict[str, Any]:
    t = entry.traj
    score_index = t.last_action_index
    return {
        **summary_row(entry),
        "file": entry.file,
        "citations": t.citations,
        "final_text": t.final_text,
        "reward_breakdown": {k: _finite(v) for k, v in t.reward_breakdown.items()},
        "score_index": score_index if score_index >= 0 else None,
        "has_ppo_values": isinstance(t.metadata.get("advantages"), list),
        "tool_calls": [
            {
                "name": c.name,
                "arguments": c.arguments,
                "status": c.status,
                "latency_ms": _finite(c.latency_ms),
                "doc_ids": c.doc_ids,
                "error": c.error,
                "turn_index": c.turn_index,
            }
            for c in t.tool_calls
        ],
        "spans": [{"kind": s.kind, "start": s.start, "end": s.end} for s in t.spans],
        "tokens": token_rows(t, tokenizer),
    }


def matches(
    entry: Entry,
    step: int | None,
    min_reward: float | None,
    max_reward: float | None,
    correct: str | None,
    termination: str | None,
    text: str | None,
    denied: str | None = None,
) -> bool:
    t = entry.traj
    if step is not None and entry.step != step:
        return False
    reward = t.reward if t.reward is not None else float("nan")
    if min_reward is not None and not reward >= min_reward:
        return False
    if max_reward is not None and not reward <= max_reward:
        return False
    if correct is not None and is_correct(t) != (correct == "yes"):
        return False
    if termination is not None and t.termination != termination:
        return False
    if denied is not None and (denied_calls(t) > 0) != (denied == "yes"):
        return False
    if text:
        needle = text.lower()
        haystack = " ".join([t.question, t.answer or "", t.id, " ".join(t.golds)]).lower()
        if needle not in haystack:
            return False
    return True


# -- the app -------------------------------------------------------------------------------------------


def _static(name: str) -> bytes:
    return resources.files("searchrl.viewer").joinpath("static", name).read_bytes()


def create_app(target: str | Path) -> FastAPI:
    """The viewer app over `target` (checked at once: a bad path fails here, not on first request)."""
    data = RunData(target)
    data.tokenizer()  # load it now (importing transformers takes seconds), not inside the first request
    app = FastAPI(title="searchrl trajectory viewer", version="1")
    app.state.data = data

    def pick(source: str | None) -> TrajectorySource:
        try:
            return data.source(source or None)
        except KeyError:
            ids = [s.id for s in data.sources()]
            raise HTTPException(
                422, f"source={source!r}: use one of {', '.join(ids)} (see /api/summary)"
            ) from None

    source_query = Query(None, description="Trajectory source id from /api/summary (default: the first).")

    @app.get("/", include_in_schema=False)
    def index() -> Response:
        return Response(_static("index.html"), media_type=STATIC_FILES["index.html"])

    @app.get("/static/{name}", include_in_schema=False)
    def static(name: str) -> Response:
        if name not in STATIC_FILES:
            raise HTTPException(404, f"no static file {name!r}")
        return Response(_static(name), media_type=STATIC_FILES[name])

    @app.get("/health")
    def health() -> dict[str, str]:
        return {"status": "ok", "run": str(data.root)}

    @app.get("/api/summary")
    def summary(source: str | None = source_query) -> dict[str, Any]:
        chosen = pick(source)
        entries = data.entries(chosen.id)
        rewards = [e.traj.reward for e in entries if e.traj.reward is not None]
        return {
            "run": data.root.name,
            "path": str(data.root),
            "kind": data.reader.kind,
            "trainer": data.reader.trainer,
            "sources": [
                {"id": s.id, "label": s.label, "kind": s.kind, "files": len(s.files())}
                for s in data.sources()
            ],
            "source": {
                "id": chosen.id,
                "label": chosen.label,
                "kind": chosen.kind,
                "trainer": chosen.trainer,
            },
            "num_trajectories": len(entries),
            "steps": sorted({e.step for e in entries if e.step is not None}),
            "terminations": [r for r in TERMINATION_REASONS if any(e.traj.termination == r for e in entries)],
            "all_terminations": list(TERMINATION_REASONS),
            "reward_min": _finite(min(rewards)) if rewards else None,
            "reward_max": _finite(max(rewards)) if rewards else None,
            "correct": sum(1 for e in entries if is_correct(e.traj)),
            "tokenizer": data.tokenizer_source,
        }

    @app.get("/api/trajectories")
    def list_trajectories(
        source: str | None = source_query,
        step: int | None = Query(None, description="Only this training step."),
        min_reward: float | None = Query(None, description="Only rewards >= this."),
        max_reward: float | None = Query(None, description="Only rewards <= this."),
        correct: str | None = Query(None, description="'yes' or 'no': exact match against the golds."),
        termination: str | None = Query(None, description=f"One of {', '.join(TERMINATION_REASONS)}."),
        denied: str | None = Query(None, description="'yes' or 'no': a tool call was permission-denied."),
        q: str | None = Query(None, description="Text in the question, answer, id or golds."),
        limit: int = Query(500, ge=1, le=10000, description="Most rows to return."),
    ) -> dict[str, Any]:
        chosen = pick(source)
        correct = correct or None
        termination = termination or None
        if correct is not None and correct not in CORRECT_CHOICES:
            raise HTTPException(422, f"correct={correct!r}: use 'yes' or 'no' (or leave it out)")
        denied = denied or None
        if denied is not None and denied not in CORRECT_CHOICES:
            raise HTTPException(422, f"denied={denied!r}: use 'yes' or 'no' (or leave it out)")
        if termination is not None and termination not in TERMINATION_REASONS:
            raise HTTPException(
                422, f"termination={termination!r}: use one of {', '.join(TERMINATION_REASONS)}"
            )
        hits = [
            e
            for e in data.entries(chosen.id)
            if matches(e, step, min_reward, max_reward, correct, termination, q, denied)
        ]
        return {"total": len(hits), "source": chosen.id, "rows": [summary_row(e) for e in hits[:limit]]}

    @app.get("/api/trajectories/{key}")
    def one_trajectory(key: str, source: str | None = source_query) -> dict[str, Any]:
        chosen = pick(source)
        try:
            entry = data.get(key, chosen.id)
        except KeyError:
            raise HTTPException(
                404,
                f"no trajectory {key!r} in source {chosen.id!r}; keys look like STEP-INDEX (training) or INDEX "
                f"(an evaluation), see /api/trajectories?source={chosen.id}",
            ) from None
        return detail(entry, data.tokenizer())

    @app.exception_handler(HTTPException)
    async def _http_error(_: Any, exc: HTTPException) -> JSONResponse:
        return JSONResponse({"error": str(exc.detail), "detail": exc.detail}, status_code=exc.status_code)

    return app


def serve(target: str | Path, host: str = "127.0.0.1", port: int = 8765, log_level: str = "warning") -> None:
    """Serve the viewer over `target` (a run, a demo or a trajectories file) with uvicorn until interrupted."""
    import uvicorn

    app = create_app(target)
    uvicorn.run(app, host=host, port=port, log_level=log_level, access_log=False, loop="asyncio", http="h11")
