"""Real questions over their own Wikipedia paragraphs: HotpotQA (distractor) and SQuAD v1.1, offline.

The synthetic task proves the loop learns; these slices check it on real text. Two small slices ship in the
repository's `data/realqa/` (CC BY-SA 4.0, see the README there), in their official formats, so nothing is
fetched at run time:

- HotpotQA dev, distractor setting: a JSON list of items `{"_id", "question", "answer", "type", "level",
  "supporting_facts": [[title, sentence_index], ...], "context": [[title, [sentence, ...]], ...]}`;
- SQuAD v1.1: `{"data": [{"title", "paragraphs": [{"context", "qas": [{"id", "question",
  "answers": [{"text", "answer_start"}]}]}]}]}`.

What the loaders make of them:

- a corpus with one document per paragraph, `{"id", "title", "contents"}` (the corpus schema of
  `searchrl.search.corpus`: `contents` is the body, the title has its own field). A HotpotQA paragraph is
  its sentences joined as given (they carry their own leading spaces). Paragraphs with the same title and
  text are one document however many questions list them; the id is a hash of title and text
  (`hotpot-<12 hex>`, `squad-<12 hex>`), so it does not depend on question or file order. SQuAD titles
  are shown with spaces for underscores ("Super_Bowl_50" -> "Super Bowl 50").
- question rows in searchrl's schema: `id` (the dataset's), `question`, `golds` (every distinct answer
  string), `hops` (the number of supporting paragraphs: 2 for HotpotQA, 1 for SQuAD),
  `supporting_doc_ids` (the documents holding the supporting facts, in the order the facts name them; the
  SQuAD paragraph), `supporting_titles`, `type` (bridge / comparison / squad), `source` (hotpotqa / squad)
  and, for HotpotQA, `level`.

How a test question stays unseen in training (`split_questions`). The unit of splitting is a group of
questions that share a key: for SQuAD the article (its title), for HotpotQA a supporting paragraph.
SQuAD asks five or so questions about each paragraph and an article's paragraphs share their facts, so a
split by question would train on the very paragraph a test question is about; split by article, no test
question's paragraph, nor any paragraph of its article, is the subject of a training question. HotpotQA
questions each have their own two supporting paragraphs, so its unit is the question, except that
questions sharing a supporting paragraph are kept together (none of the shipped 53 do; `meta.json` counts
dev/test questions whose supporting document a train question also uses: 0 by construction). Units are
ranked by sha256(seed, source, name), the name being the article title (SQuAD) or the smallest question
id of the unit (HotpotQA), so the assignment depends on the seed and the data only, never on file order.
In that order test takes units while each brings it closer to `test_fraction` of the questions (whole
units, so for SQuAD's ~200-question articles the fraction is approximate), then dev to `dev_fraction`,
and train keeps the rest.

The retrieval corpus is shared by all splits, as in Search-R1, whose wiki-18 corpus serves training and
test alike: the corpus is the environment the policy searches, not a training signal. Training updates
come from train questions, their golds and the rewards on them; no dev or test question, nor its
supporting-document labels, is ever trained on. That a test paragraph can be retrieved during a training
episode is what happens with any real search engine; a policy that memorises the corpus instead of
searching it shows up as closed-book accuracy (evaluate with a search engine that finds nothing), which
hiding documents would not prevent. HotpotQA's distractor paragraphs stay in the corpus too: each
question's ten paragraphs are all searchable.

Bad files fail with `DatasetError` naming the file, the item (index and id) and the field, and saying what
was expected, because a malformed 100 MB dump is otherwise impossible to debug.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

from searchrl.common.io import atomic_write_json, write_jsonl
from searchrl.data.datasets import DatasetError
from searchrl.search.base import Backend
from searchrl.search.corpus import join_search_r1_contents

SOURCES: tuple[str, ...] = ("hotpotqa", "squad")
SPLITS: tuple[str, ...] = ("train", "dev", "test")
CORPUS_FORMATS: tuple[str, ...] = ("searchrl", "search-r1")
META_FORMAT = "searchrl-realqa/1"

# The repository's data/realqa/, next to the package when searchrl runs from its checkout.
REALQA_DIR = Path(__file__).resolve().parents[2] / "data" / "realqa"
SHIPPED_FILES: dict[str, str] = {
    "hotpotqa": "hotpot_dev_distractor_v1-first53.json",
    "squad": "squad-v1.1-dev-20articles.json",
}
LICENCE = "CC BY-SA 4.0 (Wikipedia text); keep the attribution with any copy"
ATTRIBUTION: dict[str, str] = {
    "hotpotqa": (
        "Yang et al., 2018, HotpotQA: A Dataset for Diverse, Explainable Multi-hop Question Answering "
        "(dev, distractor setting)"
    ),
    "squad": "Rajpurkar et al., 2016, SQuAD: 100,000+ Questions for Machine Comprehension of Text (v1.1 dev)",
}
_DOC_PREFIX = {"hotpotqa": "hotpot", "squad": "squad"}
# The row field whose values tie questions into one split unit.
_UNIT_KEY = {"hotpotqa": "supporting_doc_ids", "squad": "supporting_titles"}
SPLIT_RULES: dict[str, str] = {
    "hotpotqa": (
        "by question; questions sharing a supporting paragraph stay in one split; units ranked by "
        "sha256(seed, source, smallest question id of the unit)"
    ),
    "squad": (
        "by article (title): all questions on an article's paragraphs stay in one split; articles ranked "
        "by sha256(seed, source, article title)"
    ),
}
HOTPOT_NEEDS = (
    "HotpotQA's official format is a JSON list of items with _id, question, answer, type, "
    "supporting_facts ([title, sentence index] pairs) and context ([title, [sentences]] pairs)"
)
SQUAD_NEEDS = (
    'SQuAD v1.1\'s official format is {"data": [{"title", "paragraphs": [{"context", "qas": '
    '[{"id", "question", "answers": [{"text", "answer_start"}]}]}]}]}'
)


# -- parsed sources ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RealQASource:
    """One or more files of one dataset, parsed: the de-duplicated corpus and the question rows.

    `documents` are corpus rows `{"id", "title", "contents"}` sorted by id; `questions` are searchrl QA
    rows in file order; `files` lists `{"name", "sha256"}` of the files read; `paragraph_slots` counts the
    paragraphs before de-duplication (a HotpotQA paragraph is listed once per question that carries it).
    """

    source: str
    documents: list[dict[str, str]]
    questions: list[dict[str, Any]]
    files: list[dict[str, str]] = field(default_factory=list)
    paragraph_slots: int = 0


def doc_id(source: str, title: str, text: str) -> str:
    """The stable id of a paragraph: the source's prefix and 12 hex digits of sha256(title, text)."""
    digest = hashlib.sha256(f"{title}\x00{text}".encode()).hexdigest()[:12]
    return f"{_DOC_PREFIX[source]}-{digest}"


