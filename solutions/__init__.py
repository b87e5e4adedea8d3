"""Reference solutions (instructor only): one module per assignment, unit-tested by pytest,
pulled into the notebooks' solution cells by assignments/*/_build_nb.py."""
