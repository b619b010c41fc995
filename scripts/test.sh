#!/usr/bin/env bash
# Install everything, check lint, formatting and types (ruff, pyright), and run the whole test suite. Extra arguments
# go to pytest (e.g. -m "not slow").
set -euo pipefail
cd "$(dirname "$0")/.."
GRPO_EXTRAS=lowmem bash scripts/setup.sh   # the tests cover the lowmem preset's optimizer too
source scripts/env.sh
# Lint, formatting and types first: a new violation fails the run before the tests start.
.venv/bin/ruff check grpo_rl sota tests benchmarks
.venv/bin/ruff format --check grpo_rl sota tests benchmarks
.venv/bin/pyright --project pyproject.toml  # this project's settings, not a pyrightconfig.json found above it
# One pytest worker per core this process may use (the tests run their scripts with one thread each, so workers do
# not slow each other's OpenMP); a module's tests stay on one worker, sharing its module-scoped runs.
# GRPO_TEST_WORKERS=0 runs them all in this process.
exec .venv/bin/python -m pytest tests -n "${GRPO_TEST_WORKERS:-auto}" --dist loadscope "$@"
