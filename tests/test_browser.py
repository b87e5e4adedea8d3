"""The student's first hour, in a real browser: the student package, the README's commands, JupyterLab.

    .venv/bin/python -m pytest -q -s tests/test_browser.py      # screenshots: build/screenshots/

1. The student package (`make student-package`) is unpacked and installed by
   running the commands of the README's "For students" section, exactly, in
   a fresh folder with a fresh virtualenv (no PYTHONPATH, nothing of this
   repository on the path); the last one, `jupyter lab`, is started headless
   (flags for a headless server added: no browser, a port, a token).
2. Debian's Chromium, driven by Playwright, opens each release notebook and
   runs it untouched: every graded cell fails and names its exercise, the
   kernel survives to the last cell.
3. The same notebook completed with the reference solutions (as a student
   would have filled it in): every visible test passes with its one line,
   no cell errs, every picture is an image in the page.
4. A lesson link in the notebook opens the lesson, rendered, in a tab.
5. The demo's wrong submission: its mistake fails in a verdict that names the
   exercise, without the course's frames; every other graded cell passes.

`make test` opens a sample (each kind of page on one or two notebooks: a browser page costs 10-25 s);
`make test-all` every notebook. Without Chromium the tests are skipped and say why (`.ci/run` installs it:
`apt-get install chromium`).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tarfile
import time
import urllib.request

import nbformat
import pytest

from conftest import sample
from course import ROOT, assignments

sys.path.insert(0, ROOT)
from autograder.authoring.package import PACKAGE_DIR, build_student_package, student_commands  # noqa: E402
from solutions import submissions  # noqa: E402

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
try:
    from playwright.sync_api import sync_playwright
except ImportError:  # pragma: no cover - the course extra installs it
    sync_playwright = None

# CI sets COURSE_REQUIRE_BROWSER=1 (.ci/run installs Chromium): there, a missing browser is a failure.
_REQUIRED = os.environ.get("COURSE_REQUIRE_BROWSER") == "1"
_MISSING = ("no Chromium on this machine: the browser test needs Debian's chromium "
            "(.ci/run installs it: apt-get install chromium)" if CHROMIUM is None else
            "playwright is not installed (pip install -e '.[course]')" if sync_playwright is None else "")
if _MISSING and _REQUIRED:
    raise RuntimeError(f"COURSE_REQUIRE_BROWSER=1 but {_MISSING}")
pytestmark = pytest.mark.skipif(bool(_MISSING), reason=_MISSING)

SHOTS = os.path.join(ROOT, "build", "screenshots")
# Chromium as root in a container, without the network: the flags of the machine notes
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]

# The notebook's state, read from JupyterLab's own model (window.jupyterapp: --LabApp.expose_app_in_browser).
_STATE_JS = """() => {
  const w = window.jupyterapp.shell.currentWidget;
  if (!w || !w.content || !w.content.model || !w.sessionContext || !w.sessionContext.session) return null;
  const kernel = w.sessionContext.session.kernel;
  const cells = [];
  const model = w.content.model.cells;
  for (let i = 0; i < model.length; i++) {
    const c = model.get(i);
    if (c.type !== 'code') continue;
    cells.push({count: c.executionCount, source: c.sharedModel.getSource(),
                nbgrader: c.getMetadata('nbgrader') || null, outputs: c.outputs.toJSON()});
  }
  return {kernel: kernel ? kernel.status : null, path: w.context.path, cells: cells};
}"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _clean_env(home: str) -> dict:
    """The environment of a student's shell: nothing of this repository, Jupyter's state kept in `home`."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "VIRTUAL_ENV", "JUPYTER_PATH", "JUPYTER_CONFIG_DIR", "JUPYTER_DATA_DIR")}
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep)
                                  if not p.startswith(os.path.join(ROOT, ".venv")))
    env["HOME"] = home
    env["PYTHONNOUSERSITE"] = "1"
    return env


@pytest.fixture(scope="module")
def student_folder(tmp_path_factory):
    """The student package unpacked and installed by the README's commands; (folder, lab command, env)."""
    tmp = tmp_path_factory.mktemp("student")
    archive = build_student_package(ROOT, str(tmp / "dist"))
    home = tmp / "home"
    home.mkdir()
    shutil.copy2(archive, tmp)
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        commands = student_commands(f.read())
    env = _clean_env(str(home))
    cwd, lab = str(tmp), None
    t0 = time.monotonic()
    for cmd in commands:
        if cmd.startswith("cd "):
            cwd = os.path.join(cwd, cmd[3:].strip())
            continue
        if "jupyter lab" in cmd:
            assert cmd is commands[-1], "the README's student commands should end with `jupyter lab`"
            lab = cmd
            continue
        proc = subprocess.run(cmd, shell=True, cwd=cwd, env=env, capture_output=True, text=True, timeout=1500)
        assert proc.returncode == 0, f"the README's command failed: {cmd}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    print(f"\nthe README's install commands took {time.monotonic() - t0:.0f} s")
    assert lab is not None, "the README's student commands do not start JupyterLab"
    assert os.path.basename(cwd) == PACKAGE_DIR and os.path.isdir(os.path.join(cwd, "release"))
    with tarfile.open(archive) as tar:
        names = tar.getnames()
    assert all(n == PACKAGE_DIR or n.startswith(PACKAGE_DIR + "/") for n in names), "one top-level folder"
    return cwd, lab, env


