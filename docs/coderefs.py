"""The lessons' references to real code, found in their markdown, and turned into permalinks.

    from docs.coderefs import lesson_references, load_table, link_references
    refs = lesson_references(markdown_text)          # [Reference(context, path, symbols, line)]
    table = load_table()                             # docs/code_refs.json (committed; no network)
    new_text, links = link_references(markdown_text, "assignments/02_tensor_parallel/README.md", table)

A *code reference* is a file path written as a code span (`megatron/core/tensor_parallel/mappings.py`,
or a short one such as `mappings.py` inside a table whose text says where its paths live), in
- a lesson's code map (the table under a heading that says "Code map"),
- a deep dive's opening "Source:" / "Sources:" paragraph,
- anywhere else when it is a full path inside one of the repositories the lessons cite;
together with the symbols the text attaches to it: the code spans after it in the same table cell or
sentence (`file.py` → `Symbol`, `file.py` (`Symbol`)), or in the next column when the column is headed
"file" (the 01 lesson's `| concept | file | symbol |`).

`docs/code_refs.json` resolves each one to a repository, a path and a commit (a full 40-hex hash), and
each symbol to its lines at that commit; `docs/resolve_code_refs.py` writes it from snapshots of the
repositories (a developer's step, with network), the site build only reads it.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field

HERE = os.path.dirname(os.path.abspath(__file__))
TABLE_PATH = os.path.join(HERE, "code_refs.json")

CODE = re.compile(r"`([^`\n]+)`")
PATH = re.compile(r"^(?:[\w.-]+/)*[\w.-]+\.(?:py|cpp|h|cu|cuh|md|yaml|sh)$|^(?:[\w.-]+/)+$|^[\w.-]+(?:/[\w.-]+)+$")
HEADING = re.compile(r"^(#{1,6})\s+(.*)$")
# the Chinese lessons (zh/) say 来源： / 出处：, 代码映射表 and 文件 / 符号 where the English says Source:, Code map, file / symbol
SOURCE_START = re.compile(r"^(?:Exercises? [\d, and-]+\.\s+)?Sources?:|^(?:练习[\d ，、和-]+。)?(?:来源|出处)：")
CODE_MAP = re.compile(r"code map|代码映射|代码对照", re.I)
FILE_COLUMN, SYMBOL_COLUMN = ("file", "文件"), ("symbol", "符号")
# first components of full paths inside the repositories the lessons cite
FULL_PATH_ROOTS = ("megatron/", "torch/", "deepspeed/", "ring_flash_attn/", "transformer_engine/", "deep_ep/",
                   "torchtitan/")


@dataclass
class Reference:
    context: str          # "code map: <column header>", "source", or "text"
    path: str             # as written
    symbols: list[str] = field(default_factory=list)   # as written, normalised by `symbol_name`
    line: int = 0         # 1-based line of the lesson
    # where each span is: (line, start, end, symbol name or None for the path), offsets in that line
    spans: list[tuple[int, int, int, str | None]] = field(default_factory=list)


def is_path(span: str) -> bool:
    return bool(PATH.match(span)) and not span.startswith(("http", "--"))


def symbol_name(span: str) -> str | None:
    """`ZeroRedundancyOptimizer(params, ...)` -> `ZeroRedundancyOptimizer`; `_MB_TO_BYTES = 1024 * 1024` ->
    `_MB_TO_BYTES`; `Reducer::mark_bucket_ready` and `.recv_forward` kept; `--flag` kept; None for prose."""
    s = span.strip()
    if s.startswith("--") and re.match(r"^--[\w-]+$", s.split()[0]):
        return s.split()[0]
    m = re.match(r"^(\.?[A-Za-z_][\w]*(?:(?:\.|::)[A-Za-z_]\w*)*)", s)
    if not m:
        return None
    name = m.group(1)
    if name.startswith(("torch.", "dist.", "F.", "nn.")):
        return None     # a public PyTorch name in passing, not a symbol of the file before it
    rest = s[len(name):].strip()
    if rest and not rest.startswith(("(", "=", "[")):
        return None     # `split last dim / all-gather`, `F.gelu` inside prose: not a symbol
    return name


def _cells(row: str) -> list[tuple[str, int]]:
    """(cell text, offset of the cell in the row) for a table row."""
    out = []
    bounds = [m.start() for m in re.finditer(r"(?<!\\)\|", row)]
    for a, b in zip(bounds, bounds[1:]):
        out.append((row[a + 1:b], a + 1))
    return out


def _walk_spans(text: str, refs: list[Reference], context: str, line: int, carry: Reference | None = None,
                offset: int = 0):
    """Paths and the symbols after them in one cell or line of a paragraph; returns the last open reference."""
    current = carry
    for m in CODE.finditer(text):
        span = m.group(1).strip()
        where = (line, offset + m.start(), offset + m.end())
        if is_path(span):
            current = Reference(context, span, [], line, [(*where, None)])
            refs.append(current)
        elif current is not None:
            name = symbol_name(span)
            if name:
                if name not in current.symbols:
                    current.symbols.append(name)
                current.spans.append((*where, name))
    return current


def lesson_references(text: str) -> list[Reference]:
    """Every code reference of one lesson (see the module docstring), in order."""
    lines = text.splitlines()
    refs: list[Reference] = []
    in_code_map = False
    code_map_level = 0
    header: list[str] = []
    fence = False
    i = 0
    source_done = False
    while i < len(lines):
        raw = lines[i]
        if raw.lstrip().startswith("```"):
            fence = not fence
            i += 1
            continue
        if fence:
            i += 1
            continue
        h = HEADING.match(raw)
        if h:
            level = len(h.group(1))
            if in_code_map and level <= code_map_level:
                in_code_map = False
            if CODE_MAP.search(h.group(2)):
                in_code_map, code_map_level, header = True, level, []
            if level > 1:
                source_done = True
            i += 1
            continue
        if in_code_map and raw.lstrip().startswith("|"):
            cells = _cells(raw)
            if all(re.fullmatch(r":?-{3,}:?", c.strip()) for c, _ in cells):
                i += 1
                continue
            if not header:
                header = [re.sub(r"`", "", c).strip() for c, _ in cells]
                i += 1
                continue
            carry = None
            for col, (cell, offset) in enumerate(cells):
                name = header[col] if col < len(header) else f"column {col}"
                opened = _walk_spans(cell, refs, f"code map: {name}", i + 1,
                                     carry if name.lower() in SYMBOL_COLUMN else None, offset)
                carry = opened if name.lower() in FILE_COLUMN else None
            i += 1
            continue
        if not source_done and SOURCE_START.match(raw):
            current = None
            while i < len(lines) and lines[i].strip():
                current = _walk_spans(lines[i], refs, "source", i + 1, current)
                i += 1
            source_done = True
            continue
        if in_code_map:
            # prose inside the code-map section: paths only when written in full
            for m in CODE.finditer(raw):
                span = m.group(1).strip()
                if is_path(span) and span.startswith(FULL_PATH_ROOTS):
                    refs.append(Reference("code map: text", span, [], i + 1, [(i + 1, m.start(), m.end(), None)]))
            i += 1
            continue
        for m in CODE.finditer(raw):
            span = m.group(1).strip()
            if is_path(span) and span.startswith(FULL_PATH_ROOTS):
                refs.append(Reference("text", span, [], i + 1, [(i + 1, m.start(), m.end(), None)]))
        i += 1
    return refs


# ---------------------------------------------------------------------------
# The resolved table
# ---------------------------------------------------------------------------

def load_table(path: str = TABLE_PATH) -> dict:
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def ref_key(lesson: str, ref: Reference) -> str:
    """Where a path as written is looked up: per lesson and context (a short `schedules.py` means Megatron's
    in one column and PyTorch's in the next)."""
    return f"{lesson}|{ref.context}|{ref.path}"


def resolve(table: dict, lesson: str, ref: Reference) -> dict | None:
    """{"repo", "path", "commit", "kind", "symbols": {name: [start, end] | None}} for a reference, or None."""
    target = table["references"].get(ref_key(lesson, ref))
    if target is None:
        return None
    entry = table["files"][target]
    return {"repo": entry["repo"], "path": entry["path"], "commit": entry["commit"], "kind": entry["kind"],
            "symbols": entry["symbols"], "id": target, "unread": entry.get("unread")}


def permalink(entry: dict, lines: list[int] | None = None) -> str:
    kind = "tree" if entry["kind"] == "dir" else "blob"
    url = f"https://github.com/{entry['repo']}/{kind}/{entry['commit']}/{entry['path'].rstrip('/')}"
    if lines:
        start, end = lines
        url += f"#L{start}" + (f"-L{end}" if end and end != start else "")
    return url


def symbol_target(table: dict, entry: dict, name: str) -> tuple[dict, list[int] | None] | None:
    """(file entry, [start, end] or None) that a symbol links to: its lines in the file it is attached to, or
    in another file the lesson cites ({"file", "lines"}); the file without lines when the file's text could not
    be read (entry "unread"); None when the file does not have it."""
    value = entry["symbols"].get(name)
    if isinstance(value, dict):
        other = table["files"][value["file"]]
        return {**other}, value["lines"]
    if value:
        return entry, value
    if entry.get("unread"):
        return entry, None
    return None


def link_references(text: str, lesson: str, table: dict, *, resolver=None) -> tuple[str, list[dict]]:
    """The lesson with each code reference's path and symbol spans turned into permalinks, exactly where the
    references were found (a course name in a table's first column is not a symbol of the file next to it).

    Returns (markdown, links) where links lists {"line", "span", "url", "repo", "commit"}. A reference
    missing from the table raises KeyError naming it (the table must be regenerated). `resolver(ref)`, when
    given, finds a reference's entry instead of the table's key (a translated lesson resolves its references
    through its English original's: docs/build_site.py); a reference it returns None for stays plain text."""
    lines = text.splitlines(keepends=True)
    edits: dict[int, list[tuple[int, int, str, dict]]] = {}
    for ref in lesson_references(text):
        entry = resolve(table, lesson, ref) if resolver is None else resolver(ref)
        if entry is None and resolver is not None:
            continue
        if entry is None:
            raise KeyError(f"{lesson}:{ref.line}: no entry for the code reference `{ref.path}` "
                           f"({ref.context}) in docs/code_refs.json: run docs/resolve_code_refs.py")
        for line, start, end, name in ref.spans:
            if name is None:
                url, target = permalink(entry), entry
            else:
                where = symbol_target(table, entry, name)
                if where is None:      # a symbol the file does not have stays plain text
                    continue
                url, target = permalink(*where), where[0]
            edits.setdefault(line, []).append((start, end, url, target))
    links = []
    for line, spans in edits.items():
        s = lines[line - 1]
        for start, end, url, target in sorted(spans, reverse=True):
            code = s[start:end]
            s = s[:start] + f"[{code}]({url})" + s[end:]
            links.append({"line": line, "span": code.strip("`"), "url": url, "repo": target["repo"],
                          "commit": target["commit"], "unread": target["path"] if target.get("unread") else None})
        lines[line - 1] = s
    return "".join(lines), sorted(links, key=lambda l: l["line"])
