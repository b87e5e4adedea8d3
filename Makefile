# Two commands on a fresh machine:  make demo   and   make test
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
ASSIGNMENTS := $(notdir $(patsubst %/,%,$(dir $(wildcard assignments/*/_build_nb.py))))

export TORCH_CPP_LOG_LEVEL := ERROR
# this checkout's autograder/ and solutions/ first (also in a git worktree sharing a venv)
export PYTHONPATH := $(CURDIR)
# nbgrader runs `alembic` from PATH
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)

# The language of the notebooks' text (issue 24): `make build COURSE_LANG=zh` rebuilds source/ and release/ in
# Chinese (same files, cells and grading ids; the text from zh/notebooks/), `make build` in English again.
# demo grades the release in the language it is in; student-package and lab package it in that language too,
# or in COURSE_LANG when given (autograder/authoring/translations.py).
COURSE_LANG ?= en
LANG_GIVEN = $(filter command line environment,$(origin COURSE_LANG))
RELEASE_LANG = $(shell $(PY) -m autograder.authoring.translations language 2>/dev/null || echo en)

.PHONY: install build test test-all demo lab clean student-package site

install: $(STAMP)

# torch is pinned to exactly 2.13.0 in pyproject.toml: a bare `torch` pulls a
# multi-GB CUDA build. pip (not uv/poetry) takes the CPU wheel that is on disk.
$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[course]'
	touch $(STAMP)

# Rebuild every source notebook from assignments/*/_build_nb.py, then release/.
build: $(STAMP)
	@for a in $(ASSIGNMENTS); do \
	  echo "build $$a ($(COURSE_LANG))"; \
	  COURSE_LANG=$(COURSE_LANG) $(PY) assignments/$$a/_build_nb.py || exit 1; \
	  $(VENV)/bin/nbgrader generate_assignment $$a --force --log-level=ERROR || exit 1; \
	done

# Two processes side by side (pytest-xdist, a test file per process), then the tests that assert how fast
# something is reported, alone (marked `timing` in tests/conftest.py).
test: $(STAMP)
	env -u COURSE_LANG $(PY) -m pytest -q -n 2 --dist loadfile -m "not timing"
	env -u COURSE_LANG $(PY) -m pytest -q -m timing

# Build the course (in the language release/ is in, or COURSE_LANG), autograde the sample submissions with
# nbgrader, print the gradebook.
demo: $(STAMP)
	@$(MAKE) --no-print-directory build COURSE_LANG=$(if $(LANG_GIVEN),$(COURSE_LANG),$(RELEASE_LANG))
	$(PY) -m autograder.grade demo

# JupyterLab on the student package, unpacked as a student unpacks it (notebooks and lessons side by side).
lab: student-package
	rm -rf build/student && mkdir -p build/student
	tar xzf dist/llm-parallelism-course.tar.gz -C build/student
	cd build/student/llm-parallelism-course && $(CURDIR)/$(VENV)/bin/jupyter lab

# What students receive: dist/llm-parallelism-course.tar.gz (release notebooks, lessons, the wheel of autograder's
# runtime, lessons and checks; no solutions, no hidden tests, no grading). Its README.md is the student section of
# this README.
student-package: $(STAMP)
	rm -rf dist
	$(PY) -m autograder.grade student-package --out dist $(if $(LANG_GIVEN),--lang $(COURSE_LANG))

clean:
	rm -rf submitted autograded feedback gradebook.db .pytest_cache dist

# Everything, the opt-in sweeps included (every mutant on every cell of its notebook).
test-all: $(STAMP)
	env -u COURSE_LANG COURSE_EXHAUSTIVE=1 $(PY) -m pytest -q -n 2 --dist loadfile -m "not timing"
	env -u COURSE_LANG COURSE_EXHAUSTIVE=1 $(PY) -m pytest -q -m timing

# The course as a website: build/site/index.html (overview, lessons, release notebooks never executed, a page
# per exercise, formulas as MathML, figures drawn by autograder/, code links at pinned commits), and the same
# in Chinese under build/site/zh/, a language switch on every page. Offline.
site: $(STAMP)
	$(PY) docs/build_site.py --out build/site
