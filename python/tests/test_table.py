"""The one table of kvbmgo._lib matches include/kvbm.h: every function, no
more, each parameter's and result's C type, and every struct's layout."""
import ctypes
import re
import shutil
import subprocess
from ctypes import (POINTER, c_char_p, c_double, c_int32, c_int64, c_size_t, c_uint8, c_uint32,
                    c_uint64, c_void_p)
from pathlib import Path

import pytest

from kvbmgo import _lib

HEADER = Path(__file__).resolve().parents[2] / "include" / "kvbm.h"


def _clean_header():
    text = re.sub(r"/\*.*?\*/", " ", HEADER.read_text(), flags=re.S)
    text = re.sub(r"//[^\n]*", " ", text)
    return "\n".join(l for l in text.splitlines() if not l.lstrip().startswith("#"))


def header_declarations():
    """{name: (return type, [parameter declarations])} of every function of kvbm.h."""
    out = {}
    for m in re.finditer(r"([A-Za-z_][\w \t]*?\**)\s*\b(kvbm_[a-z0-9_]+)\s*"
                         r"\(([^()]*)\)\s*;", _clean_header()):
        params = re.sub(r"\s+", " ", m.group(3)).strip()
        plist = [] if params in ("", "void") else [p.strip() for p in params.split(",")]
        out[m.group(2)] = (re.sub(r"\s+", " ", m.group(1)).strip(), plist)
    return out


def header_functions():
    """{name: number of parameters}."""
    return {n: len(ps) for n, (_, ps) in header_declarations().items()}


def header_handles():
    """The opaque handle typedefs (typedef struct kvbm_x_s *kvbm_x_t)."""
    return set(re.findall(r"typedef\s+struct\s+\w+\s*\*\s*(kvbm_\w+_t)\s*;", _clean_header()))


def header_structs():
    """{kvbm_x_t: [field names]} of every struct typedef of kvbm.h."""
    out = {}
    for m in re.finditer(r"typedef\s+struct\s+\w+\s*\{(.*?)\}\s*(kvbm_\w+_t)\s*;",
                         _clean_header(), flags=re.S):
        fields = [re.search(r"(\w+)\s*(\[[^\]]*\])?\s*$", d.strip()).group(1)
                  for d in m.group(1).split(";") if d.strip()]
        out[m.group(2)] = fields
    return out


SCALARS = {"int32_t": c_int32, "uint32_t": c_uint32, "int64_t": c_int64, "uint64_t": c_uint64,
           "uint8_t": c_uint8, "size_t": c_size_t, "double": c_double,
           "kvbm_status_t": c_int32}

STRUCTS = {"kvbm_info_t": _lib.InfoC, "kvbm_layout_config_t": _lib.LayoutConfigC,
           "kvbm_layout_handle_t": _lib.LayoutHandleC,
           "kvbm_worker_config_t": _lib.WorkerConfigC,
           "kvbm_block_scope_t": _lib.BlockScopeC,
           "kvbm_transfer_options_t": _lib.TransferOptionsC,
           "kvbm_path_counters_t": _lib.PathCountersC, "kvbm_counters_t": _lib.CountersC,
           "kvbm_handoff_fact_t": _lib.HandoffFactC,
           "kvbm_handoff_action_t": _lib.HandoffActionC,
           "kvbm_cache_config_t": _lib.CacheConfigC,
           "kvbm_cache_tier_stats_t": _lib.CacheTierStatsC,
           "kvbm_cache_stats_t": _lib.CacheStatsC, "kvbm_cache_event_t": _lib.CacheEventC,
           "kvbm_load_plan_input_t": _lib.LoadPlanInputC}


def parse_type(decl, named=True):
    """(base type, pointer depth) of a C declaration, its name dropped when named."""
    d = re.sub(r"\bconst\b", " ", decl)
    depth = d.count("*")
    d = d.replace("*", " ")
    if "[" in d:  # an array parameter is a pointer
        depth += 1
        d = re.sub(r"\[[^\]]*\]", " ", d)
    words = d.split()
    if named:
        assert len(words) >= 2, f"unnamed parameter {decl!r}"
        words = words[:-1]
    return " ".join(words), depth


def _is_ctype(actual, want):
    """actual is want or a ctypes type of the same width and signedness."""
    if actual is want:
        return True
    if not (isinstance(actual, type) and issubclass(actual, ctypes._SimpleCData)
            and issubclass(want, ctypes._SimpleCData)):
        return False
    return (ctypes.sizeof(actual) == ctypes.sizeof(want)
            and actual._type_.islower() == want._type_.islower()  # signed: lower case code
            and (actual._type_ in "fdg") == (want._type_ in "fdg")
            and (actual._type_ in "zPO") == (want._type_ in "zPO"))


