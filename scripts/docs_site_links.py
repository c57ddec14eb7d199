"""mkdocs hook (mkdocs.yml ``hooks:``): the repository files the docs link to join the site.

The site is built from docs/, but the pages link to files beside it (``../examples/real_model/README.md``,
an example's ``guess.py``) — links that work where the docs are read in the repository. mkdocs sees
only docs/, so in strict mode each such link would fail the build, and on a site it would lead
nowhere. This hook adds every repository file a page links to (and, for a Markdown file, the files it
links to in turn) under ``repo/`` in the site, with the same relative layout, and rewrites the links to
reach it there. A link to a file that does not exist is left as written, so strict mode still fails
on it.
"""

from __future__ import annotations

import os
import posixpath
import re
from pathlib import Path

from mkdocs.structure.files import File, InclusionLevel

MIRROR = "repo"  # where the repository's other files sit in the site
# [text](target) or ![alt](target), the target up to an optional #anchor (in prose: see _prose)
_LINK = re.compile(r"(!?\[[^\]]*\]\()([^)\s#]+)((?:#[^)\s]*)?\))")
_EXTERNAL = re.compile(r"^[a-z][a-z0-9+.-]*:|^/")  # a scheme (https:, mailto:) or a site-absolute path


def _roots(config) -> tuple[Path, Path]:
    return Path(os.path.normpath(config.config_file_path)).parent, Path(os.path.normpath(config.docs_dir))


# fenced code blocks: their brackets are not links (a span of inline code may be a link's text)
_FENCED = re.compile(r"(^[ \t]*```.*?^[ \t]*```)", re.DOTALL | re.MULTILINE)


def _prose(markdown: str) -> list[str]:
    """``markdown`` cut at its fenced code blocks: the even items are prose, the odd ones code."""
    return _FENCED.split(markdown)


def _targets(markdown: str) -> list[str]:
    return [m.group(2) for part in _prose(markdown)[::2] for m in _LINK.finditer(part)
            if not _EXTERNAL.match(m.group(2))]


def _resolve(source: Path, target: str) -> Path:
    """The file a link from ``source`` names; a folder stands for its README.md, as on GitHub."""
    path = Path(os.path.normpath(source.parent / target))  # not resolve(): a symlink keeps its place
    return path / "README.md" if path.is_dir() else path


def _mirrored(root: Path, path: Path) -> str:
    return f"{MIRROR}/{path.relative_to(root).as_posix()}"


def on_files(files, config):
    root, docs = _roots(config)
    queue = [Path(os.path.normpath(f.abs_src_path)) for f in files.documentation_pages()]
    seen: set[Path] = set(queue)
    while queue:
        source = queue.pop()
        for target in _targets(source.read_text(encoding="utf-8")):
            path = _resolve(source, target)
            if path in seen or not path.is_file() or path.is_relative_to(docs) or not path.is_relative_to(root):
                continue  # already there, missing (strict mode reports it), or mkdocs' own
            seen.add(path)
            files.append(File.generated(config, _mirrored(root, path), abs_src_path=str(path),
                                        inclusion=InclusionLevel.NOT_IN_NAV))
            if path.suffix == ".md":
                queue.append(path)
    return files


def on_page_markdown(markdown, page, config, files):
    root, docs = _roots(config)
    source = Path(os.path.normpath(page.file.abs_src_path))
    here = posixpath.dirname(page.file.src_uri)

    def rewrite(m: re.Match) -> str:
        if _EXTERNAL.match(m.group(2)):
            return m.group(0)
        path = _resolve(source, m.group(2))
        if path.is_relative_to(docs):
            uri = path.relative_to(docs).as_posix()
        elif path.is_relative_to(root) and files.get_file_from_path(_mirrored(root, path)) is not None:
            uri = _mirrored(root, path)
        else:
            return m.group(0)  # not a file of the site: left for strict mode to report
        return f"{m.group(1)}{posixpath.relpath(uri, here or '.')}{m.group(3)}"

    parts = _prose(markdown)
    return "".join(_LINK.sub(rewrite, part) if i % 2 == 0 else part for i, part in enumerate(parts))
