"""Write docs/code_refs.json: every code reference of the lessons resolved to a file, a commit and lines.

    .venv/bin/python docs/resolve_code_refs.py --mirrors /path/to/mirrors      # a developer's step

Not part of the site build (which needs no network and only reads the JSON).
It reads bare git snapshots of the cited repositories, one per `owner+name/repo`
folder under --mirrors (NVIDIA/Megatron-LM, deepspeedai/DeepSpeed,
zhuzilin/ring-flash-attention, NVIDIA/TransformerEngine, deepseek-ai/DeepEP,
deepseek-ai/DualPipe, deepseek-ai/EPLB, pytorch/torchtitan,
sail-sg/zero-bubble-pipeline-parallelism),
each at the commit its snapshot holds (HEAD; a path the lessons cite at an
older commit is read there: PINNED). PyTorch is too large to snapshot: its
Python files are read from the installed torch (2.13.0, the course's version)
and linked at the commit that build reports (`torch.version.git_version`);
its C++ files, which the wheel does not hold, are linked at that commit
without line numbers (CPP_UNREAD).

A path as written (`mappings.py`) is resolved among the files whose path ends
with it, preferring the repository the table column or sentence names, then
the file in which most of the attached symbols are defined, then a directory
already used by the lesson. Symbols resolve to a definition's lines (a
class, function or method, a module or class attribute; `Class.method`,
`.method` after a class, C++ `Class::method`); failing that, to a definition
in another file the same lesson cites (a cell that names a second file's
symbol without its path); failing that, for flags, parameters and other
names, to the first line of the file that mentions them. A symbol found
nowhere is recorded as null: the site links its file, not the symbol. Prints
what it could not resolve.
"""

from __future__ import annotations

import argparse
import ast
import glob
import json
import os
import re
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)
from docs.coderefs import TABLE_PATH, lesson_references, ref_key  # noqa: E402

REPOS = ["NVIDIA/Megatron-LM", "deepspeedai/DeepSpeed", "zhuzilin/ring-flash-attention", "NVIDIA/TransformerEngine",
         "deepseek-ai/DeepEP", "deepseek-ai/DualPipe", "deepseek-ai/EPLB", "pytorch/torchtitan",
         "sail-sg/zero-bubble-pipeline-parallelism"]
# words of a column header or of the text near a path that name a repository
HINTS = {"megatron": "NVIDIA/Megatron-LM", "pytorch": "pytorch/pytorch", "torch": "pytorch/pytorch",
         "torchtitan": "pytorch/torchtitan", "deepspeed": "deepspeedai/DeepSpeed",
         "ring-flash-attention": "zhuzilin/ring-flash-attention", "transformerengine": "NVIDIA/TransformerEngine",
         "deepep": "deepseek-ai/DeepEP", "dualpipe": "deepseek-ai/DualPipe", "eplb": "deepseek-ai/EPLB"}
# paths written relative to a folder the lesson names in prose ("paths are under `megatron/core/`"), where the
# suffix rule alone picks the wrong file: (lesson, context, path as written) -> repo:path
OVERRIDES: dict[str, str] = {}
# paths the lessons cite as they were before a move: (repo, path) -> the commit to read them at
PINNED = {("pytorch/torchtitan", "torchtitan/models/llama3/infra/parallelize.py"): "76d5c72^"}
# repositories cited by name only (a link to the repository at its snapshot), never searched for paths
NAME_ONLY = {"sail-sg/zero-bubble-pipeline-parallelism"}
# PyTorch C++ files the lessons cite: not in the wheel, linked at torch's commit without line numbers
CPP_UNREAD = ["torch/csrc/distributed/c10d/reducer.cpp"]


def git(repo_dir: str, *args: str) -> str:
    return subprocess.run(["git", "-C", repo_dir, *args], check=True, capture_output=True, text=True).stdout


class Source:
    """The files of one repository at one commit."""

    def __init__(self, repo: str, commit: str, files: dict[str, callable], origin: str):
        self.repo, self.commit, self.files, self.origin = repo, commit, files, origin

    def text(self, path: str) -> str | None:
        read = self.files[path]
        return read() if read else None


def mirror_source(mirrors: str, repo: str) -> Source | None:
    d = os.path.join(mirrors, repo.replace("/", "+"), "repo")
    if not os.path.isdir(d):
        return None
    commit = git(d, "rev-parse", "HEAD").strip()
    names = git(d, "ls-tree", "-r", "--name-only", "HEAD").splitlines()
    files = {n: (lambda n=n: git(d, "show", f"HEAD:{n}")) for n in names}
    return Source(repo, commit, files, f"a snapshot of github.com/{repo} (its HEAD)")