def _show(value: Any, limit: int = 60) -> str:
    text = repr(value)
    text = text if len(text) <= limit else text[: limit - 3] + "..."
    return f"{type(value).__name__} {text}"


def _fail(loc: str, name: str, problem: str, expected: str) -> NoReturn:
    raise DatasetError(f"{loc}: field {name!r}: {problem}; expected {expected}")


def _text(obj: dict[str, Any], key: str, loc: str, expected: str) -> str:
    if key not in obj or obj[key] is None:
        _fail(loc, key, "missing", expected)
    value = obj[key]
    if not isinstance(value, str) or not value.strip():
        _fail(loc, key, f"got {_show(value)}", expected)
    return value


def _list(obj: dict[str, Any], key: str, loc: str, expected: str) -> list[Any]:
    if key not in obj or obj[key] is None:
        _fail(loc, key, "missing", expected)
    value = obj[key]
    if not isinstance(value, list) or not value:
        _fail(loc, key, f"got {_show(value)}", expected)
    return value


class _Corpus:
    """Documents by id; the same (title, text) twice is one document, a hash collision is an error."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.docs: dict[str, dict[str, str]] = {}
        self.slots = 0

    def add(self, title: str, text: str, loc: str) -> str:
        did = doc_id(self.source, title, text)
        self.slots += 1
        old = self.docs.get(did)
        if old is None:
            self.docs[did] = {"id": did, "title": title, "contents": text}
        elif (old["title"], old["contents"]) != (title, text):  # 48-bit collision: never seen, never ignored
            raise DatasetError(f"{loc}: paragraph {title!r} hashes to the id {did} of another paragraph")
        return did

    def rows(self) -> list[dict[str, str]]:
        return [self.docs[k] for k in sorted(self.docs)]


def _read_json(path: Path) -> tuple[Any, str]:
    """The parsed file and the sha256 of its bytes; unreadable files fail with line and column."""
    if not path.is_file():
        raise DatasetError(f"{path}: file not found")
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise DatasetError(
            f"{path}: not UTF-8 text (bad byte at offset {e.start}); expected a JSON file"
        ) from e
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as e:
        raise DatasetError(
            f"{path}: not valid JSON at line {e.lineno}, column {e.colno}: {e.msg}; "
            f"expected the official HotpotQA or SQuAD v1.1 JSON file"
        ) from e
    return obj, hashlib.sha256(raw).hexdigest()


def _top_kind(obj: Any) -> str:
    return "list" if isinstance(obj, list) else "object" if isinstance(obj, dict) else type(obj).__name__


def detect_format(obj: Any) -> str | None:
    """'hotpotqa' for a JSON list, 'squad' for an object with 'data', else None."""
    if isinstance(obj, list):
        return "hotpotqa"
    if isinstance(obj, dict) and "data" in obj:
        return "squad"
    return None


# -- HotpotQA ---------------------------------------------------------------------------------------------


def _hotpot_context(item: dict[str, Any], loc: str, corpus: _Corpus) -> dict[str, tuple[list[str], str]]:
    """title -> (sentences, doc id) for one item's ten paragraphs, adding each to the corpus."""
    context = _list(item, "context", loc, "a non-empty list of [title, [sentences]] pairs")
    paragraphs: dict[str, tuple[list[str], str]] = {}
    for j, pair in enumerate(context):
        name = f"context[{j}]"
        if not isinstance(pair, list) or len(pair) != 2:
            _fail(loc, name, f"got {_show(pair)}", "a [title, [sentences]] pair")
        title, sentences = pair
        if not isinstance(title, str) or not title.strip():
            _fail(loc, f"{name}[0]", f"got {_show(title)}", "the paragraph's title, a non-empty string")
        if title in paragraphs:
            _fail(
                loc,
                f"{name}[0]",
                f"title {title!r} appears twice in this item's context",
                "each title once (supporting facts name paragraphs by title)",
            )
        if not isinstance(sentences, list) or not sentences or not all(isinstance(s, str) for s in sentences):
            _fail(loc, f"{name}[1]", f"got {_show(sentences)}", "a non-empty list of sentence strings")
        text = "".join(sentences)
        if not text.strip():
            _fail(loc, f"{name}[1]", "every sentence is empty", "the paragraph's sentences")
        paragraphs[title] = (sentences, corpus.add(title, text, f"{loc}: {name}"))
    return paragraphs


