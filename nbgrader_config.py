"""nbgrader configuration of the course (the course root is this folder).

Build:  make build          (source/ from assignments/*/_build_nb.py, then release/)
Grade:  make demo, or .venv/bin/python -m autograder.grade autograde ASSIGNMENT
"""

import os

c = get_config()  # noqa: F821 - provided by nbgrader

HERE = os.path.dirname(os.path.abspath(__file__))

c.CourseDirectory.root = HERE
c.CourseDirectory.course_id = "llm-parallelism"
# Submissions and grading outputs live in the course root; the gradebook is sqlite.
c.CourseDirectory.db_url = "sqlite:///" + os.path.join(HERE, "gradebook.db")

# One fixed wording for every stub, so students can search for it.
c.ClearSolutions.code_stub = {
    "python": "# TODO: implement (see the task description above).\nraise NotImplementedError()",
}
c.ClearSolutions.text_stub = "YOUR ANSWER HERE"

# Per-cell timeout. The runner's own timeout (20 s per distributed run, and a
# check stops at its first failure) fires long before this one, so a hung
# student function is reported with each rank's stack instead of killing the cell.
c.Execute.timeout = 300
c.Execute.interrupt_on_timeout = True
# Stop the kernel at once after the last cell: a graceful shutdown spends about 2 s per notebook finalising an
# interpreter that imported torch, and nothing is left to save.
c.Execute.shutdown_kernel = "immediate"

# nbgrader scores a test cell 0 when it has ANY stderr output (a FutureWarning
# of torch, a C++ log line of c10d). Our checks fail by raising, never by
# printing, so stderr is never a verdict: drop it from graded outputs.
c.IgnorePattern.enabled = True
c.IgnorePattern.pattern = r"[\s\S]*"

# Student output can be huge (a debug print in a loop, one 50 MB line); keep notebooks small.
c.LimitOutput.max_lines = 200
# nbgrader's autograde steps (nbgrader/converters/autograde.py), with a character cap next to LimitOutput.
from nbconvert.preprocessors import ClearMetadataPreprocessor  # noqa: E402
from nbgrader.preprocessors import (  # noqa: E402
    AssignLatePenalties, CheckCellMetadata, Execute, IgnorePattern, LimitOutput, SaveAutoGrades,
)

from autograder.grading.nbgrader_plugins import LimitOutputChars  # noqa: E402

c.Autograde.autograde_preprocessors = [Execute, IgnorePattern, ClearMetadataPreprocessor, LimitOutputChars,
                                       LimitOutput, SaveAutoGrades, AssignLatePenalties, CheckCellMetadata]

# Feedback shows each failure's message but no hidden test: hidden regions are
# removed from the test cells, and tracebacks (whose frames quote the cell's
# source lines) are reduced to "ErrorType: message".
from nbconvert.preprocessors import CSSHTMLHeaderPreprocessor  # noqa: E402
from nbgrader.preprocessors import ClearHiddenTests, GetGrades  # noqa: E402

from autograder.grading.nbgrader_plugins import HideTestTracebacks, SafeFeedbackExporter, WrapOutputLines  # noqa: E402

# WrapOutputLines after CSSHTMLHeaderPreprocessor (which sets the page's inlined CSS): long lines wrap.
c.GenerateFeedback.preprocessors = [GetGrades, ClearHiddenTests, HideTestTracebacks, CSSHTMLHeaderPreprocessor,
                                    WrapOutputLines]
# The instructor opens the feedback in a browser: what the student wrote (markdown, the HTML of outputs) is made
# inert there (no script, event attribute or javascript: link). The grading command sets it whatever this says.
c.GenerateFeedback.exporter_class = SafeFeedbackExporter

# An LMS download: `nbgrader zip_collect ASSIGNMENT` collects a Canvas "Download Submissions" zip put in
# downloaded/ASSIGNMENT/archive/ into submitted/<login>/ASSIGNMENT/. Canvas names each file
# <login>_[LATE_]<user id>_<submission id>_<the student's file name> (README, "For instructors"); the collector
# keeps the LATE marker (downloaded/ASSIGNMENT/canvas-late.json) for `export --csv`, and each student's Canvas user
# id (downloaded/ASSIGNMENT/canvas-users.json) for `export --canvas`, Canvas's gradebook import.
c.ZipCollectApp.collector_plugin = "autograder.grading.canvas.CanvasCollectorPlugin"
c.FileNameCollectorPlugin.named_regexp = (r".*/(?P<student_id>[a-z0-9]+)_(?P<late>LATE_)?(?P<canvas_user_id>\d+)_\d+_"
                                          r"(?P<file_id>[^/]+)$")
