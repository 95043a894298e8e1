"""Kubernetes resource quantities and Linux cpulists."""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {"n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3"), "": Decimal(1),
            "k": Decimal(10**3), "M": Decimal(10**6), "G": Decimal(10**9), "T": Decimal(10**12),
            "P": Decimal(10**15), "E": Decimal(10**18)}
_QTY = re.compile(
    r"^([+-]?(?:\d+\.?\d*|\.\d+))(?:([eE][+-]?\d+)|(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE])?)$"
)


def parse_quantity(value: object) -> Decimal:
    """Parse a Kubernetes quantity ("200Mi", "1.5", "500m", "1e3", 4) exactly."""
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a quantity")
    if isinstance(value, int):
        return Decimal(value)
    if isinstance(value, float):
        return Decimal(str(value))
    if not isinstance(value, str):
        raise ValueError(f"{value!r} is not a quantity")
    m = _QTY.match(value.strip())
    if not m:
        raise ValueError(f"{value!r} is not a quantity (e.g. 2, 500m, 200Mi, 4Gi)")
    try:
        num = Decimal(m.group(1))
    except InvalidOperation as e:  # pragma: no cover - the regex admits only numbers
        raise ValueError(f"{value!r} is not a quantity") from e
    if m.group(2):
        return num * (Decimal(10) ** int(m.group(2)[1:]))
    suffix = m.group(3) or ""
    if suffix in _BINARY:
        return num * _BINARY[suffix]
    return num * _DECIMAL[suffix]


def quantity_bytes(value: object) -> int:
    """A quantity as a whole number of bytes (rounded up, as Kubernetes does for Value())."""
    q = parse_quantity(value)
    if q < 0:
        raise ValueError(f"{value!r} is negative")
    return int(q.to_integral_value(rounding="ROUND_CEILING"))


def format_bytes(n: int) -> str:
    for suffix, mult in (("Ei", 2**60), ("Pi", 2**50), ("Ti", 2**40), ("Gi", 2**30),
                         ("Mi", 2**20), ("Ki", 2**10)):
        if n and n % mult == 0:
            return f"{n // mult}{suffix}"
    return str(n)


def parse_cpulist(text: str) -> list[int]:
    """Parse a Linux cpulist ("0-3,8-11", "", "5") into sorted unique ints."""
    out: set[int] = set()
    text = text.strip()
    if not text:
        return []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        if "-" in part:
            lo_s, _, hi_s = part.partition("-")
            stride = 1
            if ":" in hi_s:  # "0-15:2" form
                hi_s, _, st = hi_s.partition(":")
                stride = int(st)
            lo, hi = int(lo_s), int(hi_s)
            if lo > hi or lo < 0 or stride < 1:
                raise ValueError(f"bad range {part!r} in cpulist {text!r}")
            out.update(range(lo, hi + 1, stride))
        else:
            v = int(part)
            if v < 0:
                raise ValueError(f"negative cpu {part!r} in cpulist {text!r}")
            out.add(v)
    return sorted(out)


def format_cpulist(cpus: list[int] | set[int] | tuple[int, ...]) -> str:
    s = sorted(set(cpus))
    parts: list[str] = []
    i = 0
    while i < len(s):
        j = i
        while j + 1 < len(s) and s[j + 1] == s[j] + 1:
            j += 1
        parts.append(str(s[i]) if i == j else f"{s[i]}-{s[j]}")
        i = j + 1
    return ",".join(parts)