def _hotpot_support(
    item: dict[str, Any], loc: str, paragraphs: dict[str, tuple[list[str], str]]
) -> list[str]:
    """The supporting titles in the order the facts first name them; each fact checked against context."""
    facts = _list(item, "supporting_facts", loc, "a non-empty list of [title, sentence index] pairs")
    titles: list[str] = []
    for j, fact in enumerate(facts):
        name = f"supporting_facts[{j}]"
        if not isinstance(fact, list) or len(fact) != 2:
            _fail(loc, name, f"got {_show(fact)}", "a [title, sentence index] pair")
        title, index = fact
        if not isinstance(title, str):
            _fail(
                loc, f"{name}[0]", f"got {_show(title)}", "the title of one of the item's context paragraphs"
            )
        if title not in paragraphs:
            shown = ", ".join(repr(t) for t in list(paragraphs)[:10])
            _fail(
                loc,
                f"{name}[0]",
                f"title {title!r} is not in this item's context (its titles: {shown})",
                "the title of one of the item's context paragraphs",
            )
        if isinstance(index, bool) or not isinstance(index, int):
            _fail(loc, f"{name}[1]", f"got {_show(index)}", "a sentence index (an integer)")
        n = len(paragraphs[title][0])
        if not 0 <= index < n:
            _fail(
                loc,
                f"{name}[1]",
                f"sentence index {index} is out of range: paragraph {title!r} has {n} sentences",
                f"an index from 0 to {n - 1}",
            )
        if title not in titles:
            titles.append(title)
    return titles


