"""Canvas's "Download Submissions" zip through nbgrader's zip_collect, its LATE marker kept.

    # put the zip in downloaded/02_tensor_parallel/archive/, then
    .venv/bin/nbgrader zip_collect 02_tensor_parallel   # -> submitted/<login>/02_tensor_parallel/

nbgrader_config.py names CanvasCollectorPlugin as zip_collect's collector.
Canvas names each file <login>_[LATE_]<user id>_<submission id>_<the
student's file name> and gives no submission time; the collector's
`named_regexp` captures the marker as the group `late`, and the students it
marks are written to downloaded/<assignment>/canvas-late.json (login ->
Canvas's file name), anew on each zip_collect. `export --csv`
(autograder.exports) reads them into its `late` column.
"""

from __future__ import annotations

import json
import os

from nbgrader.plugins.zipcollect import FileNameCollectorPlugin

__all__ = ["CanvasCollectorPlugin", "late_students", "LEDGER"]

LEDGER = "canvas-late.json"


def late_students(root: str, assignment: str) -> set[str]:
    """The logins Canvas marked LATE in the last zip_collect of `assignment` (none without one)."""
    try:
        with open(os.path.join(root, "downloaded", assignment, LEDGER), encoding="utf-8") as f:
            return set(json.load(f))
    except FileNotFoundError:
        return set()


class CanvasCollectorPlugin(FileNameCollectorPlugin):
    """nbgrader zip_collect's file-name collector that also records Canvas's LATE marker (see the module doc)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        app = self.parent
        self._ledger = app._format_collect_path(LEDGER) if app is not None else None
        self._late: dict[str, str] = {}
        self._save()

    def _save(self) -> None:
        if self._ledger is None:
            return
        os.makedirs(os.path.dirname(self._ledger), exist_ok=True)
        with open(self._ledger, "w", encoding="utf-8") as f:
            json.dump(self._late, f, indent=1, sort_keys=True)

    def collect(self, submitted_file: str):
        info = super().collect(submitted_file)
        if info and info.pop("late", None):
            self._late[info["student_id"]] = os.path.basename(submitted_file)
            self._save()
        return info
