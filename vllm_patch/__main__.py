"""`python -m vllm_patch`: the sr-prefetch command line."""

import sys

from .cli import main

sys.exit(main())