def pinned_sources(mirrors: str) -> list[Source]:
    out = []
    for (repo, path), rev in PINNED.items():
        d = os.path.join(mirrors, repo.replace("/", "+"), "repo")
        commit = git(d, "rev-parse", rev).strip()
        out.append(Source(repo, commit, {path: (lambda d=d, c=commit, p=path: git(d, "show", f"{c}:{p}"))},
                          f"a snapshot of github.com/{repo} at {commit[:7]} (the lesson cites the path before "
                          f"it moved)"))
    return out


def torch_source() -> list[Source]:
    import torch

    base = os.path.dirname(os.path.dirname(torch.__file__))
    files = {}
    for path in glob.glob(os.path.join(os.path.dirname(torch.__file__), "**", "*.py"), recursive=True):
        rel = os.path.relpath(path, base)
        files[rel] = (lambda p=path: open(p, encoding="utf-8").read())
    out = [Source("pytorch/pytorch", torch.version.git_version, files,
                  f"torch {torch.__version__.split('+')[0]} as installed (torch.version.git_version)")]
    for path in CPP_UNREAD:
        files[path] = None   # exists at that commit; its text is not on this machine
    return out


# ---------------------------------------------------------------------------
# Symbols
# ---------------------------------------------------------------------------

def python_symbols(text: str) -> dict[str, tuple[int, int]]:
    """Qualified name -> (first line, last line) of classes, functions, methods and assignments."""
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return {}
    out: dict[str, tuple[int, int]] = {}

    def visit(body, prefix):
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                start = min([d.lineno for d in node.decorator_list] + [node.lineno])
                out.setdefault(prefix + node.name, (start, node.end_lineno))
                visit(node.body, prefix + node.name + ".")   # methods; nested functions as outer.inner
                if isinstance(node, ast.ClassDef):
                    # attributes set in methods (`self.x = ...`): Class.x at its first assignment
                    for sub in ast.walk(node):
                        if isinstance(sub, (ast.Assign, ast.AnnAssign)):
                            for t in (sub.targets if isinstance(sub, ast.Assign) else [sub.target]):
                                if (isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name)
                                        and t.value.id == "self"):
                                    out.setdefault(f"{prefix}{node.name}.{t.attr}", (sub.lineno, sub.end_lineno))
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for t in targets:
                    if isinstance(t, ast.Name):
                        out.setdefault(prefix + t.id, (node.lineno, node.end_lineno))
            elif isinstance(node, (ast.If, ast.Try, ast.With)):
                visit(node.body, prefix)
                for extra in getattr(node, "orelse", []), getattr(node, "finalbody", []):
                    visit(extra, prefix)
                for h in getattr(node, "handlers", []):
                    visit(h.body, prefix)
    visit(tree.body, "")
    return out


def _brace_end(lines: list[str], start: int) -> int:
    depth, seen = 0, False
    for i in range(start, len(lines)):
        for ch in re.sub(r'"(?:\\.|[^"\\])*"|//.*', "", lines[i]):
            if ch == "{":
                depth, seen = depth + 1, True
            elif ch == "}":
                depth -= 1
                if seen and depth == 0:
                    return i + 1
    return start + 1


def cpp_symbol(text: str, name: str) -> tuple[int, int] | None:
    """A C++ definition: `Class::method(` or `name(` at the start of a definition (not a call)."""
    lines = text.splitlines()
    short = name.split("::")[-1]
    pats = [re.compile(rf"^[\w:<>,*& ]*\b{re.escape(name)}\s*\(")] if "::" in name else []
    pats += [re.compile(rf"^[\w:<>,*& ]*\b\w+::{re.escape(short)}\s*\("), re.compile(rf"^[\w:<>,*& ]+\b{re.escape(short)}\s*\(")]
    for pat in pats:
        for i, line in enumerate(lines):
            if pat.match(line) and not line.rstrip().endswith(";"):
                # a definition has its body's brace before the next ';'
                j = i
                while j < len(lines) and "{" not in lines[j] and ";" not in lines[j]:
                    j += 1
                if j < len(lines) and "{" in lines[j]:
                    return (i + 1, _brace_end(lines, i))
    return None