def check_type(actual, decl, named=True):
    """Whether ctypes type actual passes the C declaration decl faithfully."""
    base, depth = parse_type(decl, named)
    handles = header_handles()
    if base in handles:  # a handle is a pointer
        base, depth = "void", depth + 1
    if depth == 0:
        if base in SCALARS:
            return _is_ctype(actual, SCALARS[base])
        if base == "void":
            return actual is None
        raise AssertionError(f"no ctypes equivalent known for {decl!r}")
    if actual is c_void_p:  # any pointer may travel as an address
        return True
    if base == "char" and depth == 1:
        return actual is c_char_p
    if not (isinstance(actual, type) and issubclass(actual, ctypes._Pointer)):
        return False
    pointee = actual._type_
    if depth > 1:
        inner = decl.replace("*", "", 1) if "*" in decl else re.sub(r"\[[^\]]*\]", "", decl)
        return check_type(pointee, inner, named)
    if base in STRUCTS:
        return pointee is STRUCTS[base]
    if base in SCALARS:
        return _is_ctype(pointee, SCALARS[base])
    return False


def test_header_parses():
    decls = header_declarations()
    assert decls["kvbm_version"] == ("uint32_t", [])
    assert len(decls["kvbm_worker_transfer"][1]) == 8
    assert len(decls) >= 45
    assert {"kvbm_worker_t", "kvbm_notification_t", "kvbm_stream_t"} <= header_handles()
    assert header_structs()["kvbm_layout_handle_t"] == ["worker", "layout"]
    assert parse_type("const uint8_t *const *keys") == ("uint8_t", 2)
    assert parse_type("const uint8_t id[16]") == ("uint8_t", 1)


def test_the_checker_catches_mismatches():
    """The type check itself can fail: wrong width, signedness, pointee."""
    assert check_type(c_uint64, "uint64_t instance")
    assert not check_type(c_int32, "uint64_t instance")
    assert not check_type(c_uint32, "int32_t rank")
    assert not check_type(c_int64, "uint64_t action_id")
    assert not check_type(c_double, "int64_t timeout_ms")
    assert not check_type(c_int32, "double delay")
    assert not check_type(POINTER(c_uint32), "size_t *count")
    assert not check_type(POINTER(c_int32), "kvbm_layout_config_t *config")
    assert not check_type(c_uint64, "kvbm_worker_t worker")
    assert check_type(c_void_p, "kvbm_worker_t worker")
    assert check_type(POINTER(c_void_p), "kvbm_worker_t *worker")
    assert check_type(POINTER(_lib.InfoC), "kvbm_info_t *info")
    assert not check_type(POINTER(_lib.CountersC), "kvbm_info_t *info")


def test_table_matches_header():
    fns = header_functions()
    table = set(_lib.FUNCTIONS)
    assert sorted(set(fns) - table) == [], "declared in kvbm.h, missing from the table"
    assert sorted(table - set(fns)) == [], "in the table, not declared in kvbm.h"


@pytest.mark.parametrize("name", sorted(header_functions()))
def test_types_arity_and_errcheck(name):
    restype, argtypes, errcheck = _lib.FUNCTIONS[name]
    ret, params = header_declarations()[name]
    assert len(argtypes) == len(params)
    assert check_type(restype, ret, named=False), f"{name} returns {ret}, table {restype}"
    for i, (decl, actual) in enumerate(zip(params, argtypes)):
        assert check_type(actual, decl), f"{name} parameter {i} is {decl!r}, table {actual}"
    fn = getattr(_lib.lib, name)
    assert fn.restype is restype and list(fn.argtypes) == list(argtypes)
    # Every status-returning function raises through errcheck.
    if ret == "kvbm_status_t":
        assert errcheck == "status"
        assert fn.errcheck is _lib._check_status


def test_every_struct_has_a_ctypes_twin():
    assert set(header_structs()) == set(STRUCTS)
    for name, fields in header_structs().items():
        assert [f[0] for f in STRUCTS[name]._fields_] == fields, name


def test_struct_layouts_match_the_compiler(tmp_path):
    """sizeof and offsetof of every kvbm_*_t struct, as gcc lays them out."""
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        pytest.skip("no C compiler")
    structs = header_structs()
    lines = ["#include <stdio.h>", "#include <stddef.h>", '#include "kvbm.h"', "int main(void) {"]
    for name, fields in structs.items():
        lines.append(f'printf("{name} . %zu\\n", sizeof({name}));')
        for f in fields:
            lines.append(f'printf("{name} {f} %zu\\n", offsetof({name}, {f}));')
    lines += ["return 0;", "}"]
    src = tmp_path / "layout.c"
    src.write_text("\n".join(lines))
    exe = tmp_path / "layout"
    subprocess.run([cc, "-std=c11", "-I", str(HEADER.parent), str(src), "-o", str(exe)],
                   check=True, capture_output=True)
    got = {}
    for line in subprocess.run([str(exe)], check=True, capture_output=True,
                               text=True).stdout.splitlines():
        name, field, value = line.split()
        got[(name, field)] = int(value)
    assert len(got) == sum(len(f) + 1 for f in structs.values())
    for name, fields in structs.items():
        cls = STRUCTS[name]
        assert ctypes.sizeof(cls) == got[(name, ".")], f"sizeof({name})"
        for f in fields:
            assert getattr(cls, f).offset == got[(name, f)], f"offsetof({name}, {f})"
