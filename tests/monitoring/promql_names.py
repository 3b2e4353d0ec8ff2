"""Which catalogue metric a PromQL expression reads: the series names Prometheus sees for each
catalogue entry, and the slea_ names an expression uses (outside label values and strings)."""

from __future__ import annotations

import re

from monitoring.catalogue import CATALOGUE, PREFIX


def series_names() -> dict[str, str]:
    """Exported series name -> catalogue name. A counter is its _total name (prometheus-client
    adds _created); a gauge is its name; a histogram is only its _bucket, _sum and _count."""
    names = {}
    for spec in CATALOGUE.values():
        full = PREFIX + spec.name
        if spec.kind == "counter":
            names[full] = spec.name
            names[full.removesuffix("_total") + "_created"] = spec.name
        elif spec.kind == "gauge":
            names[full] = spec.name
        else:
            for suffix in ("_bucket", "_sum", "_count"):
                names[full + suffix] = spec.name
    return names


def metric_names(expr: str) -> set[str]:
    """slea_ identifiers in an expression, ignoring quoted strings (label values, regexes)."""
    unquoted = re.sub(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`', '""', expr)
    return set(re.findall(rf"(?<![A-Za-z0-9_:]){PREFIX}[A-Za-z0-9_:]+", unquoted))
