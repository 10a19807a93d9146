#!/usr/bin/env bash
# Fetches what the checks against vLLM's own release files need, into sr-prefetch's cache,
# so that the tests download nothing: every supported release's sdist (sdists/, 19 files,
# about 700 MB; a pristine tree takes its setup.py and CMakeLists.txt from it, and
# tests/vllm_patch/test_precommit.py its source tree), and the pre-commit hook
# environments of the releases CI checks (pre-commit's cache; test_precommit.py).
#
# Usage: bash .ci/install-checks.sh [PYTHON]    (default: python3; give the venv's python)
set -euo pipefail

PYTHON="${1:-python3}"
"$PYTHON" -m vllm_patch.sdist
"$PYTHON" -m vllm_patch.precommit --install