@pytest.fixture(scope="module")
def lab_url(student_folder, tmp_path_factory):
    folder, lab, env = student_folder
    port, token = _free_port(), "first-hour"
    settings = tmp_path_factory.mktemp("lab-settings")
    # every cell in the page (no virtual scrolling), so that pictures can be found as <img> elements
    tracker = settings / "@jupyterlab" / "notebook-extension"
    tracker.mkdir(parents=True)
    (tracker / "tracker.jupyterlab-settings").write_text(json.dumps({"windowingMode": "none"}))
    flags = [f"--port={port}", "--no-browser", f"--IdentityProvider.token={token}",
             f"--LabApp.user_settings_dir={settings}", f"--LabApp.workspaces_dir={settings / 'workspaces'}",
             "--LabApp.expose_app_in_browser=True"]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        flags.append("--allow-root")
    log = open(os.path.join(str(settings), "server.log"), "w")
    server = subprocess.Popen(lab + " " + " ".join(flags), shell=True, cwd=folder, env=env, stdout=log,
                              stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while True:
        try:
            urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=2)
            break
        except OSError:
            if server.poll() is not None or time.monotonic() > deadline:
                log.flush()
                raise AssertionError("JupyterLab did not start:\n" + open(log.name).read()[-3000:])
            time.sleep(0.5)
    yield base, token, folder
    os.killpg(server.pid, 15)
    try:
        server.wait(20)
    except subprocess.TimeoutExpired:
        os.killpg(server.pid, 9)
    log.close()


@pytest.fixture(scope="module")
def browser():
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield b
        b.close()


def _state(page):
    return page.evaluate(_STATE_JS)


def _open(browser, lab_url, path: str):
    base, token, _ = lab_url
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    page.goto(f"{base}/lab/tree/{path}?reset&token={token}")
    page.locator(".jp-MarkdownCell >> visible=true").first.wait_for(timeout=120_000)
    deadline = time.monotonic() + 120
    while True:
        st = _state(page)
        if st and st["kernel"] == "idle" and st["path"] == path:
            return page
        assert time.monotonic() < deadline, f"the kernel of {path} did not start: {st and st['kernel']}"
        time.sleep(0.2)


def _run_all(page, timeout: float = 600):
    """JupyterLab's own Run All (the tests are tagged raises-exception: the run goes on past a failure)."""
    page.evaluate("() => window.jupyterapp.commands.execute('notebook:run-all-cells')")
    t0 = time.monotonic()
    while True:
        time.sleep(0.5)
        st = _state(page)
        if st["kernel"] == "idle" and all(c["count"] is not None for c in st["cells"]):
            return st
        assert time.monotonic() - t0 < timeout, f"Run All did not finish in {timeout} s: {st['kernel']}"


def _text(outputs) -> str:
    parts = []
    for o in outputs:
        if o["output_type"] == "stream":
            parts.append(o["text"] if isinstance(o["text"], str) else "".join(o["text"]))
        elif o["output_type"] == "error":
            parts.append(f"{o['ename']}: {o['evalue']}")
    return "\n".join(parts)


def _graded(st) -> list:
    return [c for c in st["cells"] if (c["nbgrader"] or {}).get("grade")]


def _notebook(assignment: str) -> str:
    return os.path.basename(submissions.notebook_path("release", assignment))


@pytest.mark.parametrize("assignment", sample(assignments(), always={"04_context_parallel"}))
def test_the_untouched_notebook_names_every_unfinished_exercise(browser, lab_url, assignment):
    path = f"release/{assignment}/{_notebook(assignment)}"
    page = _open(browser, lab_url, path)
    st = _run_all(page)
    os.makedirs(SHOTS, exist_ok=True)
    page.screenshot(path=os.path.join(SHOTS, f"{assignment}-untouched.png"))
    graded = _graded(st)
    assert graded, "no graded cells in the page"
    for cell in graded:
        text = _text(cell["outputs"])
        assert "Exercise" in text and "is not done yet" in text and "is still the stub" in text, (
            f"{cell['nbgrader']['grade_id']} shows:\n{text[:1500]}")
    assert st["kernel"] == "idle" and st["cells"][-1]["count"] is not None  # the kernel survived every cell
    print(f"\n{assignment}: untouched, {len(graded)} graded cells name their exercise")
    page.close()


