"""The README and docs/ as a reader uses them: every relative link leads to a file (and a heading, where
it names one), and every ``ppo-lm`` command line they show parses with today's flags — parsed only, by
``ppo_lm.cli.parse_only``, never run. The docs site builds the same pages in strict mode (``make docs``)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from ppo_lm.cli.parse_only import parse_only

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

_FENCED = re.compile(r"^[ \t]*```[^\n]*\n(.*?)^[ \t]*```", re.DOTALL | re.MULTILINE)
_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
_HEADING = re.compile(r"^(#{1,6})[ \t]+(.+?)[ \t]*#*[ \t]*$", re.MULTILINE)
_SPAN = re.compile(r"`([^`\n]+)`")


def _split(text: str) -> tuple[str, list[str]]:
    """The page's prose (fenced code blocks blanked out) and the blocks' contents."""
    return _FENCED.sub("", text), _FENCED.findall(text)


def slug(heading: str) -> str:
    """GitHub's id for a heading (mkdocs.yml makes the site use the same): its text without markup,
    lower case, without punctuation but ``-`` and ``_``, spaces as hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text
    text = re.sub(r"[`*]", "", text).lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    found, seen = set(), {}
    for _, heading in _HEADING.findall(_split(page.read_text(encoding="utf-8"))[0]):
        s = slug(heading)
        n = seen.get(s, 0)
        found.add(s if n == 0 else f"{s}-{n}")  # GitHub numbers repeated headings from -1
        seen[s] = n + 1
    return found


def links(page: Path) -> list[str]:
    return [t for t in _LINK.findall(_split(page.read_text(encoding="utf-8"))[0])
            if not re.match(r"^[a-z][a-z0-9+.-]*:", t)]  # https:, mailto: … are not checked offline


def test_slugs_follow_github():
    assert slug("Three critic levers on a pretrained model") == "three-critic-levers-on-a-pretrained-model"
    assert slug("Measured: a task nobody here wrote (reasoning-gym's `chain_sum`)") == (
        "measured-a-task-nobody-here-wrote-reasoning-gyms-chain_sum")
    assert slug("Host E (2026-12-06, 06:54 UTC)") == "host-e-2026-12-06-0654-utc"
    assert slug("See [the loop](algorithm.md)") == "see-the-loop"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_relative_links_resolve(page):
    broken = []
    for target in links(page):
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            broken.append(f"{target}: no such file")
        elif anchor and file.suffix == ".md" and anchor not in anchors(file):
            broken.append(f"{target}: no heading #{anchor} in {file.relative_to(ROOT)}")
    assert not broken, f"{page.relative_to(ROOT)}: " + "; ".join(broken)


def test_the_link_check_sees_a_broken_link(tmp_path):
    page = tmp_path / "p.md"
    page.write_text("# Top\n[ok](p.md#top) [gone](missing.md) `[not a link](x.md)`\n```\n[code](y.md)\n```\n")
    assert links(page) == ["p.md#top", "missing.md", "x.md"]  # a span is prose; a fenced block is not
    assert anchors(page) == {"top"}


# ---- command lines ------------------------------------------------------------------------------
_PROGRAM = re.compile(r"^(?:\S*/)?ppo-lm$")
# the program first (after any VAR=value), or python/torchrun's module
_COMMAND = re.compile(r"^(?:\w+=\S*\s+)*(?:\S*/)?ppo-lm(?:\s|$)|(?:^|\s)-m ppo_lm(?:\s|$)")
_PLACEHOLDER = re.compile(r"^(?:[A-Z][A-Z0-9_]*|<[^>]*>)$")  # N, PATH, RUN_DIR, <dir>: the reader's own value


def command_lines(text: str) -> list[str]:
    """``ppo-lm …`` lines of a page: in its fenced code blocks (continuation backslashes joined) and in
    its code spans."""
    prose, blocks = _split(text)
    lines = [line.strip() for block in blocks for line in block.replace("\\\n", " ").splitlines()]
    spans = [span.strip() for span in _SPAN.findall(prose)]
    # a span that only names a command (`ppo-lm report`) is a name in a sentence, not a command line
    return [line for line in lines + [s for s in spans if len(s.split()) > 2] if _COMMAND.search(line)]


