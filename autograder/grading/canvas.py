"""Canvas's "Download Submissions" zip through nbgrader's zip_collect, its LATE marker kept.

    # put the zip in downloaded/02_tensor_parallel/archive/, then
    .venv/bin/nbgrader zip_collect 02_tensor_parallel   # -> submitted/<login>/02_tensor_parallel/

nbgrader_config.py names CanvasCollectorPlugin as zip_collect's collector.
Canvas names each file <login>_[LATE_]<user id>_<submission id>_<the
student's file name> and gives no submission time; the collector's
`named_regexp` captures the marker as the group `late` and Canvas's user id
as the group `canvas_user_id`. The students it marks are written to
downloaded/<assignment>/canvas-late.json (login -> Canvas's file name), and
every student's Canvas user id to downloaded/<assignment>/canvas-users.json
(login -> the id: the `ID` column of Canvas's gradebook), both anew on each
zip_collect. `export --csv` (autograder.grading.exports) reads the first into
its `late` column; `export --canvas` (autograder.grading.lms) the second, to
name each student in Canvas's gradebook import.
"""

from __future__ import annotations

import json
import os

from nbgrader.plugins.zipcollect import FileNameCollectorPlugin

__all__ = ["CanvasCollectorPlugin", "late_students", "canvas_user_ids", "LEDGER", "USERS"]

LEDGER = "canvas-late.json"
USERS = "canvas-users.json"


def late_students(root: str, assignment: str) -> set[str]:
    """The logins Canvas marked LATE in the last zip_collect of `assignment` (none without one)."""
    try:
        with open(os.path.join(root, "downloaded", assignment, LEDGER), encoding="utf-8") as f:
            return set(json.load(f))
    except FileNotFoundError:
        return set()


def canvas_user_ids(root: str, assignment: str) -> dict[str, str]:
    """login -> Canvas user id, from the last zip_collect of every assignment (`assignment`'s own first)."""
    folder = os.path.join(root, "downloaded")
    names = sorted(os.listdir(folder)) if os.path.isdir(folder) else []
    out: dict[str, str] = {}
    for name in [n for n in names if n != assignment] + [assignment]:  # the assignment's own download last: it wins
        try:
            with open(os.path.join(folder, name, USERS), encoding="utf-8") as f:
                out.update({str(k): str(v) for k, v in json.load(f).items()})
        except (FileNotFoundError, NotADirectoryError, ValueError, AttributeError):
            continue
    return out


class CanvasCollectorPlugin(FileNameCollectorPlugin):
    """nbgrader zip_collect's file-name collector that also records Canvas's LATE marker (see the module doc)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        app = self.parent
        self._ledger = app._format_collect_path(LEDGER) if app is not None else None
        self._users_ledger = app._format_collect_path(USERS) if app is not None else None
        self._late: dict[str, str] = {}
        self._users: dict[str, str] = {}
        self._save()

    def _save(self) -> None:
        for path, data in ((self._ledger, self._late), (self._users_ledger, self._users)):
            if path is None:
                continue
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w", encoding="utf-8") as f:
                json.dump(data, f, indent=1, sort_keys=True)

    def collect(self, submitted_file: str):
        info = super().collect(submitted_file)
        if not info:
            return info
        late, user_id = info.pop("late", None), info.pop("canvas_user_id", None)
        if late:
            self._late[info["student_id"]] = os.path.basename(submitted_file)
        if user_id:
            self._users[info["student_id"]] = user_id
        if late or user_id:
            self._save()
        return info