def find_symbol(text: str, path: str, name: str, cls_hint: str | None) -> tuple[list[int] | None, str]:
    """([start, end] or None, how)."""
    bare = name.lstrip(".")
    if path.endswith(".py"):
        syms = python_symbols(text)
        candidates = [bare]
        if name.startswith(".") and cls_hint:
            candidates.insert(0, f"{cls_hint}.{bare}")
        if "." in bare:                        # `moe_utils.MoEAuxLossAutoScaler`: a module prefix
            candidates.append(bare.split(".", 1)[1])
        for c in candidates:
            if c in syms:
                return list(syms[c]), "definition"
        tails = [q for q in syms if q.endswith("." + bare.split(".")[-1]) and "." not in bare]
        if cls_hint:
            scoped = [q for q in tails if q.startswith(cls_hint + ".")]
            tails = scoped or tails
        if len(tails) == 1 or (tails and len({syms[t] for t in tails}) == 1):
            return list(syms[tails[0]]), "definition"
        if tails:
            return list(syms[sorted(tails, key=len)[0]]), "definition (shortest of several)"
    elif path.endswith((".cpp", ".h", ".cu", ".cuh")):
        found = cpp_symbol(text, bare)
        if found:
            return list(found), "definition"
    word = re.compile(rf"(?<![\w-]){re.escape(bare.split('.')[-1] if not bare.startswith('--') else bare)}(?![\w-])")
    for i, line in enumerate(text.splitlines(), start=1):
        if word.search(line):
            return [i, i], "first mention"
    return None, "not in the file"


# ---------------------------------------------------------------------------
# Paths
# ---------------------------------------------------------------------------

def hinted_repos(context: str, lesson_text: str, line: int) -> list[str]:
    words = context.lower()
    if context in ("source", "text", "code map: text") or context.startswith("code map: where"):
        # the sentence around the path: a few lines before it
        around = "\n".join(lesson_text.splitlines()[max(0, line - 3):line]).lower()
        words = around
    out = []
    for key, repo in HINTS.items():
        if key in words and repo not in out:
            out.append(repo)
    return out


def resolve_path(written: str, symbols: list[str], sources: list[Source], hints: list[str],
                 used_dirs: list[str]) -> tuple[Source, str, str] | None:
    """(source, full path, kind) for a path as written."""
    if re.fullmatch(r"[\w.-]+/[\w.-]+", written) and written in {s.repo for s in sources}:
        src = next(s for s in sources if s.repo == written)
        return src, "", "repo"
    want = written.rstrip("/")
    candidates = []
    for src in sources:
        if src.repo in NAME_ONLY:
            continue
        if written.endswith("/"):
            dirs = {os.path.dirname(p) for p in src.files}
            dirs |= {d for p in dirs for d in _parents(p)}
            for d in dirs:
                if d == want or d.endswith("/" + want):
                    candidates.append((src, d + "/", "dir"))
        else:
            for p in src.files:
                if p == want or p.endswith("/" + want):
                    candidates.append((src, p, "file"))
    if not candidates:
        return None

    def score(c):
        src, p, _ = c
        found = 0
        if symbols and p.endswith(".py") and src.files[p] is not None:
            syms = python_symbols(src.text(p))
            found = sum(1 for s in symbols if s.lstrip(".") in syms or any(q.endswith("." + s.lstrip(".").split(".")[-1]) for q in syms))
        hint = 0 if not hints else (len(hints) - hints.index(src.repo) if src.repo in hints else -1)
        same_dir = sum(1 for d in used_dirs if d == f"{src.repo}:{os.path.dirname(p)}")
        exact = 1 if p == want else 0
        return (hint >= 0, found, exact, same_dir, hint, -len(p))
    candidates.sort(key=score, reverse=True)
    return candidates[0]


def _parents(path: str):
    while path:
        yield path
        path = os.path.dirname(path)


