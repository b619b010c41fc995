#!/usr/bin/env bash
# Install everything and run the whole test suite. Extra arguments go to pytest (e.g. -m "not slow").
set -euo pipefail
cd "$(dirname "$0")/.."
GRPO_EXTRAS=lowmem bash scripts/setup.sh   # the tests cover the lowmem preset's optimizer too
source scripts/env.sh
exec .venv/bin/python -m pytest tests "$@"
