"""Verdicts the student's own process could have decided: find the notebooks that reach into it, flag their cells.

    findings = scan_notebook(_executable_cells(submitted_nb), source_nb)  # in the grader: the code, read as text
    guard = Guard()                                        # in the zygote, before the student's cells run
    guard.changed()                                        # ... after them: what they replaced, by name

Every check's verdict is decided in the grader (autograder.grading.trusted),
from what the student's processes send back: outputs, the communication
ledger, and for the argument-error checks the type and message of the error
the student's function raised. That data is made next to the student's code.
A notebook that replaces the course's runtime in its own process (the
runner, the ledger, the framing of replies, the unpickler, builtins) can
forge it: an unfinished notebook whose cell made `run_distributed` return
"ValueError naming every size" for each invalid call scored the argument-error
cells' points. Two defences:

1. The zygote serves the grader with the runtime it had *before* the
   student's cells ran (`Guard.tools`: the runner, the exception record, the
   framing, the serialisation, bound then): rebinding any of them by name in
   the notebook changes nothing the grader receives.
2. Whatever the notebook did to the process, the cell is **flagged** when
   its points could rest on a forgery, for an instructor to review:
   - `scan_notebook` (the trusted side: the grader reads the student's code
     as text, never runs it) finds code that replaces or reaches into
     another module's functions, classes or frames: an attribute of an
     imported module or class assigned (`dist.run_distributed = f`,
     `CommLedger.__exit__ = f`), `setattr` on one, `__code__`,
     `__globals__`, `sys.modules`, `builtins`, frames (`sys._getframe`,
     `f_locals`), `gc.get_referrers`, `ctypes`, import hooks, and the ways
     to hide code from a reader (`exec`, `eval`, `compile`, `__import__`,
     `importlib`, `marshal`, unpickling);
   - `Guard.changed` (in the zygote, after the cells and after every
     request) names each function or class of the course's runtime, of
     `builtins`, of the pickling and framing modules that is no longer the
     object (or the code) it was before the student's cells ran. It runs in
     the student's process, so a notebook determined to hide could silence
     it; it catches what the text scan cannot see (code loaded at run time).
   The grader flags every cell that earned points in such a notebook
   (`flag_verdicts`), with the first finding as the reason; the points stay
   (an instructor decides): a flag costs an honest notebook nothing but a look.
"""

from __future__ import annotations

import ast
import sys

__all__ = ["scan_notebook", "scan_source", "Guard", "flag_verdicts", "flag_reason"]


# ---------------------------------------------------------------------------
# The trusted side: the student's code, read as text
# ---------------------------------------------------------------------------

# attributes through which code reaches another function's code, globals or frames
_REACHING = {"__code__", "__globals__", "__closure__", "__builtins__", "__defaults__", "__kwdefaults__",
             "__subclasses__", "__setattr__", "__delattr__", "__getattribute__", "__import__", "__loader__",
             "f_locals", "f_globals", "f_builtins", "f_back", "f_code", "tb_frame", "gi_frame", "cr_frame",
             "ag_frame", "co_code"}
# modules whose import alone means the notebook reaches into the interpreter (or hides its code)
_MODULES = {"builtins": "the interpreter's builtins", "ctypes": "raw memory (ctypes)", "_ctypes": "raw memory (ctypes)",
            "importlib": "imports by computed name (importlib)", "marshal": "code objects (marshal)",
            "__builtin__": "the interpreter's builtins"}
# module.attribute uses that reach into the process
_CALLS = {("sys", "modules"): "the table of loaded modules (sys.modules)",
          ("sys", "_getframe"): "another function's frame (sys._getframe)",
          ("sys", "settrace"): "a trace hook (sys.settrace)", ("sys", "setprofile"): "a profile hook (sys.setprofile)",
          ("sys", "meta_path"): "an import hook (sys.meta_path)", ("sys", "path_hooks"): "an import hook",
          ("sys", "addaudithook"): "an audit hook", ("threading", "settrace"): "a trace hook (threading.settrace)",
          ("inspect", "currentframe"): "frames (inspect.currentframe)", ("inspect", "stack"): "frames (inspect.stack)",
          ("inspect", "getouterframes"): "frames (inspect.getouterframes)",
          ("inspect", "getmodule"): "another module (inspect.getmodule)",
          ("gc", "get_referrers"): "every object's referrers (gc.get_referrers)",
          ("gc", "get_referents"): "objects' referents (gc.get_referents)",
          ("gc", "get_objects"): "every object (gc.get_objects)",
          ("types", "FunctionType"): "a function built from a code object (types.FunctionType)",
          ("types", "CodeType"): "a code object (types.CodeType)", ("types", "ModuleType"): "a fake module",
          ("pickle", "loads"): "unpickling (it runs code)", ("pickle", "load"): "unpickling (it runs code)",
          ("cloudpickle", "loads"): "unpickling (it runs code)", ("cloudpickle", "load"): "unpickling (it runs code)",
          ("dill", "loads"): "unpickling (it runs code)", ("dill", "load"): "unpickling (it runs code)"}