def hotpotqa_from_items(items: Any, where: str = "<hotpotqa>") -> RealQASource:
    """Parse HotpotQA items already in memory (`where` names them in errors); see `load_hotpotqa`."""
    if not isinstance(items, list):
        hint = (
            " (this looks like a SQuAD file: use source 'squad')" if detect_format(items) == "squad" else ""
        )
        raise DatasetError(
            f"{where}: the top level is a JSON {_top_kind(items)}, expected a JSON list of question "
            f"objects{hint}; {HOTPOT_NEEDS}"
        )
    if not items:
        raise DatasetError(f"{where}: the list is empty; {HOTPOT_NEEDS}")
    corpus = _Corpus("hotpotqa")
    questions: list[dict[str, Any]] = []
    seen: dict[str, int] = {}
    for i, item in enumerate(items):
        loc = f"{where}: item {i}"
        if not isinstance(item, dict):
            raise DatasetError(f"{loc}: expected a JSON object, got {_show(item)}; {HOTPOT_NEEDS}")
        qid = _text(item, "_id", loc, "the question id, a non-empty string")
        loc = f"{where}: item {i} (_id {qid!r})"
        if qid in seen:
            _fail(loc, "_id", f"repeated (item {seen[qid]} has the same id)", "a unique question id")
        seen[qid] = i
        question = _text(item, "question", loc, "the question, a non-empty string")
        answer = _text(
            item, "answer", loc, "the answer, a non-empty string (yes/no questions say 'yes' or 'no')"
        )
        qtype = item.get("type")
        if qtype not in ("bridge", "comparison"):
            _fail(
                loc, "type", "missing" if qtype is None else f"got {_show(qtype)}", "'bridge' or 'comparison'"
            )
        level = item.get("level")
        if level is not None and not isinstance(level, str):
            _fail(loc, "level", f"got {_show(level)}", "'easy', 'medium' or 'hard'")
        paragraphs = _hotpot_context(item, loc, corpus)
        titles = _hotpot_support(item, loc, paragraphs)
        row: dict[str, Any] = {
            "id": qid,
            "question": question.strip(),
            "golds": [answer.strip()],
            "hops": len(titles),
            "supporting_doc_ids": [paragraphs[t][1] for t in titles],
            "type": qtype,
            "supporting_titles": titles,
            "source": "hotpotqa",
        }
        if level is not None:
            row["level"] = level
        questions.append(row)
    return RealQASource("hotpotqa", corpus.rows(), questions, paragraph_slots=corpus.slots)


def load_hotpotqa(path: str | Path) -> RealQASource:
    """Read a HotpotQA file (official JSON list; distractor or gold-paragraph setting)."""
    return _source_of_file("hotpotqa", Path(path))


# -- SQuAD v1.1 ------------------------------------------------------------------------------------------


def _squad_golds(qa: dict[str, Any], loc: str, context: str) -> list[str]:
    answers = _list(qa, "answers", loc, 'a non-empty list of {"text", "answer_start"} objects')
    golds: list[str] = []
    for k, answer in enumerate(answers):
        name = f"answers[{k}]"
        if not isinstance(answer, dict):
            _fail(loc, name, f"got {_show(answer)}", 'an object {"text", "answer_start"}')
        text = answer.get("text")
        if text is None:
            _fail(loc, f"{name}.text", "missing", "the answer text, a non-empty string")
        if not isinstance(text, str) or not text.strip():
            _fail(loc, f"{name}.text", f"got {_show(text)}", "the answer text, a non-empty string")
        start = answer.get("answer_start")
        if start is not None and (isinstance(start, bool) or not isinstance(start, int) or start < 0):
            _fail(loc, f"{name}.answer_start", f"got {_show(start)}", "a character offset (an integer >= 0)")
        if text.strip() not in context:
            _fail(loc, f"{name}.text", f"{text!r} does not occur in the paragraph", "a span of the paragraph")
        if text.strip() not in golds:
            golds.append(text.strip())
    return golds


