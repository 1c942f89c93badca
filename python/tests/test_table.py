"""The one table of kvbmgo._lib declares every function of include/kvbm.h, no more."""
import re
from pathlib import Path

import pytest

from kvbmgo import _lib

HEADER = Path(__file__).resolve().parents[2] / "include" / "kvbm.h"


def header_functions():
    """{name: number of parameters} of every function declared in kvbm.h."""
    text = re.sub(r"/\*.*?\*/", " ", HEADER.read_text(), flags=re.S)
    text = re.sub(r"//[^\n]*", " ", text)
    text = "\n".join(l for l in text.splitlines() if not l.lstrip().startswith("#"))
    out = {}
    for m in re.finditer(r"\b(kvbm_[a-z0-9_]+)\s*\(([^()]*(?:\([^()]*\)[^()]*)*)\)\s*;", text):
        params = m.group(2).strip()
        out[m.group(1)] = 0 if params in ("", "void") else params.count(",") + 1
    return out


def test_header_parses():
    fns = header_functions()
    assert "kvbm_version" in fns and fns["kvbm_version"] == 0
    assert fns["kvbm_worker_transfer"] == 8
    assert len(fns) >= 45


def test_table_matches_header():
    fns = header_functions()
    table = set(_lib.FUNCTIONS)
    assert sorted(set(fns) - table) == [], "declared in kvbm.h, missing from the table"
    assert sorted(table - set(fns)) == [], "in the table, not declared in kvbm.h"


@pytest.mark.parametrize("name", sorted(header_functions()))
def test_arity_and_errcheck(name):
    restype, argtypes, errcheck = _lib.FUNCTIONS[name]
    assert len(argtypes) == header_functions()[name]
    # Every status-returning function raises through errcheck.
    if restype is _lib.c_int32:
        assert errcheck == "status"
        assert getattr(_lib.lib, name).errcheck is _lib._check_status
