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

# Notebooks 04, 05 and 06 run in tests (test_notebook_sweep.py, test_preference_notebook.py,
# test_notebook_real_model.py) on smaller parameters, their assertion cells included; the committed
# copies keep the full runs' outputs for readers. Notebook 01 runs top to bottom, on both engines and on
# smaller parameters (36 steps), in test_notebook_tinker_path.py.
NBVAL_SKIP := --ignore=notebooks/01_minimal_sft.ipynb --ignore=notebooks/04_sweep.ipynb --ignore=notebooks/05_preference.ipynb --ignore=notebooks/06_real_model.ipynb

# Test files run in parallel, one pytest worker per CPU up to 4 (each worker keeps a file's tests,
# and a notebook's cells, together and in order); JOBS=1 runs them one after another.
JOBS ?= $(shell n=$$(nproc 2>/dev/null || echo 2); [ "$$n" -gt 4 ] && n=4; echo $$n)

test: setup
	MACHINE_NB_TEST_ARTIFACTS=$(CURDIR)/test-artifacts $(PY) -m pytest -n $(JOBS) --dist loadfile --nbval-lax --nbval-sanitize-with notebooks/sanitize.cfg $(NBVAL_SKIP)

# The documentation site (docs/, mkdocs.yml) into site/, offline, strict: a broken link, a missing
# reference or a docstring griffe cannot read fails the build.
docs: setup
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict

clean:
	rm -rf reports eval_results .pytest_cache site
