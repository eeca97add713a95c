"""Who may read which document: principal ids, corpus ACLs, and the per-principal mask every backend applies.

What: a corpus row may carry ``acl``, a list of principal ids allowed to read it (no ``acl``, or ``null``:
public); a question row may carry ``principal``, the user its episode acts for. `check_principal` is the one
rule for what a principal id is, `parse_acl` the one reader of a row's ``acl``, and `AccessControl` the
index-side record (``acl.json`` beside an index's documents) that answers "which documents may this
principal read" as a boolean mask over document positions.

Why here, below every backend: each search path (BM25, dense, the cache, replay, the HTTP service and
client) must filter *before* its top-k cut, so the k results are the best k documents the principal may
read. A filter applied after the cut would return fewer documents and show that hidden ones matched. So the
backends take the principal with the query and mask their scoring; nothing above them ever sees a document
the principal may not read.

The rules, kept strict because this is a security boundary:

- A principal id is a non-empty string of at most `MAX_PRINCIPAL_CHARS` characters, without control
  characters and without white space at either end. Ids are compared exactly: no case folding, no Unicode
  normalisation, no wildcards (``"*"`` is just an id), no groups.
- No principal (``None``) reads public documents only.
- ``"acl": []`` is a document no principal may read (fail closed, never "public").
- An ``acl`` that is not a list of valid principal ids is an error naming the file, line and field.
"""

from __future__ import annotations

import json
import os
import threading
import unicodedata
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

MAX_PRINCIPAL_CHARS = 256
ACL_FILE = "acl.json"
ACL_FORMAT_VERSION = 1


class PrincipalError(ValueError):
    """A principal id (in a question row, a request, a corpus ``acl``) that is not a valid id."""


def principal_problem(value: object) -> str | None:
    """Why `value` is not a valid principal id, or None when it is one."""
    if not isinstance(value, str):
        return f"a principal id must be a string, got {type(value).__name__}"
    if not value:
        return "a principal id must not be empty"
    if len(value) > MAX_PRINCIPAL_CHARS:
        return f"a principal id has at most {MAX_PRINCIPAL_CHARS} characters, got {len(value)}"
    if value != value.strip():
        return f"a principal id must not start or end with white space, got {value!r}"
    if any(unicodedata.category(ch) in ("Cc", "Cs", "Cf") for ch in value):
        return f"a principal id must not hold control or format characters, got {value!r}"
    return None


def check_principal(value: object, where: str = "principal") -> str | None:
    """`value` as a principal id (None stays None: public documents only); `PrincipalError` otherwise."""
    if value is None:
        return None
    problem = principal_problem(value)
    if problem is not None:
        raise PrincipalError(f"{where}: {problem}")
    return value  # type: ignore[return-value]


def check_principals(principals: Sequence[str | None] | None, n_queries: int) -> list[str | None]:
    """One checked principal per query (None for a call without principals)."""
    if principals is None:
        return [None] * n_queries
    if isinstance(principals, str) or len(principals) != n_queries:
        raise PrincipalError(
            f"principals: give one principal (or None) per query: {n_queries} queries, got "
            f"{'a string' if isinstance(principals, str) else len(principals)}"
        )
    return [check_principal(p, f"principals[{i}]") for i, p in enumerate(principals)]


def parse_acl(value: object, where: str) -> tuple[str, ...] | None:
    """A corpus row's ``acl`` as a sorted tuple of principal ids (None: public); `PrincipalError` naming
    `where` and the field when it is not a list of valid ids."""
    if value is None:
        return None
    if hasattr(value, "tolist") and not isinstance(value, list | tuple | str):
        value = value.tolist()  # a parquet list column arrives as a numpy array
    if not isinstance(value, list | tuple):
        raise PrincipalError(
            f"{where}: field 'acl' must be a list of principal ids (strings), got {type(value).__name__}; "
            "leave it out for a public document"
        )
    for i, item in enumerate(value):
        problem = principal_problem(item)
        if problem is not None:
            raise PrincipalError(f"{where}: field 'acl[{i}]': {problem}")
    return tuple(sorted(set(value)))


def group_by_principal(principals: Sequence[str | None]) -> dict[str | None, list[int]]:
    """Query positions by principal, in first-seen order (one masked scoring pass per principal)."""
    groups: dict[str | None, list[int]] = {}
    for i, principal in enumerate(principals):
        groups.setdefault(principal, []).append(i)
    return groups


