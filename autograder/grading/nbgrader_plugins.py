"""nbgrader preprocessors of the course (wired in nbgrader_config.py).

`HideTestTracebacks` runs when feedback is generated: in graded test cells it
replaces each error's traceback (whose frames quote the cell's source lines,
hidden tests included) by the error's type and message, which is what a
student needs: the checks' messages say which rank, tensor and element failed.
"""

from __future__ import annotations

from nbgrader.preprocessors import NbGraderPreprocessor


class HideTestTracebacks(NbGraderPreprocessor):
    """In graded test cells, keep `ename: evalue` of each error, drop the source-quoting frames."""

    def preprocess_cell(self, cell, resources, cell_index):
        meta = cell.get("metadata", {}).get("nbgrader", {})
        if cell.cell_type == "code" and meta.get("grade") and not meta.get("solution"):
            for output in cell.get("outputs", []):
                if output.get("output_type") == "error":
                    output["traceback"] = [f"{output.get('ename', 'Error')}: {output.get('evalue', '')}"]
        return cell, resources


class LimitOutputChars(NbGraderPreprocessor):
    """Cap every output's text at `max_chars` characters (nbgrader's LimitOutput counts lines: one 50 MB
    line would pass it and end up in the notebook and its feedback)."""

    from traitlets import Integer as _Integer

    max_chars = _Integer(20_000, help="characters kept of each output").tag(config=True)

    def _cap(self, text: str) -> str:
        if len(text) <= self.max_chars:
            return text
        return text[: self.max_chars] + f"\n... [{len(text) - self.max_chars} more characters not kept]\n"

    def preprocess_cell(self, cell, resources, cell_index):
        for output in cell.get("outputs", []):
            if "text" in output:
                text = output["text"] if isinstance(output["text"], str) else "".join(output["text"])
                output["text"] = self._cap(text)
            for mime, value in list(output.get("data", {}).items()):
                if mime.startswith("text/") and isinstance(value, (str, list)):
                    output["data"][mime] = self._cap(value if isinstance(value, str) else "".join(value))
            if output.get("output_type") == "error":
                output["evalue"] = self._cap(str(output.get("evalue", "")))
                output["traceback"] = [self._cap(line) for line in output.get("traceback", [])][:200]
        return cell, resources


# ---------------------------------------------------------------------------
# The course's grading command runs nbgrader in its worker and only the kernel in the sandbox
# ---------------------------------------------------------------------------

import os  # noqa: E402

from jupyter_client.manager import AsyncKernelManager  # noqa: E402
from nbgrader.preprocessors import Execute  # noqa: E402

# The submission being graded in this worker process (autograder.classrun sets it around nbgrader's
# autograde of one student): .sandbox, .kernel_dir, .socket_dir, .env and .after_cells(executor).
SESSION: dict = {}


class SandboxedKernelManager(AsyncKernelManager):
    """nbgrader's kernel, started in the submission's sandbox and reached over IPC sockets (the sandbox has
    no network of its own to share with the grader: a Unix socket in a folder both see needs none)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        session = SESSION["current"]
        self.transport = "ipc"
        self.ip = os.path.join(session.socket_dir, "k")
        self.connection_file = os.path.join(session.socket_dir, "kernel.json")

    async def _async_launch_kernel(self, kernel_cmd, **kw):
        session = SESSION["current"]
        env = {**(kw.get("env") or os.environ), **session.env}
        kw = {**kw, "env": env, "cwd": session.kernel_dir}
        session.km = self
        await super()._async_launch_kernel(session.sandbox.command(kernel_cmd, env=env, cwd=session.kernel_dir),
                                           **kw)


class SandboxedExecute(Execute):
    """nbgrader's Execute, with the kernel in the sandbox; once the last cell ran, and before the kernel is
    shut down, the session's `after_cells` runs (the trusted grader asks the live kernel to serve it).
    Outside the grading command (no session) it is nbgrader's Execute."""

    def preprocess(self, nb, resources=None, km=None):
        if SESSION.get("current") is not None:
            self.kernel_manager_class = SandboxedKernelManager
            self.shutdown_kernel = "immediate"  # the sandbox is torn down next: no 2 s of interpreter finalisation
        return super().preprocess(nb, resources, km)

    def preprocess_cell(self, cell, resources, index):
        cell, resources = super().preprocess_cell(cell, resources, index)
        session = SESSION.get("current")
        if session is not None and index == len(self.nb.cells) - 1:  # the kernel still lives here
            session.after_cells(self)
        return cell, resources

    def output(self, outs, msg, display_id, cell_index):
        """Keep at most `SESSION['current'].output_limit` characters of output in the worker's memory (a
        print loop would otherwise grow it until the cell's end; LimitOutputChars trims what is kept)."""
        session = SESSION.get("current")
        if session is not None:
            content = msg.get("content", {})
            size = len(str(content.get("text", ""))) + sum(len(str(v)) for v in content.get("data", {}).values())
            session.output_seen += size
            if session.output_seen > session.output_limit:
                if not session.output_dropped:
                    session.output_dropped = True
                    session.warn(f"the notebook printed more than {session.output_limit:,} characters; the rest "
                                 f"of its output was not kept")
                return None
        return super().output(outs, msg, display_id, cell_index)