# builtins that run or build code from text, or reach a module's namespace
_BUILTINS = {"exec": "code run from a string (exec)", "eval": "code run from a string (eval)",
             "compile": "code compiled from a string (compile)", "__import__": "an import by computed name"}


# dunder attributes a wrapper sets on its own function (functools.wraps does): no behaviour replaced
_HARMLESS_DUNDERS = {"__name__", "__qualname__", "__doc__", "__module__", "__wrapped__", "__signature__",
                     "__annotations__"}
# builtins that only read what a module is given to them
_READERS = {"getattr", "hasattr", "isinstance", "issubclass", "print", "repr", "str", "dir", "type", "id", "len",
            "format", "callable", "sorted", "list"}


def _module_of(imports: dict, node) -> str | None:
    """The module an expression is rooted at, when its root name was bound by an import (or an alias of one),
    or it starts from `__import__("x")`."""
    while isinstance(node, (ast.Attribute, ast.Subscript, ast.Call)):
        if _literal_import(node):
            return node.args[0].value
        node = node.func if isinstance(node, ast.Call) else node.value
    return imports.get(node.id) if isinstance(node, ast.Name) else None


def _literal_import(node) -> bool:
    """`__import__("math")`: an import written out (nothing hidden from a reader)."""
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "__import__"
            and len(node.args) >= 1 and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str))