def squad_from_object(obj: Any, where: str = "<squad>") -> RealQASource:
    """Parse a SQuAD v1.1 object already in memory (`where` names it in errors); see `load_squad`."""
    if not isinstance(obj, dict) or "data" not in obj:
        hint = " (this looks like a HotpotQA file: use source 'hotpotqa')" if isinstance(obj, list) else ""
        raise DatasetError(
            f"{where}: the top level is a JSON {_top_kind(obj)}"
            f"{' without a data field' if isinstance(obj, dict) else ''}, expected an object with "
            f"'data'{hint}; {SQUAD_NEEDS}"
        )
    data = _list(obj, "data", where, "a non-empty list of articles")
    corpus = _Corpus("squad")
    questions: list[dict[str, Any]] = []
    seen: dict[str, str] = {}
    for a, article in enumerate(data):
        loc = f"{where}: data[{a}]"
        if not isinstance(article, dict):
            raise DatasetError(f"{loc}: expected an article object, got {_show(article)}; {SQUAD_NEEDS}")
        raw_title = _text(article, "title", loc, "the article's title, a non-empty string")
        title = raw_title.replace("_", " ").strip()
        loc = f"{where}: data[{a}] (title {raw_title!r})"
        paragraphs = _list(article, "paragraphs", loc, 'a non-empty list of {"context", "qas"} objects')
        for p, paragraph in enumerate(paragraphs):
            ploc = f"{loc} paragraphs[{p}]"
            if not isinstance(paragraph, dict):
                raise DatasetError(
                    f"{ploc}: expected a paragraph object, got {_show(paragraph)}; {SQUAD_NEEDS}"
                )
            context = _text(paragraph, "context", ploc, "the paragraph text, a non-empty string")
            did = corpus.add(title, context, ploc)
            qas = paragraph.get("qas")
            if not isinstance(qas, list):
                _fail(ploc, "qas", "missing" if qas is None else f"got {_show(qas)}", "a list of questions")
            for q, qa in enumerate(qas):
                qloc = f"{ploc} qas[{q}]"
                if not isinstance(qa, dict):
                    raise DatasetError(f"{qloc}: expected a question object, got {_show(qa)}; {SQUAD_NEEDS}")
                qid = _text(qa, "id", qloc, "the question id, a non-empty string")
                qloc = f"{ploc} qas[{q}] (id {qid!r})"
                if qid in seen:
                    _fail(qloc, "id", f"repeated (also at {seen[qid]})", "a unique question id")
                seen[qid] = f"data[{a}] paragraphs[{p}] qas[{q}]"
                question = _text(qa, "question", qloc, "the question, a non-empty string")
                questions.append(
                    {
                        "id": qid,
                        "question": question.strip(),
                        "golds": _squad_golds(qa, qloc, context),
                        "hops": 1,
                        "supporting_doc_ids": [did],
                        "type": "squad",
                        "supporting_titles": [title],
                        "source": "squad",
                    }
                )
    if not questions:
        raise DatasetError(f"{where}: no questions in any paragraph; {SQUAD_NEEDS}")
    return RealQASource("squad", corpus.rows(), questions, paragraph_slots=corpus.slots)


def load_squad(path: str | Path) -> RealQASource:
    """Read a SQuAD v1.1 file (official JSON; v2.0 files load too, but unanswerable questions fail)."""
    return _source_of_file("squad", Path(path))


# -- several files, default files ------------------------------------------------------------------------


def _source_of_file(kind: str, path: Path, read: tuple[Any, str] | None = None) -> RealQASource:
    """One file parsed as `kind` ('hotpotqa' or 'squad'), with its name and sha256; `read` is what
    `_read_json(path)` returned, when the caller has read it already."""
    obj, sha = read if read is not None else _read_json(path)
    parse = hotpotqa_from_items if kind == "hotpotqa" else squad_from_object
    parsed = parse(obj, str(path))
    return RealQASource(
        kind, parsed.documents, parsed.questions, [{"name": path.name, "sha256": sha}], parsed.paragraph_slots
    )


def shipped_file(source: str) -> Path:
    """The repository's slice for `source`, or a DatasetError saying to pass the file explicitly."""
    if source not in SHIPPED_FILES:
        raise DatasetError(f"unknown source {source!r}; choose one of {', '.join(SOURCES)}")
    path = REALQA_DIR / SHIPPED_FILES[source]
    if not path.is_file():
        raise DatasetError(
            f"{path}: the shipped {source} slice is not here (searchrl is installed outside its repository, "
            f"which holds data/realqa/); pass the file explicitly (--files PATH, or files=[...])"
        )
    return path


