"""The instructor's grading machine: the top layer (instructor only; not in the student package).

    cli                 `python -m autograder.grade ...` (autograde, merge, scores, export, demo, packages)
    classrun            a class: every submission sandboxed, in parallel, incrementally, sharded
    intake              one submission's notebook file checked and normalised before anything runs it
    sandbox             bubblewrap and cgroups around the student's processes
    nbgrader_plugins    the course's nbgrader preprocessors (nbgrader_config.py) and the sandboxed kernel
    trusted             the verdicts, decided in a process that never runs student code
    feedback            the feedback page and the result record kept under their caps
    exports             Gradescope's results.json, nbgrader's CSV
    lms                 grades back to the LMS: Canvas's gradebook import CSV, a plain CSV with names and emails
    gradescope          the course as a Gradescope autograder (run_autograder calls it)

Used by the instructor (the command line, nbgrader_config.py), by the cluster
jobs (cluster/) and by Gradescope. Builds on the runtime (the trusted run
drives run_distributed in the sandbox) and on authoring (the packages).
"""