@pytest.mark.parametrize("assignment", sample(assignments(), always={"03_pipeline_parallel", "06_composition"}))
def test_the_completed_notebook_passes_and_draws_every_picture(browser, lab_url, assignment):
    base, token, folder = lab_url
    name = "completed_" + _notebook(assignment)
    nbformat.write(submissions.reference_submission(assignment), os.path.join(folder, "release", assignment, name))
    page = _open(browser, lab_url, f"release/{assignment}/{name}")
    st = _run_all(page)
    errors = [(c["nbgrader"] or {}).get("grade_id", c["source"][:60]) for c in st["cells"]
              if any(o["output_type"] == "error" for o in c["outputs"])]
    assert not errors, f"cells that failed: {errors}"
    stderr = [c["source"][:60] for c in st["cells"]
              if any(o["output_type"] == "stream" and o["name"] == "stderr" for o in c["outputs"])]
    assert not stderr, f"cells that wrote to stderr: {stderr}"
    for cell in _graded(st):
        lines = [line for line in _text(cell["outputs"]).splitlines() if line.strip()]
        assert len(lines) == 1 and lines[0].startswith("\u2713 Exercise") and "passed (" in lines[0], (
            cell["nbgrader"]["grade_id"], lines)
    pictures = [i for i, c in enumerate(st["cells"]) if "plot_" in c["source"] and not c["nbgrader"]]
    assert pictures, "the notebook draws no picture"
    for i in pictures:
        assert any("image/png" in o.get("data", {}) for o in st["cells"][i]["outputs"]), (
            f"picture cell {i} produced no PNG: {st['cells'][i]['outputs']}")
    images = page.locator(".jp-OutputArea-output img")
    assert images.count() >= len(pictures), "a picture is not drawn as an <img> in the page"
    images.nth(0).scroll_into_view_if_needed()
    assert images.nth(0).evaluate("img => img.naturalWidth") > 100  # a real image, decoded by the browser
    os.makedirs(SHOTS, exist_ok=True)
    page.screenshot(path=os.path.join(SHOTS, f"{assignment}-completed-picture.png"))
    print(f"\n{assignment}: completed, {len(_graded(st))} graded cells passed; {len(pictures)} picture(s) drawn")
    page.close()


@pytest.mark.parametrize("assignment", sample(assignments(), always={"01_data_parallel"}))
def test_a_lesson_link_opens_the_lesson(browser, lab_url, assignment):
    base, token, folder = lab_url
    page = _open(browser, lab_url, f"release/{assignment}/{_notebook(assignment)}")
    with open(os.path.join(folder, "assignments", assignment, "README.md"), encoding="utf-8") as f:
        title = f.readline().lstrip("# ").strip()
    page.locator(".jp-RenderedMarkdown a", has_text="README.md").first.click()
    heading = page.locator(".jp-RenderedMarkdown h1 >> visible=true", has_text=title.split(" ", 2)[-1][:20])
    heading.first.wait_for(timeout=30_000)
    tabs = [t.inner_text() for t in page.locator(".lm-TabBar-tabLabel").all()]
    assert "README.md" in tabs
    page.screenshot(path=os.path.join(SHOTS, f"{assignment}-lesson.png"))
    page.close()


@pytest.mark.parametrize("assignment", sample(assignments(), always={"05_expert_parallel"}))
def test_a_broken_notebook_fails_only_its_mistake_with_a_verdict(browser, lab_url, assignment):
    """The demo's wrong submission, run as a student would: its mistake fails visibly, in one verdict, and
    nothing else does (the other cells pass with their one line; no frames of the course's code)."""
    base, token, folder = lab_url
    (wrong,) = [m for m in submissions.mutants_of(assignment) if m.demo]
    name = "broken_" + _notebook(assignment)
    nbformat.write(submissions.mutant_submission(assignment, wrong), os.path.join(folder, "release", assignment, name))
    page = _open(browser, lab_url, f"release/{assignment}/{name}")
    st = _run_all(page)
    failed = []
    for cell in _graded(st):
        gid, text = cell["nbgrader"]["grade_id"], _text(cell["outputs"])
        errors = [o for o in cell["outputs"] if o["output_type"] == "error"]
        if not errors:
            lines = [line for line in text.splitlines() if line.strip()]
            assert len(lines) == 1 and lines[0].startswith("\u2713 Exercise"), (gid, lines)
            continue
        failed.append(gid)
        assert gid in wrong.must_fail, f"{gid} failed, but {wrong.name} ({wrong.why}) only breaks {sorted(wrong.must_fail)}:\n{text[:1500]}"
        assert "Exercise" in text and "FAILED" in text, (gid, text[:1500])
        frames = "\n".join(errors[0]["traceback"])
        assert "autograder/" not in frames and "site-packages" not in frames, (
            f"{gid}: the course's frames are shown to the student:\n{frames[:2000]}")
    assert failed, f"the wrong submission {wrong.name} ({wrong.why}) passes every visible test in JupyterLab"
    assert st["kernel"] == "idle" and st["cells"][-1]["count"] is not None
    page.screenshot(path=os.path.join(SHOTS, f"{assignment}-broken.png"))
    print(f"\n{assignment}: broken ({wrong.name}): {failed} failed with their verdict, the rest passed")
    page.close()