def argv_of(line: str) -> list[str] | None:
    """The arguments after the program, or None where the line is not a complete command: an ellipsis,
    a placeholder for the command itself. Optional ``[…]`` parts are kept (their flags must parse too),
    placeholder values become ``1``, a shell comment and what follows a ``|``, ``&&`` or ``;`` is dropped."""
    if "..." in line or "…" in line:
        return None
    try:
        lex = shlex.shlex(line.replace("[", " ").replace("]", " "), posix=True, punctuation_chars=";&|")
        lex.whitespace_split, lex.commenters = True, "#"
        words = list(lex)
    except ValueError:
        return None
    for stop in (";", "&&", "|", "||", "&"):
        words = words[:words.index(stop)] if stop in words else words
    if "-m" in words and words[words.index("-m") + 1:][:1] == ["ppo_lm"]:
        argv = words[words.index("-m") + 2:]
    else:
        start = next((i for i, w in enumerate(words) if _PROGRAM.match(w)), None)
        if start is None:
            return None
        argv = words[start + 1:]
    if not argv or _PLACEHOLDER.match(argv[0]):
        return None
    return ["1" if _PLACEHOLDER.match(w) else w for w in argv]


def test_command_lines_are_read_as_a_shell_would():
    assert argv_of("OMP_NUM_THREADS=2 .venv/bin/ppo-lm bench --workload w1 --threads 2   # table") == [
        "bench", "--workload", "w1", "--threads", "2"]
    assert argv_of("ppo-lm report RUN_DIR [--iteration N]") == ["report", "1", "--iteration", "1"]
    assert argv_of("torchrun --nproc-per-node 2 -m ppo_lm train --iterations 3") == ["train", "--iterations", "3"]
    assert argv_of("ppo-lm train --model.device cpu ...") is None and argv_of("ppo-lm COMMAND") is None
    assert argv_of("ppo-lm plot runs/a && ls runs/a") == ["plot", "runs/a"]
    assert command_lines("```bash\nppo-lm train --a 1 \\\n    --b 2\n```\nor `ppo-lm demo --rlhf`.") == [
        "ppo-lm train --a 1      --b 2", "ppo-lm demo --rlhf"]


def _commands() -> list[tuple[str, str]]:
    return [(page.relative_to(ROOT).as_posix(), line) for page in PAGES
            for line in dict.fromkeys(command_lines(page.read_text(encoding="utf-8")))]


def test_the_docs_show_commands():
    pages = {page for page, _ in _commands()}
    assert {"README.md", "docs/benchmarks.md", "docs/training.md", "docs/compare.md"} <= pages


def test_every_command_line_parses(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)  # the pages' paths are relative to the repository root
    empty = tmp_path / "empty.yaml"
    empty.write_text("{}\n")
    failed = []
    for page, line in _commands():
        argv = argv_of(line)
        if argv is None:
            continue
        # --config names the reader's own file where it is not one of the repository's: its flags are
        # what is checked here, not its contents
        argv = [str(empty) if prev == "--config" and not (ROOT / word).is_file() else word
                for prev, word in zip([None, *argv], argv)]
        result = parse_only(argv)
        if not result.ok:
            failed.append(f"{page}: {line}\n    {result.output.strip().splitlines()[-1:]}")
    assert not failed, "\n".join(failed)


def test_a_renamed_flag_fails_to_parse():
    assert parse_only(["bench", "--workload", "w1", "--iterations", "1"]).ok
    assert not parse_only(["bench", "--workload", "w1", "--iteration-count", "1"]).ok
    assert not parse_only(["train", "--algo.no-such-field", "1"]).ok
    assert parse_only(["train", "--algo.gae-lambda", "0.9", "--rollout.max-new-tokens", "16"]).ok
    assert not parse_only(["no-such-command"]).ok