def _merge(source: str, parts: Sequence[RealQASource]) -> RealQASource:
    docs: dict[str, dict[str, str]] = {}
    questions: list[dict[str, Any]] = []
    seen: dict[str, str] = {}
    for part in parts:
        for d in part.documents:
            docs.setdefault(d["id"], d)
        for row in part.questions:
            where = part.files[0]["name"] if part.files else source
            if row["id"] in seen:
                raise DatasetError(
                    f"{where}: question id {row['id']!r} is also in {seen[row['id']]}; ids must be unique "
                    f"across the files of one run"
                )
            seen[row["id"]] = where
            questions.append(row)
    return RealQASource(
        source,
        [docs[k] for k in sorted(docs)],
        questions,
        [f for p in parts for f in p.files],
        sum(p.paragraph_slots for p in parts),
    )


def load_sources(source: str = "both", files: Iterable[str | Path] | None = None) -> dict[str, RealQASource]:
    """Parse the files for `source` ('hotpotqa', 'squad' or 'both'), keyed by dataset.

    Without `files`, the repository's shipped slices. With `files`, each file's dataset is told by its top
    level (a list is HotpotQA, an object with 'data' is SQuAD); files of one dataset are merged.
    """
    wanted = list(SOURCES) if source == "both" else [source]
    if source != "both" and source not in SOURCES:
        raise DatasetError(f"unknown source {source!r}; choose hotpotqa, squad or both")
    paths = [shipped_file(s) for s in wanted] if files is None else [Path(f) for f in files]
    if not paths:
        raise DatasetError("no input files given")
    parts: dict[str, list[RealQASource]] = {s: [] for s in wanted}
    for path in paths:
        obj, sha = _read_json(path)
        kind = detect_format(obj) if source == "both" else source
        if kind is None:
            raise DatasetError(
                f"{path}: the top level is a JSON {_top_kind(obj)}, which is neither HotpotQA (a list of "
                f"questions) nor SQuAD (an object with 'data'); {HOTPOT_NEEDS}; {SQUAD_NEEDS}"
            )
        parts[kind].append(_source_of_file(kind, path, (obj, sha)))
    missing = [s for s in wanted if not parts[s]]
    if missing:
        raise DatasetError(
            f"source {source!r} needs a {' and a '.join(missing)} file too; the files given "
            f"({', '.join(p.name for p in paths)}) hold only {', '.join(s for s in wanted if parts[s])}"
        )
    return {s: _merge(s, parts[s]) for s in wanted}


# -- splits -----------------------------------------------------------------------------------------------


def _rank(seed: int, source: str, key: str) -> str:
    return hashlib.sha256(f"{seed}\x00{source}\x00{key}".encode()).hexdigest()


def split_units(rows: Sequence[dict[str, Any]], source: str) -> list[list[dict[str, Any]]]:
    """Questions grouped into split units: connected by a shared key (`_UNIT_KEY[source]`) of their rows.

    SQuAD: rows sharing an article title; HotpotQA: rows sharing a supporting paragraph. Each unit's rows
    keep their input order; units come out in no particular order (callers rank them).
    """
    parent: dict[str, str] = {}

    def find(x: str) -> str:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    key_owner: dict[str, str] = {}
    for row in rows:
        parent.setdefault(row["id"], row["id"])
        for key in row[_UNIT_KEY[source]]:
            if key in key_owner:
                a, b = find(row["id"]), find(key_owner[key])
                if a != b:
                    parent[max(a, b)] = min(a, b)
            else:
                key_owner[key] = row["id"]
    units: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        units.setdefault(find(row["id"]), []).append(row)
    return list(units.values())


def _unit_name(unit: Sequence[dict[str, Any]], source: str) -> str:
    """What a unit is ranked by: its article title (SQuAD), its smallest question id (HotpotQA)."""
    if source == "squad":
        return min(t for r in unit for t in r["supporting_titles"])
    return min(r["id"] for r in unit)


def _check_fraction(name: str, value: float) -> None:
    if not 0.0 <= value < 1.0:
        raise ValueError(f"{name} must be in [0, 1), got {value}")