def elsewhere(table: dict, targets: list[str], skip: str, name: str, sources: list[Source]) -> dict | None:
    """A definition of `name` in another file the lesson cites: {"file": target, "lines": [start, end]}."""
    for target in dict.fromkeys(targets):
        entry = table["files"][target]
        if target == skip or entry["kind"] != "file":
            continue
        src = next(s for s in sources if s.repo == entry["repo"] and s.commit == entry["commit"]
                   and entry["path"] in s.files)
        body = src.text(entry["path"])
        if body is None:
            continue
        lines, how = find_symbol(body, entry["path"], name, None)
        if how.startswith("definition"):
            return {"file": target, "lines": lines}
    return None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mirrors", required=True)
    ap.add_argument("--out", default=TABLE_PATH)
    args = ap.parse_args(argv)

    sources = [s for s in (mirror_source(args.mirrors, r) for r in REPOS) if s]
    sources = pinned_sources(args.mirrors) + sources + torch_source()
    table = {"about": "Generated by docs/resolve_code_refs.py; read by docs/build_site.py. Every code reference "
                      "of the lessons (docs/coderefs.py) -> a file at a commit, each symbol -> its lines.",
             "repositories": {}, "files": {}, "references": {}}
    problems = []
    lesson_targets: dict[str, list[str]] = {}
    lessons = sorted(glob.glob(os.path.join(ROOT, "assignments", "*", "*.md"))) + [
        os.path.join(ROOT, "assignments", "README.md")]
    texts = {os.path.relpath(p, ROOT): open(p, encoding="utf-8").read() for p in lessons}
    # pass 1: every path, so that a symbol may be looked up in a file cited anywhere in its lesson
    for lesson, text in texts.items():
        used_dirs: list[str] = []
        for ref in lesson_references(text):
            key = ref_key(lesson, ref)
            if key not in table["references"]:
                if key in OVERRIDES:
                    repo, path = OVERRIDES[key].split(":", 1)
                    src = next(s for s in sources if s.repo == repo and path in s.files)
                    hit = (src, path, "file")
                else:
                    hit = resolve_path(ref.path, ref.symbols, sources, hinted_repos(ref.context, text, ref.line),
                                       used_dirs)
                if hit is None:
                    problems.append(f"{lesson}:{ref.line}: `{ref.path}` ({ref.context}): no such file in any snapshot")
                    continue
                src, path, kind = hit
                target = f"{src.repo}:{path}"
                table["references"][key] = target
                table["repositories"].setdefault(src.repo, {})[src.commit] = src.origin
                if target not in table["files"]:
                    table["files"][target] = {"repo": src.repo, "path": path, "commit": src.commit,
                                              "kind": kind, "symbols": {}}
                used_dirs.append(f"{src.repo}:{os.path.dirname(path)}")
            lesson_targets.setdefault(lesson, []).append(table["references"][key])
    # pass 2: the symbols
    for lesson, text in texts.items():
        for ref in lesson_references(text):
            target = table["references"].get(ref_key(lesson, ref))
            if target is None or table["files"][target]["kind"] != "file":
                continue
            entry = table["files"][target]
            src = next(s for s in sources if s.repo == entry["repo"] and s.commit == entry["commit"]
                       and entry["path"] in s.files)
            body = src.text(entry["path"])
            if body is None:
                entry["unread"] = ("PyTorch is too large to snapshot here and its wheel holds no C++ source: "
                                   "the file is linked at torch's commit without line numbers")
                for name in ref.symbols:
                    entry["symbols"].setdefault(name, None)
                continue
            cls_hint = None
            for name in ref.symbols:
                if name in entry["symbols"]:
                    continue
                lines, how = find_symbol(body, entry["path"], name, cls_hint)
                if how != "definition" and not name.startswith("--"):
                    moved = elsewhere(table, lesson_targets[lesson], target, name, sources)
                    if moved:
                        entry["symbols"][name] = moved
                        continue
                if lines is None and name.startswith("--"):
                    lines, how = find_symbol(body, entry["path"], name[2:].replace("-", "_"), None)
                entry["symbols"][name] = lines
                if lines is None:
                    problems.append(f"{lesson}:{ref.line}: `{name}` not in {target}")
                if "." in name.lstrip(".") and not name.startswith("."):
                    cls_hint = name.lstrip(".").split(".")[0]
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(table, f, indent=1, sort_keys=True, ensure_ascii=False)
        f.write("\n")
    n_sym = sum(len(e["symbols"]) for e in table["files"].values())
    n_res = sum(1 for e in table["files"].values() for v in e["symbols"].values() if v)
    n_moved = sum(1 for e in table["files"].values() for v in e["symbols"].values() if isinstance(v, dict))
    print(f"{len(table['references'])} references -> {len(table['files'])} files; "
          f"symbols: {n_res} of {n_sym} with lines ({n_moved} in another file the lesson cites); wrote {os.path.relpath(args.out, ROOT)}")
    for p in problems:
        print("  " + p)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
