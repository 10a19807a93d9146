"""The bench's command-line options."""

from __future__ import annotations

import argparse

import pytest

from .options import batch_sizes, positive_int


def test_batch_sizes():
    assert batch_sizes("1,2,4,8") == (1, 2, 4, 8)
    assert batch_sizes(" 8, 1 ") == (8, 1)
    for bad in ("", "1,1", "0", "a", "1,-2"):
        with pytest.raises(argparse.ArgumentTypeError):
            batch_sizes(bad)


def test_positive_int():
    assert positive_int("40") == 40
    for bad in ("0", "-1", "x", "1.5"):
        with pytest.raises(argparse.ArgumentTypeError):
            positive_int(bad)