class AccessControl:
    """The restricted documents of one index and who may read each: a mask over document positions.

    `restricted` lists the positions of documents with an ``acl``; `readers[p]` the restricted positions
    principal `p` may read. `readable(p)` is True for every public document and for those restricted ones.
    Masks are cached per principal (a bounded number, so a corpus of millions of documents stays bounded).
    """

    def __init__(self, num_docs: int, restricted: Iterable[int], readers: dict[str, Iterable[int]]) -> None:
        self.num_docs = int(num_docs)
        self.restricted = np.asarray(sorted(set(int(i) for i in restricted)), dtype=np.int64)
        self.readers = {
            p: np.asarray(sorted(set(int(i) for i in ids)), dtype=np.int64) for p, ids in readers.items()
        }
        for principal, ids in self.readers.items():
            check_principal(principal, f"{ACL_FILE}: readers")
            if ids.size and not np.isin(ids, self.restricted).all():
                raise ValueError(
                    f"{ACL_FILE}: readers[{principal!r}] names documents that are not restricted"
                )
        if self.restricted.size and (self.restricted[0] < 0 or self.restricted[-1] >= self.num_docs):
            raise ValueError(f"{ACL_FILE}: a restricted position lies outside 0..{self.num_docs - 1}")
        self._cache: OrderedDict[str | None, np.ndarray | None] = OrderedDict()
        self._cache_size = max(1, (256 << 20) // max(1, self.num_docs))  # about 256 MB of masks at most
        self._lock = threading.Lock()  # backends search from worker threads

    @classmethod
    def from_acls(cls, acls: Sequence[tuple[str, ...] | None]) -> AccessControl:
        """From each document's acl (None: public), by position."""
        restricted = [i for i, acl in enumerate(acls) if acl is not None]
        readers: dict[str, list[int]] = {}
        for i in restricted:
            for principal in acls[i] or ():
                readers.setdefault(principal, []).append(i)
        return cls(len(acls), restricted, readers)

    @property
    def any_restricted(self) -> bool:
        return bool(self.restricted.size)

    def readable(self, principal: str | None) -> np.ndarray | None:
        """Boolean mask of the documents `principal` may read; None when it may read every document."""
        principal = check_principal(principal)
        if not self.any_restricted:
            return None
        with self._lock:
            if principal in self._cache:
                self._cache.move_to_end(principal)
                return self._cache[principal]
        mask: np.ndarray | None = np.ones(self.num_docs, dtype=bool)
        assert mask is not None
        mask[self.restricted] = False
        own = self.readers.get(principal) if principal is not None else None
        if own is not None:
            mask[own] = True
        mask.setflags(write=False)
        if bool(mask.all()):
            mask = None
        with self._lock:
            self._cache[principal] = mask
            while len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
        return mask

    def may_read(self, principal: str | None, position: int) -> bool:
        mask = self.readable(principal)
        return True if mask is None else bool(mask[position])

    def summary(self) -> dict[str, int]:
        """What `meta.json` records: restricted documents and principals named."""
        return {"restricted_docs": int(self.restricted.size), "principals": len(self.readers)}

    def to_dict(self) -> dict[str, Any]:
        return {
            "format_version": ACL_FORMAT_VERSION,
            "num_docs": self.num_docs,
            "restricted": self.restricted.tolist(),
            "readers": {p: ids.tolist() for p, ids in sorted(self.readers.items())},
        }

    def write(self, index_dir: str | os.PathLike) -> Path:
        path = Path(index_dir) / ACL_FILE
        path.write_text(json.dumps(self.to_dict(), ensure_ascii=False))
        return path

    @classmethod
    def load(cls, index_dir: str | os.PathLike, num_docs: int) -> AccessControl | None:
        """The index's ACLs (None: no `acl.json`, every document public)."""
        path = Path(index_dir) / ACL_FILE
        if not path.exists():
            return None
        data = json.loads(path.read_text(encoding="utf-8"))
        if data.get("format_version") != ACL_FORMAT_VERSION or int(data.get("num_docs", -1)) != num_docs:
            raise ValueError(
                f"{path}: not an ACL file for this index ({data.get('num_docs')} documents, version "
                f"{data.get('format_version')}; the index has {num_docs}); rebuild the index"
            )
        return cls(num_docs, data["restricted"], data["readers"])
