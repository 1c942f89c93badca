"""The README and docs/*.md stay true: every page is reachable from the
README, every relative link (and its #anchor) resolves, the README stays
short, and every shell command in them is run by a test.

A fenced block whose info string starts with ``sh`` must say which:

- ``sh runnable``: cheap and self-contained after ``make lib`` (and
  ``make py-venv``). This test runs it with bash (``-eo pipefail``) from
  the repository root, ``python3`` being this test's interpreter, and it
  must exit 0 within TIMEOUT_S seconds.
- ``sh tested-by=X``: too heavy or too engine-bound to run here (``make
  test``, ``vllm serve``, ``sglang.launch_server``); X names what runs it or
  its equivalent: a path in the repository, or ``make:TARGET`` for a target
  of the Makefile or its ``*.mk`` files. The prose beside the block says
  how close that is.

Other blocks (``c``, ``python``, ``go``) are not run here; the examples
they come from are (``examples/c`` under ctest, ``python/examples`` by
test_example.py).
"""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
PAGES = [README] + sorted((ROOT / "docs").glob("*.md"))
README_MAX_BYTES = 12 * 1024
TIMEOUT_S = 300

_FENCE = re.compile(r"^(```+|~~~+)\s*(.*)$")
_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def _blocks(path):
    """(first line number, info string, code) of each fenced block, and the
    text outside them (code blocks blanked, line numbers kept)."""
    blocks, prose = [], []
    fence = info = None
    start, code = 0, []
    for n, line in enumerate(path.read_text().split("\n"), 1):
        m = _FENCE.match(line)
        if fence is None and m:
            fence, info, start, code = m.group(1), m.group(2).strip(), n, []
            prose.append("")
        elif fence is not None and line.strip() == fence:
            blocks.append((start, info, "\n".join(code)))
            fence = None
            prose.append("")
        elif fence is not None:
            code.append(line)
            prose.append("")
        else:
            prose.append(line)
    assert fence is None, f"{path.name}:{start}: fence never closed"
    return blocks, "\n".join(prose)


def _slug(heading):
    """GitHub's anchor for a heading."""
    s = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return s.replace(" ", "-")


def _anchors(path):
    _, prose = _blocks(path)
    seen, out = {}, set()
    for line in prose.split("\n"):
        m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if m:
            s = _slug(m.group(1))
            k = seen.get(s, 0)
            seen[s] = k + 1
            out.add(s if k == 0 else f"{s}-{k}")
    return out


def _links(path):
    """(line, target) of each link outside code blocks and code spans."""
    _, prose = _blocks(path)
    for n, line in enumerate(prose.split("\n"), 1):
        for m in _LINK.finditer(re.sub(r"`[^`]*`", "", line)):
            yield n, m.group(1)


def _sh_blocks():
    for page in PAGES:
        blocks, _ = _blocks(page)
        for start, info, code in blocks:
            words = info.split()
            if words and words[0] == "sh":
                yield page, start, words[1:], code


def _runnable():
    return [pytest.param(code, id=f"{page.relative_to(ROOT)}:{start}")
            for page, start, marks, code in _sh_blocks() if marks == ["runnable"]]


def run_block(code):
    """Runs a runnable block as the docs say: bash from the repository root,
    python3 being this interpreter (the package's venv). Fails the test
    unless it exits 0 in time."""
    env = dict(os.environ)
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    try:
        out = subprocess.run(["bash", "-eo", "pipefail", "-c", code], cwd=ROOT, env=env,
                             capture_output=True, text=True, timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        pytest.fail(f"timed out after {TIMEOUT_S} s:\n{code}")
    assert out.returncode == 0, (f"exit {out.returncode}:\n{code}\n--- stdout\n{out.stdout}"
                                 f"\n--- stderr\n{out.stderr}")
    return out


def test_readme_is_short():
    size = README.stat().st_size
    assert size <= README_MAX_BYTES, f"README.md is {size} bytes (at most {README_MAX_BYTES})"


def test_every_page_is_linked_from_the_readme():
    linked = {(README.parent / t.split("#")[0]).resolve() for _, t in _links(README)}
    missing = [p.name for p in PAGES[1:] if p.resolve() not in linked]
    assert not missing, f"docs pages not linked from README.md: {missing}"


def test_links_resolve():
    bad = []
    for page in PAGES:
        for n, target in _links(page):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
                continue
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            where = f"{page.relative_to(ROOT)}:{n}: {target}"
            if not dest.exists():
                bad.append(f"{where}: no such file")
            elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
                bad.append(f"{where}: no heading #{anchor} in {dest.name}")
    assert not bad, "\n".join(bad)


def _make_targets():
    targets = set()
    for mk in [ROOT / "Makefile"] + sorted(ROOT.glob("*.mk")):
        for line in mk.read_text().split("\n"):
            m = re.match(r"^([A-Za-z0-9_.-]+(?:\s+[A-Za-z0-9_.-]+)*)\s*:(?!=)", line)
            if m:
                targets.update(m.group(1).split())
    return targets


def test_every_sh_block_is_run_or_says_what_runs_it():
    targets = _make_targets()
    bad = []
    for page, start, marks, _ in _sh_blocks():
        where = f"{page.relative_to(ROOT)}:{start}"
        if marks == ["runnable"]:
            continue
        if len(marks) != 1 or not marks[0].startswith("tested-by="):
            bad.append(f"{where}: ```sh needs 'runnable' or 'tested-by=...', has {marks}")
            continue
        what = marks[0][len("tested-by="):]
        if what.startswith("make:"):
            if what[5:] not in targets:
                bad.append(f"{where}: no make target {what[5:]!r}")
        elif not (ROOT / what).exists():
            bad.append(f"{where}: tested-by names {what!r}, which does not exist")
    assert not bad, "\n".join(bad)


def test_there_are_runnable_blocks():
    assert len(_runnable()) >= 5


def test_a_failing_block_fails():
    with pytest.raises(AssertionError, match="exit 3"):
        run_block("true\nexit 3")
    with pytest.raises(AssertionError, match="exit 1"):
        run_block("false | cat")  # pipefail


@pytest.mark.parametrize("code", _runnable())
def test_runnable_block(code):
    run_block(code)
