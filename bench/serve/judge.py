"""Verdicts on a serve run's records (records.py): the identity over HTTP and the
engagement lines, each verdict a (name, passed, detail) triple; report.py prints them
and test_judge.py asserts them on the committed runs."""

from __future__ import annotations

from typing import Any

from . import identity
from .records import parse_key
from .settings import CONTROL

PATCHED = ("reset", "forward-context")
ENGAGED_MARK = "stochastic-rounding seeds"

Verdict = tuple[str, bool, str]


def _cells(data: dict[str, Any]) -> dict[tuple[str, int, str], dict[str, Any]]:
    return {parse_key(key): cell for key, cell in data["cells"].items()}


def verdicts(data: dict[str, Any]) -> list[Verdict]:
    cells = _cells(data)
    out: list[Verdict] = []
    runners = sorted({runner for runner, _, _ in cells})
    for runner in runners:
        pairs = sorted({pair for r, pair, _ in cells if r == runner})
        stocks = {
            p: cells[runner, p, "stock"].get("identity")
            for p in pairs
            if (runner, p, "stock") in cells
        }
        stocks = {p: record for p, record in stocks.items() if record}
        for p, record in stocks.items():
            sane = record["sanity"]
            ok = (
                sane["finite_logprobs"]
                and sane["full_length"]
                and sane["fewest_distinct_tokens"] > 1
            )
            out.append((f"stock is not degenerate [{runner}-p{p}]", ok, str(sane)))
        if len(stocks) > 1:
            first, *others = sorted(stocks)
            for p in others:
                diff = identity.first_difference(stocks[first], stocks[p])
                out.append(
                    (
                        f"stock is reproducible [{runner}-p{first}-p{p}]",
                        diff is None,
                        diff or "identical",
                    )
                )
        for (r, p, arm), cell in sorted(cells.items()):
            if r != runner or arm == "stock" or "identity" not in cell or p not in stocks:
                continue
            diff = identity.first_difference(stocks[p], cell["identity"])
            if arm == CONTROL.name:
                out.append(
                    (
                        f"control differs [{arm}-{runner}-p{p}]",
                        diff is not None,
                        diff or "identical to stock",
                    )
                )
            else:
                out.append(
                    (f"identical to stock [{arm}-{runner}-p{p}]", diff is None, diff or "identical")
                )
        for (r, p, arm), cell in sorted(cells.items()):
            if r != runner or "engagement" not in cell:
                continue
            engaged = [line for line in cell["engagement"] if ENGAGED_MARK in line]
            if arm in PATCHED:
                out.append(
                    (
                        f"engagement line [{arm}-{runner}-p{p}]",
                        bool(engaged),
                        (engaged or ["no line"])[0],
                    )
                )
            else:
                out.append(
                    (
                        f"no engagement line [{arm}-{runner}-p{p}]",
                        not engaged,
                        (engaged or ["none"])[0],
                    )
                )
    return out


def failed(data: dict[str, Any]) -> list[Verdict]:
    return [v for v in verdicts(data) if not v[1]]
