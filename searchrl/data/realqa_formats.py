"""HotpotQA (distractor) and SQuAD v1.1 official JSON, parsed into a corpus and searchrl question rows.

The two formats, as their official dumps hold them:

- HotpotQA dev, distractor setting: a JSON list of items `{"_id", "question", "answer", "type", "level",
  "supporting_facts": [[title, sentence_index], ...], "context": [[title, [sentence, ...]], ...]}`;
- SQuAD v1.1: `{"data": [{"title", "paragraphs": [{"context", "qas": [{"id", "question",
  "answers": [{"text", "answer_start"}]}]}]}]}`.

What the parsers make of them (`RealQASource`):

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

Bad input fails with `DatasetError` naming the file, the item (index and id) and the field, and saying what
was expected, because a malformed 100 MB dump is otherwise impossible to debug. Reading the files (the
shipped slices, several files merged) is `searchrl.data.realqa_files`.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any, NoReturn

from searchrl.data.datasets import DatasetError

SOURCES: tuple[str, ...] = ("hotpotqa", "squad")
_DOC_PREFIX = {"hotpotqa": "hotpot", "squad": "squad"}
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


def top_kind(obj: Any) -> str:
    """What a JSON top level is, for error messages: "list", "object" or the Python type's name."""
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
            f"{where}: the top level is a JSON {top_kind(items)}, expected a JSON list of question "
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
            f"{where}: the top level is a JSON {top_kind(obj)}"
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