def split_questions(
    rows: Sequence[dict[str, Any]],
    source: str,
    seed: int = 0,
    dev_fraction: float = 0.1,
    test_fraction: float = 0.2,
    max_sizes: dict[str, int | None] | None = None,
) -> dict[str, list[dict[str, Any]]]:
    """train / dev / test rows of one dataset, by whole units (see the module docstring for the rule).

    Deterministic from `seed` and the question ids: input order changes nothing, rows inside a split are
    ordered by sha256(seed, id). A fraction above 0 gets at least one unit. `max_sizes` caps a split's
    question count (the first N in that order), e.g. `{"train": 500}`; the cap never moves a question
    to another split.
    """
    if source not in SOURCES:
        raise ValueError(f"unknown source {source!r}; choose one of {', '.join(SOURCES)}")
    _check_fraction("dev_fraction", dev_fraction)
    _check_fraction("test_fraction", test_fraction)
    if dev_fraction + test_fraction >= 1.0:
        raise ValueError(
            f"dev_fraction + test_fraction must leave questions for training, got {dev_fraction} + {test_fraction}"
        )
    units = split_units(rows, source)
    units.sort(key=lambda unit: _rank(seed, source, _unit_name(unit, source)))
    n = len(rows)
    splits: dict[str, list[dict[str, Any]]] = {s: [] for s in SPLITS}
    position = 0
    for split, fraction in (("test", test_fraction), ("dev", dev_fraction)):
        target = max(1, round(n * fraction)) if fraction > 0 else 0
        # In rank order, take a unit while it brings the split closer to its target (at least one unit).
        while target and position < len(units):
            size, have = len(units[position]), len(splits[split])
            if have and abs(have + size - target) >= abs(have - target):
                break
            splits[split].extend(units[position])
            position += 1
    for unit in units[position:]:
        splits["train"].extend(unit)
    if not splits["train"]:
        raise ValueError(
            f"{source}: {len(units)} split units ({n} questions) leave none for training with "
            f"dev_fraction {dev_fraction} and test_fraction {test_fraction}; lower the fractions"
        )
    for split in SPLITS:
        splits[split].sort(key=lambda r: _rank(seed, source, r["id"]))
        cap = (max_sizes or {}).get(split)
        if cap is not None:
            if cap < 1:
                raise ValueError(f"max size of {split} must be at least 1, got {cap}")
            del splits[split][cap:]
    return splits


# -- the task: corpus + splits + meta, written like the synthetic task ---------------------------------------


@dataclass
class RealQATask:
    """A real-question data set ready to write: corpus rows, question splits and provenance."""

    corpus: list[dict[str, str]]
    splits: dict[str, list[dict[str, Any]]]
    meta: dict[str, Any]

    def write(self, out_dir: str | Path, corpus_format: str = "searchrl") -> dict[str, Path]:
        """Write corpus.jsonl, train/dev/test.jsonl and meta.json (atomically, each); returns the paths.

        `corpus_format` "searchrl" writes `{"id", "title", "contents"}` with the body in `contents` (what
        `searchrl data synth` writes); "search-r1" writes Search-R1's `{"id", "contents": '"Title"\\ntext'}`,
        which Search-R1's own retriever reads too. `searchrl.search.corpus` reads both to the same documents.
        """
        if corpus_format not in CORPUS_FORMATS:
            raise ValueError(
                f"unknown corpus format {corpus_format!r}; choose one of {', '.join(CORPUS_FORMATS)}"
            )
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        rows: list[dict[str, str]] = self.corpus
        if corpus_format == "search-r1":
            rows = [
                {"id": d["id"], "contents": join_search_r1_contents(d["title"], d["contents"])} for d in rows
            ]
        paths = {"corpus": out / "corpus.jsonl"}
        write_jsonl(paths["corpus"], rows)
        for split in SPLITS:
            paths[split] = out / f"{split}.jsonl"
            write_jsonl(paths[split], self.splits[split])
        meta = dict(self.meta)
        meta["corpus_format"] = corpus_format
        meta["written_files_sha256"] = {
            p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in paths.values()
        }
        paths["meta"] = out / "meta.json"
        atomic_write_json(paths["meta"], meta)
        return paths


def _support_shared_with_train(splits: dict[str, list[dict[str, Any]]]) -> dict[str, int]:
    train_docs = {d for r in splits["train"] for d in r["supporting_doc_ids"]}
    return {
        s: sum(any(d in train_docs for d in r["supporting_doc_ids"]) for r in splits[s])
        for s in ("dev", "test")
    }


