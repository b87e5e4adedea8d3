"""The course's Python package, in layers; each imports only from the layers below it.

    grading/     the instructor's machine: the grading command, class runs, the trusted run,
                 the sandbox, intake, nbgrader plugins, exports, Gradescope
    authoring/   building the course: the notebook builder, the student and Gradescope packages
    checks/      one package per assignment (checks/<dim>/, as solutions/<dim>/): the readable
                 spec of what is graded, its __init__ listing exercise -> check
    runtime/     what a student's visible test runs: the rank runner, collective agreement,
                 the ledger, comparisons, the student-facing report
    lessons/     what the lessons compute and draw: volumes and times, hardware figures,
                 the planner's vocabulary, the tiny GPT, figures

runtime/ and lessons/ are the bottom, side by side (neither imports the other);
checks/ uses both; authoring/ is above them, grading/ on top (its command
line builds packages). A student receives runtime/, lessons/ and checks/
only (the student package); grading/ and authoring/ stay with the
instructor. tests/test_layers.py holds the package to this order.

    python -m autograder.grade ...      # the grading command (autograder.grading.cli)
"""
