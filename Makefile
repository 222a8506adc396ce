# The README's two commands: `make report` (the main job) and `make test` (the whole suite).
# Both do their own set-up (scripts/setup.sh is idempotent and fast when nothing changed).
PY := .venv/bin/python
export HF_HUB_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: setup report test docs clean

setup:
	@bash scripts/setup.sh

report: setup
	$(PY) -m machine_nb.cli report notebooks/01_minimal_sft.ipynb -o reports/minimal_sft.html

# Every notebook runs in a test, top to bottom with its assertion cells: 01 (on both engines), 03, 04,
# 05, 06 and 07 on smaller parameters (test_notebook_tinker_path.py, test_notebook_promote_run.py,
# test_notebook_sweep.py, test_preference_notebook.py, test_notebook_real_model.py,
# test_notebook_inspect.py); 02 on its defaults, its scratch paths aside, through run_report
# (test_notebook_reports.py, which also compares its NBVAL_CHECK_OUTPUT cell with the committed copy).
# The committed copies keep the full runs' outputs for readers. nbval runs a notebook not listed here.
NBVAL_SKIP := --ignore=notebooks/01_minimal_sft.ipynb --ignore=notebooks/02_explore_runs.ipynb --ignore=notebooks/03_tag_train_promote.ipynb --ignore=notebooks/04_sweep.ipynb --ignore=notebooks/05_preference.ipynb --ignore=notebooks/06_real_model.ipynb --ignore=notebooks/07_inspect.ipynb

# Test files run in parallel, on one pytest worker more than there are CPUs, up to 4 (each worker keeps
# a file's tests, and a notebook's cells, together and in order); JOBS=1 runs them one after another.
# A worker's test is mostly one chain of work handed between processes (kernel, training process,
# server) that leaves its CPU idle at times, waiting; the extra worker uses that time. Files are handed
# out in collection order, which tests/conftest.py sorts longest first (LONG_FIRST), after the browser
# files, which it hands out as one unit (one JupyterLab and one Chromium for all of them); without
# --no-loadscope-reorder, pytest-xdist would hand out the files with most tests first instead, and
# leave the long one-test notebook files for last.
JOBS ?= $(shell n=$$(nproc 2>/dev/null || echo 2); n=$$((n + 1)); [ "$$n" -gt 4 ] && n=4; echo $$n)

# The package's bytecode is compiled first: every kernel, training process and server the tests start
# imports it, and with PYTHONDONTWRITEBYTECODE set none of them would write it for the next.
test: setup
	$(PY) -m compileall -q machine_nb
	MACHINE_NB_TEST_ARTIFACTS=$(CURDIR)/test-artifacts $(PY) -m pytest -n $(JOBS) --dist loadfile --no-loadscope-reorder --nbval-lax --nbval-sanitize-with notebooks/sanitize.cfg $(NBVAL_SKIP)

# The documentation site (docs/, mkdocs.yml) into site/, offline, strict: a broken link, a missing
# reference or a docstring griffe cannot read fails the build.
docs: setup
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict

clean:
	rm -rf reports eval_results .pytest_cache site