def build_realqa(
    source: str = "both",
    files: Iterable[str | Path] | None = None,
    seed: int = 0,
    dev_fraction: float = 0.1,
    test_fraction: float = 0.2,
    max_sizes: dict[str, int | None] | None = None,
) -> RealQATask:
    """Load `source` ('hotpotqa', 'squad' or 'both'), split each dataset by its rule, and join them.

    With 'both', each dataset is split on its own (HotpotQA by question, SQuAD by article) and the splits
    are joined, interleaved by sha256(seed, source, id); `max_sizes` caps each dataset's split. The corpus is the union,
    sorted by id. Question ids must be unique across datasets.
    """
    loaded = load_sources(source, files)
    splits: dict[str, list[dict[str, Any]]] = {s: [] for s in SPLITS}
    sources_meta: dict[str, Any] = {}
    corpus: dict[str, dict[str, str]] = {}
    owner: dict[str, str] = {}
    for name, data in loaded.items():
        for row in data.questions:
            if row["id"] in owner:
                raise DatasetError(f"question id {row['id']!r} is in both {owner[row['id']]} and {name}")
            owner[row["id"]] = name
        part = split_questions(data.questions, name, seed, dev_fraction, test_fraction, max_sizes)
        for split in SPLITS:
            splits[split].extend(part[split])
        for d in data.documents:
            corpus.setdefault(d["id"], d)
        units = {split: len(split_units(part[split], name)) for split in SPLITS}
        sources_meta[name] = {
            "files": data.files,
            "attribution": ATTRIBUTION[name],
            "questions": len(data.questions),
            "paragraphs_listed": data.paragraph_slots,
            "documents": len(data.documents),
            "split_rule": SPLIT_RULES[name],
            "split_questions": {split: len(part[split]) for split in SPLITS},
            "split_units": units,
            "types": {
                t: sum(r["type"] == t for r in data.questions)
                for t in sorted({r["type"] for r in data.questions})
            },
            "dev_test_questions_sharing_a_supporting_doc_with_train": _support_shared_with_train(part),
        }
    for split in SPLITS:  # the datasets interleaved, each in its own order (the key split_questions sorts by)
        splits[split].sort(key=lambda r: _rank(seed, r["source"], r["id"]))
    meta = {
        "format": META_FORMAT,
        "source": source,
        "seed": seed,
        "dev_fraction": dev_fraction,
        "test_fraction": test_fraction,
        "max_sizes": {s: (max_sizes or {}).get(s) for s in SPLITS},
        "licence": LICENCE,
        "corpus_rule": "one document per paragraph, shared by all splits; id = prefix + sha256(title, text)[:12]",
        "counts": {"documents": len(corpus), **{s: len(splits[s]) for s in SPLITS}},
        "sources": sources_meta,
    }
    return RealQATask([corpus[k] for k in sorted(corpus)], splits, meta)


# -- retrieval check ----------------------------------------------------------------------------------------


def supporting_recall(
    backend: Backend, rows: Sequence[dict[str, Any]], ks: Sequence[int] = (1, 3), batch_size: int = 256
) -> dict[str, float]:
    """How often the question, used as the query, ranks its supporting documents in the top k.

    `backend` is any search backend (BM25, dense, HTTP client, cache). Returns `n` and, for each k, `any@k` (at least one
    supporting document in the top k) and `all@k` (every one; the same as any@k for single-hop rows).
    """
    if not rows:
        raise ValueError("supporting_recall needs at least one row")
    depth = max(ks)
    found: dict[str, int] = {f"{kind}@{k}": 0 for k in ks for kind in ("any", "all")}
    for start in range(0, len(rows), batch_size):
        batch = rows[start : start + batch_size]
        results = backend.search([r["question"] for r in batch], depth)
        for row, hits in zip(batch, results, strict=True):
            ranked = [h.doc_id for h in hits]
            gold = set(row["supporting_doc_ids"])
            for k in ks:
                top = set(ranked[:k])
                found[f"any@{k}"] += bool(gold & top)
                found[f"all@{k}"] += gold <= top
    return {"n": float(len(rows)), **{name: count / len(rows) for name, count in found.items()}}
