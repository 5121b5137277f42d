"""Where the shipped traces live, and strict CSV / JSON-lines readers that name the file and line of a bad row."""

from __future__ import annotations

import gzip
import json
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

TRACE_DIR_ENV = "FLUIDPD_TRACE_DIR"


def trace_dir() -> Path:
    """The trace folder: $FLUIDPD_TRACE_DIR, else data/traces next to the package."""
    env = os.environ.get(TRACE_DIR_ENV)
    return Path(env) if env else Path(__file__).resolve().parents[2] / "data" / "traces"


def trace_file(path: str | Path | None, default: str) -> Path:
    """`path` if given, else `default` inside trace_dir(); FileNotFoundError naming the file if missing."""
    p = Path(path) if path is not None else trace_dir() / default
    if not p.is_file():
        hint = f" (set {TRACE_DIR_ENV} to the folder holding the traces)" if path is None else ""
        raise FileNotFoundError(f"trace file not found: {p}{hint}")
    return p


class Columns:
    """The text columns of a CSV file plus the 1-based file line of every row, for error messages."""

    def __init__(self, path: Path, header: list[str], cols: dict[str, list[str]], lines: list[int] | range):
        self.path, self.header, self.lines, self._cols = path, header, lines, cols

    def __len__(self) -> int:
        return len(self.lines)

    def error(self, row: int, msg: str) -> ValueError:
        return ValueError(f"{self.path}: line {self.lines[row]}: {msg}")

    def numbers(self, name: str) -> np.ndarray:
        """Column `name` as float64; a non-number is a ValueError naming its line."""
        values = self._cols[name]
        try:
            out = np.array(values, dtype=np.float64)
        except ValueError:
            out = None
        bad = _first_bad(values, float) if out is None else _first_true(~np.isfinite(out))
        if bad is not None:
            raise self.error(bad, f"{name}={values[bad]!r} is not a finite number")
        assert out is not None  # _first_bad always names a row
        return out

    def counts(self, name: str) -> np.ndarray:
        """Column `name` as int64 whole numbers."""
        x = self.numbers(name)
        bad = _first_true(x != np.round(x))
        if bad is not None:
            raise self.error(bad, f"{name}={self._cols[name][bad]!r} is not a whole number")
        return x.astype(np.int64)

    def datetimes(self, name: str) -> np.ndarray:
        """Column `name` (ISO-like 'YYYY-MM-DD HH:MM:SS.fffffff') as datetime64[ns]."""
        values = self._cols[name]
        try:
            out = np.array(values, dtype="datetime64[ns]")
        except ValueError:
            out = None
        bad = _first_bad(values, lambda v: np.datetime64(v, "ns")) if out is None else _first_true(np.isnat(out))
        if bad is not None:
            raise self.error(bad, f"{name}={values[bad]!r} is not a timestamp")
        assert out is not None  # _first_bad always names a row
        return out

    def strings(self, name: str) -> list[str]:
        return self._cols[name]


def read_header(path: Path) -> list[str]:
    with _open_text(path) as f:
        return [h.strip() for h in f.readline().strip().split(",")]


def read_csv(path: Path, required: Sequence[str]) -> Columns:
    """Read a comma-separated file with a header line holding every `required` column."""
    with _open_text(path) as f:
        text = f.read().splitlines()
    if not text:
        raise ValueError(f"{path}: line 1: empty file, expected a header with {', '.join(required)}")
    header = [h.strip() for h in text[0].split(",")]
    missing = [c for c in required if c not in header]
    if missing:
        raise ValueError(f"{path}: line 1: header {header} lacks column(s) {', '.join(missing)}")
    rows = text[1:]
    lines: list[int] | range = range(2, len(text) + 1)
    if any(not r.strip() for r in rows):
        lines = [i for i, r in zip(lines, rows) if r.strip()]
        rows = [text[i - 1] for i in lines]
    width = len(header)
    for i, r in zip(lines, rows):
        if r.count(",") != width - 1:
            raise ValueError(f"{path}: line {i}: {r.count(',') + 1} fields, header has {width}")
    flat = ",".join(rows).split(",") if rows else []
    return Columns(path, header, {h: flat[c::width] for c, h in enumerate(header)}, lines)


def read_jsonl(path: Path) -> Iterator[tuple[int, dict]]:
    """Yield (1-based line number, object) for each non-blank line; bad JSON is a ValueError naming the line."""
    with _open_text(path) as f:
        for i, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}: line {i}: invalid JSON ({e.msg})") from None
            if not isinstance(obj, dict):
                raise ValueError(f"{path}: line {i}: expected a JSON object")
            yield i, obj


def field(obj: dict, key: str, kind: type, path: Path, line: int):
    """obj[key] checked to be a `kind`: int (whole floats accepted), float (ints accepted), or another type."""
    v: Any = obj.get(key)
    if isinstance(v, bool):
        ok = kind is bool
    elif kind is int:
        ok = isinstance(v, int) or (isinstance(v, float) and v.is_integer())
        v = int(v) if ok else v
    elif kind is float:
        ok = isinstance(v, (int, float)) and np.isfinite(v)
    else:
        ok = isinstance(v, kind)
    if not ok:
        raise ValueError(f"{path}: line {line}: field {key!r} must be {kind.__name__}, got {v!r}")
    return v


def _open_text(path: Path):
    return gzip.open(path, "rt", encoding="utf-8") if path.suffix == ".gz" else open(path, encoding="utf-8")


def _first_bad(values: Sequence[str], parse) -> int:
    for i, v in enumerate(values):
        try:
            parse(v)
        except ValueError:
            return i
    return 0  # the column failed as a whole; blame its first row


def _first_true(mask: np.ndarray) -> int | None:
    idx = np.flatnonzero(mask)
    return int(idx[0]) if idx.size else None
