"""sr-prefetch: applies the Mamba stochastic-rounding seed prefetch to vLLM 0.20.0-0.33.0.

`cli` is the command line.  `releases` is the one table of supported releases
and what differs between them; `targets/` has a module per vLLM file the patch
changes, which finds its sites by structure (`syntax`) and lands the code kept
in `landing/`; `designs` describes the two designs and writes a release's
commit message.  `vendor` produces the vLLM-side copy of runner_hooks,
`fork_test` the test file a fork gets, `patch` applies, checks and reverts,
`tree` finds targets (git trees, installed vLLMs) and their release, `gitrepo`
runs git in them, `sources` builds pristine trees in the `cache`, from sources
that `wheel` reads from PyPI over HTTP ranges (`pristine` records their sha256).
`plugin` is the `vllm.general_plugins` entry point, which serves the same edits to a
stock vLLM from memory through `plugin_attach`'s import hook (PLUGIN.md).
"""

import sys


def entry() -> None:
    """The `sr-prefetch` command.  Ctrl-C while the command line still loads (before
    cli's own handler is in place) exits 130 with one line."""
    try:
        from .cli import entry as run
    except KeyboardInterrupt:
        print("sr-prefetch: interrupted while starting; nothing was changed", file=sys.stderr)
        raise SystemExit(130) from None
    run()
