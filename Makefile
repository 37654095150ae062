# Quickstart targets: `make demo` and `make test` each set up what they need.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip -q --disable-pip-version-check

.PHONY: demo test test-core check docs protos clean bench

$(PY):
	$(PYTHON) -m venv $(VENV)

# The package alone (numpy, protobuf, crc32c, ml-dtypes): enough for the demo.
$(VENV)/.installed-base: pyproject.toml | $(PY)
	$(PIP) install -e .
	touch $@

# Plus tensorflow-cpu and the test tools.
# tf-keras (Keras 2) is installed without its dependencies: it asks for the full `tensorflow`
# package, which would overwrite tensorflow-cpu's files; the release matching TF's is taken.
TF_KERAS = "tf-keras==$$($(PY) -c 'from importlib.metadata import version; print(version("tensorflow-cpu").rsplit(".", 1)[0])').*"
$(VENV)/.installed-dev: pyproject.toml | $(PY)
	$(PIP) install -e ".[dev]"
	$(PIP) install --no-deps $(TF_KERAS)
	touch $@ $(VENV)/.installed-base $(VENV)/.installed-lint $(VENV)/.installed-docs $(VENV)/.installed-core

# tensorflow-cpu, tf-keras and the test tools without PyTorch, transformers, JAX or a
# browser: what `make test-core` runs.
$(VENV)/.installed-core: pyproject.toml | $(PY)
	$(PIP) install -e ".[tf,remote,dask,h5,report,test-core]"
	$(PIP) install --no-deps $(TF_KERAS)
	touch $@ $(VENV)/.installed-base

# The package plus the pinned linters (ruff, mypy, protobuf stubs).
$(VENV)/.installed-lint: pyproject.toml | $(PY)
	$(PIP) install -e ".[lint]"
	touch $@ $(VENV)/.installed-base

demo: $(VENV)/.installed-base
	$(PY) -m tfckpt.demo demo-out

# Two worker processes, each a whole test file at a time (its fixtures built once): the
# suite waits on TensorFlow, transformers and servers as much as it computes, so two
# keep both cores of a 2-core machine busy (14 min there for 3 277 tests).
test: $(VENV)/.installed-dev
	$(PY) -m pytest -n 2 --dist loadfile

# The format, engine, storage and TensorFlow parity tests: the suite less what is marked as
# needing transformers with PyTorch (hf), Keras 3 on JAX (jax) or Chromium (browser).
test-core: $(VENV)/.installed-core
	TFCKPT_TEST_CORE=1 $(PY) -m pytest -n 2 --dist loadfile -m "not hf and not jax and not browser"

# Lint, formatting, types and the layer contracts; the settings live in pyproject.toml. All
# four run, so one pass reports every finding; any of them failing fails the target.
check: $(VENV)/.installed-lint
	@status=0; \
	set -x; \
	$(PY) -m ruff check . || status=1; \
	$(PY) -m ruff format --check . || status=1; \
	$(PY) -m mypy || status=1; \
	$(VENV)/bin/lint-imports || status=1; \
	exit $$status

# The documentation site, from docs/ and the docstrings, into site/; strict: a broken link,
# a page left out of the nav or a docstring that does not render fails the build.
$(VENV)/.installed-docs: pyproject.toml | $(PY)
	$(PIP) install -e ".[docs]"
	touch $@ $(VENV)/.installed-base

# NO_MKDOCS_2_WARNING: Material's notice about its successor, printed on every build.
docs: $(VENV)/.installed-docs
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict --quiet

# Regenerate tfckpt/_proto from proto/ with protoc 25 (grpcio-tools 1.62.3): its output
# imports under every protobuf runtime from 4.25 to 7.x. The .pyi stubs beside it come
# from mypy-protobuf 3.6, the last release whose plugin runs on protobuf 4.25.
protos:
	$(PYTHON) -m venv .venv-protoc
	.venv-protoc/bin/pip -q install grpcio-tools==1.62.3 mypy-protobuf==3.6.0
	.venv-protoc/bin/python -m grpc_tools.protoc -Iproto --python_out=. \
		--plugin=protoc-gen-mypy=.venv-protoc/bin/protoc-gen-mypy --mypy_out=. \
		proto/tfckpt/_proto/*.proto

clean:
	rm -rf demo-out site .pytest_cache .venv-protoc

# Benchmarks against TensorFlow (not part of the tests); writes benchmarks/out/results.json.
bench: $(VENV)/.installed-dev
	$(PY) benchmarks/run.py
