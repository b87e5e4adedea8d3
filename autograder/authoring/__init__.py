"""Building the course (instructor only; not in the student package).

    nbbuild     NotebookBuilder, source_of: assignments/*/_build_nb.py write the nbgrader source notebooks with it,
                solution cells cut from solutions/<dim>/ (make build)
    package     the student archive (make student-package) and a Gradescope autograder zip

Used by the assignments' builders and by the grading command line
(autograder.grading.cli: `student-package`, `gradescope-package`). Imports
nothing from the course's other layers: what it writes names them as text.
"""
