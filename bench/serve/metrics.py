"""One request's mean inter-token latency from a vLLM server's own histogram: the
change in `vllm:inter_token_latency_seconds`' _sum and _count between /metrics read
before the request and after its response ended, with no other request on that server
between.  vLLM records a step's latencies in the event-loop turn that queues its
tokens, so a read after the last chunk arrived includes the last step.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

ITL = "vllm:inter_token_latency_seconds"
_SAMPLE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(?:\{(.*)\})?\s+(\S+)(?:\s+\S+)?\s*$")
_LABEL = re.compile(r'\s*([A-Za-z_][A-Za-z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*,?')
_UNESCAPE = {"\\\\": "\\", '\\"': '"', "\\n": "\n"}


class MetricsError(ValueError):
    """The /metrics texts cannot give a request's ITL."""


class MissingMetric(MetricsError):
    def __init__(self, name: str, model_name: str | None) -> None:
        which = f" with model_name={model_name!r}" if model_name else ""
        super().__init__(
            f"no {name}_sum and _count{which} in the /metrics text: check the URL is the"
            " server's /metrics, the --served-model-name, and that --disable-log-stats is off"
        )


class EmptyDelta(MetricsError):
    def __init__(self) -> None:
        super().__init__(
            "the ITL count did not grow between the two reads: read /metrics before the"
            " request and after its response ended, and ask for at least 2 output tokens"
        )


class NegativeDelta(MetricsError):
    def __init__(self, d_sum: float, d_count: float) -> None:
        super().__init__(
            f"the ITL histogram went back (sum {d_sum:+g} s, count {d_count:+g}): the server"
            " restarted between the reads; drop this pair and read a fresh baseline"
        )


def _labels(text: str) -> dict[str, str]:
    labels, pos = {}, 0
    while pos < len(text):
        match = _LABEL.match(text, pos)
        if match is None:
            raise MetricsError(f"cannot read the labels {{{text}}}: is this Prometheus text?")
        value = re.sub(r"\\.", lambda m: _UNESCAPE.get(m.group(0), m.group(0)), match.group(2))
        labels[match.group(1)] = value
        pos = match.end()
    return labels


def samples(text: str) -> Iterator[tuple[str, dict[str, str], float]]:
    """Every sample line's (name, labels, value); comments and blank lines skipped."""
    for line in text.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        match = _SAMPLE.match(line)
        if match is None:
            raise MetricsError(f"cannot read the line {line!r}: is this Prometheus text?")
        name, labels, value = match.groups()
        yield name, _labels(labels or ""), float(value)


def totals(text: str, name: str = ITL, model_name: str | None = None) -> tuple[float, float]:
    """A histogram's (sum, count) over its label sets (those of model_name, if given)."""
    found: dict[str, float] = {}
    for sample, labels, value in samples(text):
        if sample not in (f"{name}_sum", f"{name}_count"):
            continue
        if model_name is not None and labels.get("model_name") != model_name:
            continue
        key = sample[len(name) + 1 :]
        found[key] = found.get(key, 0.0) + value
    if set(found) != {"sum", "count"}:
        raise MissingMetric(name, model_name)
    return found["sum"], found["count"]


def itl_delta(
    before_text: str, after_text: str, model_name: str | None = None
) -> tuple[float, int]:
    """(seconds summed, latencies counted) added between two /metrics texts."""
    s0, c0 = totals(before_text, ITL, model_name)
    s1, c1 = totals(after_text, ITL, model_name)
    d_sum, d_count = s1 - s0, c1 - c0
    if d_sum < 0 or d_count < 0:
        raise NegativeDelta(d_sum, d_count)
    if d_count == 0:
        raise EmptyDelta()
    return d_sum, round(d_count)


def mean_itl(before_text: str, after_text: str, model_name: str | None = None) -> float:
    """The mean ITL (seconds) of the one request between two /metrics texts."""
    d_sum, d_count = itl_delta(before_text, after_text, model_name)
    return d_sum / d_count