def _imports_of(tree, imports: dict) -> None:
    """Names bound by imports (`import torch.distributed as dist` -> dist: torch.distributed), and names
    assigned from them (`m = dist`, `run = dist.run_distributed`)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                imports[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
                imports.setdefault("<modules>", set()).add(a.asname or a.name.split(".")[0])
        elif isinstance(node, ast.ImportFrom) and node.module:
            for a in node.names:
                if a.name != "*":
                    imports[a.asname or a.name] = f"{node.module}.{a.name}"
    for _ in range(3):  # aliases of aliases
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign) and isinstance(node.value, (ast.Name, ast.Attribute)):
                module = _module_of(imports, node.value)
                if module:
                    for t in node.targets:
                        if isinstance(t, ast.Name) and t.id not in imports:
                            imports[t.id] = module


def _is_data(node) -> bool:
    """A literal (a number, a string, a flag, a tuple of them): setting it replaces no behaviour."""
    if isinstance(node, ast.Constant):
        return True
    if isinstance(node, (ast.Tuple, ast.List)):
        return all(_is_data(e) for e in node.elts)
    if isinstance(node, ast.UnaryOp):
        return _is_data(node.operand)
    return False


def scan_source(src: str, imports: dict) -> list[tuple[int, str]]:
    """(line, why) of each place in one cell's code that replaces or reaches into the process's machinery.
    `imports`: the names the notebook's cells bound by import (updated with this cell's)."""
    try:
        tree = ast.parse(src)
    except SyntaxError:
        return []  # the cell failed in the student's process too: it replaced nothing
    except (RecursionError, MemoryError, ValueError) as exc:
        return [(0, f"code the grader could not read ({type(exc).__name__})")]
    _imports_of(tree, imports)
    found: list[tuple[int, str]] = []

    def add(node, why):
        found.append((getattr(node, "lineno", 0), why))

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                top = a.name.split(".")[0]
                if top in _MODULES:
                    add(node, f"imports {_MODULES[top]}")
        elif isinstance(node, ast.ImportFrom) and node.module:
            if node.module.split(".")[0] in _MODULES:
                add(node, f"imports {_MODULES[node.module.split('.')[0]]}")
            for a in node.names:
                if (node.module.split(".")[-1], a.name) in _CALLS:
                    add(node, f"imports {_CALLS[(node.module.split('.')[-1], a.name)]}")
        elif isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Delete)):
            targets = node.targets if isinstance(node, (ast.Assign, ast.Delete)) else [node.target]
            value = getattr(node, "value", None)
            for t in targets:
                for sub in ast.walk(t):
                    if isinstance(sub, ast.Attribute) and isinstance(sub.ctx, (ast.Store, ast.Del)):
                        module = _module_of(imports, sub.value)
                        if module and not (value is not None and _is_data(value)):
                            add(node, f"replaces {module}'s {sub.attr} (an attribute of something it imported)")
                        elif sub.attr in _REACHING or sub.attr.startswith("__") and sub.attr.endswith("__") \
                                and sub.attr not in _HARMLESS_DUNDERS:
                            add(node, f"assigns {sub.attr} (replaces a method or the class of an object)")
                    elif isinstance(sub, ast.Subscript) and isinstance(sub.ctx, (ast.Store, ast.Del)):
                        inner = sub.value
                        if isinstance(inner, ast.Attribute) and inner.attr == "__dict__" and _module_of(imports, inner):
                            add(node, f"writes into {_module_of(imports, inner)}'s namespace (__dict__)")
        elif isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Name):
                if func.id in ("setattr", "delattr") and node.args and _module_of(imports, node.args[0]):
                    add(node, f"{func.id} on {_module_of(imports, node.args[0])} (something it imported)")
                elif func.id == "vars" and node.args and _module_of(imports, node.args[0]):
                    add(node, f"reaches {_module_of(imports, node.args[0])}'s namespace (vars)")
                elif _literal_import(node):
                    top = node.args[0].value.split(".")[0]
                    if top in _MODULES:
                        add(node, f"imports {_MODULES[top]}")
                elif func.id in _BUILTINS and func.id not in imports:
                    add(node, _BUILTINS[func.id])
            modules = imports.get("<modules>", set())
            passed = [a for a in list(node.args) + [k.value for k in node.keywords]
                      if isinstance(a, ast.Name) and a.id in modules]
            if passed and not (isinstance(func, ast.Name) and func.id in _READERS):
                add(node, f"hands the module {imports.get(passed[0].id)} to other code (which can replace its "
                          f"functions)")
            if isinstance(func, ast.Attribute) and func.attr == "load" and _module_of(imports, func) == "torch" \
                    and not any(k.arg == "weights_only" and isinstance(k.value, ast.Constant) and k.value.value is True
                                for k in node.keywords):
                add(node, "torch.load without weights_only=True (unpickling runs code)")
        elif isinstance(node, ast.Attribute):
            module = _module_of(imports, node.value)
            key = ((module or "").split(".")[-1], node.attr)
            if node.attr in _REACHING:
                add(node, f"uses {node.attr} (another function's code, globals or frames)")
            elif node.attr == "__dict__" and module:
                add(node, f"reaches {module}'s namespace (__dict__)")
            elif module and key in _CALLS:
                add(node, f"uses {_CALLS[key]}")
        elif isinstance(node, ast.Name) and node.id in ("__builtins__", "__builtin__", "__loader__"):
            add(node, f"uses {node.id}")
    return sorted(set(found))


def _meta(cell) -> dict:
    meta = (cell.get("metadata", {}) or {}).get("nbgrader", {}) or {}
    return meta if isinstance(meta, dict) else {}


def _src(cell) -> str:
    s = cell.get("source", "")
    return "".join(s) if isinstance(s, list) else str(s)


def scan_notebook(cells: list, source: dict) -> list[str]:
    """What in the student's code could forge what its processes report, one line each: `<cell>, line N:
    <the line>: <why>`. `cells`: (file name, code) of the cells the student's process runs
    (`trusted._executable_cells(submitted)`); the student's code among them: answer cells, given cells the
    student changed, and every other code cell except the course's own (as released in `source`)."""
    course_given = {_src(c) for c in source.get("cells", []) if c.get("cell_type") == "code"
                    and (_meta(c).get("locked") and not _meta(c).get("solution") or not _meta(c))}
    imports: dict = {}
    out = []
    for filename, src in cells:
        if src in course_given or not src.strip():
            _imports_of(_parse(src), imports)  # the course's own cells: the names they import count
            continue
        lines = src.splitlines()
        try:
            found = scan_source(src, imports)
        except Exception as exc:  # noqa: BLE001 - a cell the scan cannot read is one to review
            found = [(0, f"code the grader could not scan ({type(exc).__name__})")]
        for line, why in found:
            text = lines[line - 1].strip() if 0 < line <= len(lines) else ""
            where = filename[1:-1] if filename.startswith("<") else filename
            out.append(f"{where}, line {line}: `{text[:120]}`: {why}")
    return out


def _parse(src: str):
    try:
        return ast.parse(src)
    except (SyntaxError, RecursionError, MemoryError, ValueError):
        return ast.Module(body=[], type_ignores=[])


def flag_reason(findings: list[str], tampered: list[str]) -> str | None:
    """The reason a notebook's cells are flagged, or None."""
    if not findings and not tampered:
        return None
    first = findings[0] if findings else f"in its process, {tampered[0]}"
    more = len(findings) + len(tampered) - 1
    return ("the notebook's code can change what its own processes report to the checks (" + first
            + (f"; {more} more" if more > 0 else "") + "): points that rest on what they reported could be "
            "forged; review the notebook")


def flag_verdicts(verdicts: dict, findings: list[str], tampered: list[str]) -> None:
    """Flag (`CellVerdict.flag`) every cell that earned points, when the notebook could have forged them."""
    reason = flag_reason(findings, tampered)
    if reason is None:
        return
    for v in verdicts.values():
        if v.points > 0:
            v.flag = reason


# ---------------------------------------------------------------------------
# The zygote's side (the student's process): the runtime as it was before the student's cells ran
# ---------------------------------------------------------------------------

# modules whose functions and classes serve the grader (framing, pickling, the runner), besides the course's
_WATCHED = ("builtins", "os", "posix", "io", "json", "json.decoder", "json.encoder", "struct", "select", "pickle",
            "_pickle", "copyreg", "types", "functools", "dataclasses", "traceback", "linecache", "multiprocessing",
            "multiprocessing.context", "multiprocessing.process", "multiprocessing.popen_fork", "subprocess",
            "signal", "shutil", "tempfile", "cloudpickle", "cloudpickle.cloudpickle", "torch.serialization",
            "torch._weights_only_unpickler")


# the course's runtime, imported before the student's cells (the checks' modules, imported by the notebook's
# set-up cell, are baselined when first seen: after the cell that imported them)
_RUNTIME = ("autograder.runtime", "autograder.runtime.dist", "autograder.runtime.ledger", "autograder.runtime.report",
            "autograder.runtime.compare", "autograder.runtime.agreement", "autograder.runtime.plaindata",
            "autograder.runtime.gpu", "autograder.runtime.pool", "autograder.grading.trusted",
            "autograder.grading.redact")


def _watched(name: str) -> bool:
    return name == "autograder" or name.startswith("autograder.") or name in _WATCHED


class Guard:
    """In the zygote, before the student's cells run: the tools that serve the grader (bound now), and a
    baseline of what every watched module holds (its functions with their code, its classes' methods)."""

    def __init__(self):
        import importlib

        for name in _WATCHED + _RUNTIME:
            try:
                importlib.import_module(name)
            except ImportError:
                pass
        import cloudpickle
        import dataclasses
        import json

        import torch

        from autograder.runtime import dist, pool

        self.tools = {"run_distributed": dist.run_distributed, "DistributedError": dist.DistributedError,
                      "RankPool": pool.RankPool,
                      "InconclusiveRun": dist.InconclusiveRun,
                      "exception_record": dist._exception_record, "loads": cloudpickle.loads,
                      "json_dumps": json.dumps, "asdict": dataclasses.asdict, "save": torch.save}
        self._modules: dict = {}  # name -> the module object
        self._base: list = []  # (key, the namespace it is in, its name there, the object, its code)
        self._seen: list[str] = []
        self._take()

    def _take(self) -> None:
        """Baseline every watched module not seen yet (the course's modules imported later: when first seen)."""
        import types

        self._count = len(sys.modules)
        for name, module in list(sys.modules.items()):
            if module is None or not _watched(name) or name in self._modules:
                continue
            self._modules[name] = module
            space = vars(module)
            for attr, obj in list(space.items()):
                if isinstance(obj, types.ModuleType) or not callable(obj):
                    continue
                self._base.append((f"{name}.{attr}", space, attr, obj, getattr(obj, "__code__", None)))
                if isinstance(obj, type) and getattr(obj, "__module__", None) == name and name != "builtins":
                    for k, v in list(vars(obj).items()):
                        if callable(v) or isinstance(v, (staticmethod, classmethod, property)):
                            self._base.append((f"{name}.{attr}.{k}", obj, k, v, getattr(v, "__code__", None)))
        torch = sys.modules.get("torch")
        if torch is not None and "torch" not in self._modules:
            self._modules["torch"] = torch
            for attr in ("save", "load"):
                obj = getattr(torch, attr)
                self._base.append((f"torch.{attr}", vars(torch), attr, obj, getattr(obj, "__code__", None)))

    def changed(self) -> list[str]:
        """What is no longer as it was: `autograder.runtime.dist.run_distributed (replaced)`, `... (its code
        replaced)`, `sys.modules['x'] (replaced)`; each once, in the order first seen (at most 20)."""
        try:
            found = self._compare()
        except Exception as exc:  # noqa: BLE001 - a comparison the process broke is itself a finding
            found = [f"the runtime could not be compared ({type(exc).__name__})"]
        for f in found:
            if f not in self._seen:
                self._seen.append(f)
        return [str(f)[:200] for f in self._seen[:20]]

    def _compare(self) -> list[str]:
        found = [f"sys.modules[{name!r}] (replaced)" for name, module in self._modules.items()
                 if sys.modules.get(name) is not module]
        missing = object()
        for key, space, attr, obj, code in self._base:
            now = space.get(attr, missing) if isinstance(space, dict) else vars(space).get(attr, missing)
            if now is not obj:
                found.append(f"{key} ({'removed' if now is missing else 'replaced'})")
            elif code is not None and getattr(now, "__code__", None) is not code:
                found.append(f"{key} (its code replaced)")
        if len(sys.modules) != self._count:  # modules imported since: baselined as they are now
            self._take()
        return found
