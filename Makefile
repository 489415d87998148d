# Two commands from a fresh clone (see README):
#   make run    the offline demo: `octavo generate` with the built-in demo model
#   make test   the test suite CI runs (.ci/run calls it)
# Each first sets up .venv when needed (scripts/ensure_env.sh: the right torch
# build for this machine, then Octavo with what the command needs) and does no
# installing at all once it is in place.
VENV ?= .venv
PROMPT ?= Once upon a time
PYTEST_ARGS ?=
BIN := $(VENV)/bin
ENSURE := VENV=$(VENV) bash scripts/ensure_env.sh

.PHONY: run test

run:
	@$(ENSURE) run
	@$(BIN)/octavo generate "$(PROMPT)"

test:
	@$(ENSURE) test
	@echo "== platform plugins, and the conformance suite against cpu and the example plugin"
	@$(BIN)/octavo plugins list
	@$(BIN)/octavo plugins check cpu
	@$(BIN)/octavo plugins check example
	@$(BIN)/pytest --pyargs octavo.testing.conformance --octavo-platform example -p no:cacheprovider
	@echo "== the test suite"
	@$(BIN)/pytest $(PYTEST_ARGS)
