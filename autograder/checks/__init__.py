"""Public checks, one module per assignment: the readable spec of what is graded.

A notebook's test cells call these with the student's implementations; the
hidden tests call the same functions with other world sizes, shapes, seeds and
dtypes. Each check runs rank programs with autograder.dist.run_distributed and
computes its verdict in the calling process from what the ranks returned.
"""
