"""Kubernetes resource quantities and Linux cpulists."""

from __future__ import annotations

import math
import re
from decimal import Context, Decimal, InvalidOperation

# Hostile-input bounds: a quantity's text, its digits and its exponent are capped so that
# parsing is exact and takes microseconds (``1e999999`` would build a million-digit
# number). 10^30 bytes is far beyond any machine; Kubernetes itself stores at most int64.
MAX_QUANTITY_CHARS = 64
MAX_QUANTITY_DIGITS = 40
MAX_QUANTITY_EXPONENT = 30
# The kernel's limit on CPU ids (NR_CPUS at most 8192): ids above it are refused, so a
# cpulist costs at most 8192 entries whatever its text says.
MAX_CPU_ID = 8191
MAX_CPULIST_CHARS = 65536
_EXACT = Context(prec=MAX_QUANTITY_DIGITS + 2 * MAX_QUANTITY_EXPONENT + 8)

_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {"n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3"), "": Decimal(1),
            "k": Decimal(10**3), "M": Decimal(10**6), "G": Decimal(10**9), "T": Decimal(10**12),
            "P": Decimal(10**15), "E": Decimal(10**18)}
_QTY = re.compile(
    r"^([+-]?(?:\d+\.?\d*|\.\d+))(?:([eE][+-]?\d+)|(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE])?)$"
)


def _bounded(q: Decimal, shown: str) -> Decimal:
    if q and q.adjusted() >= MAX_QUANTITY_EXPONENT:
        raise ValueError(f"{shown} is too large (at most 10^{MAX_QUANTITY_EXPONENT})")
    return q


def parse_quantity(value: object) -> Decimal:
    """Parse a Kubernetes quantity ("200Mi", "1.5", "500m", "1e3", 4) exactly.

    Raises ValueError (one line) for anything else, within microseconds whatever the
    input: non-finite numbers, more than 40 digits, an exponent beyond +-30, or a value
    of 10^30 or more are refused."""
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a quantity")
    if isinstance(value, int):
        if value.bit_length() > 128:
            raise ValueError(f"the integer is too large (at most 10^{MAX_QUANTITY_EXPONENT})")
        return _bounded(Decimal(value), repr(value))
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"{value!r} is not a finite quantity")
        return _bounded(Decimal(repr(value)), repr(value))
    if not isinstance(value, str):
        raise ValueError(f"{value!r} is not a quantity")
    if len(value) > MAX_QUANTITY_CHARS:
        raise ValueError(f"a quantity of {len(value)} characters is too long "
                         f"(at most {MAX_QUANTITY_CHARS})")
    m = _QTY.match(value.strip())
    if not m:
        raise ValueError(f"{value!r} is not a quantity (e.g. 2, 500m, 200Mi, 4Gi)")
    mantissa = m.group(1)
    if sum(ch.isdigit() for ch in mantissa) > MAX_QUANTITY_DIGITS:
        raise ValueError(f"{value!r} has more than {MAX_QUANTITY_DIGITS} digits")
    try:
        num = Decimal(mantissa)
    except InvalidOperation as e:  # pragma: no cover - the regex admits only numbers
        raise ValueError(f"{value!r} is not a quantity") from e
    if m.group(2):
        exp_text = m.group(2)[1:].lstrip("+-").lstrip("0") or "0"
        if len(exp_text) > 3 or int(exp_text) > MAX_QUANTITY_EXPONENT:
            raise ValueError(f"{value!r}: the exponent is beyond +-{MAX_QUANTITY_EXPONENT}")
        exp = int(m.group(2)[1:])
        return _bounded(_EXACT.multiply(num, _EXACT.power(Decimal(10), exp)), repr(value))
    suffix = m.group(3) or ""
    mult = Decimal(_BINARY[suffix]) if suffix in _BINARY else _DECIMAL[suffix]
    return _bounded(_EXACT.multiply(num, mult), repr(value))


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


def _cpu_id(s: str, part: str) -> int:
    s = s.strip()
    if not s.isascii() or not s.isdigit():
        raise ValueError(f"bad cpu {s!r} in {_short(part)}")
    if len(s) > 5 or int(s) > MAX_CPU_ID:
        raise ValueError(f"cpu {_short(s)} is beyond the kernel's limit of "
                         f"{MAX_CPU_ID + 1} CPUs")
    return int(s)


def _short(text: str, n: int = 40) -> str:
    return repr(text if len(text) <= n else text[:n] + "...")


def parse_cpulist(text: str) -> list[int]:
    """Parse a Linux cpulist ("0-3,8-11", "", "5", "0-15:2") into sorted unique ints.

    Linear in the text: ids are capped at the kernel's limit (:data:`MAX_CPU_ID`) and the
    text at :data:`MAX_CPULIST_CHARS`; anything else raises ValueError (one line)."""
    if len(text) > MAX_CPULIST_CHARS:
        raise ValueError(f"a cpulist of {len(text)} characters is too long "
                         f"(at most {MAX_CPULIST_CHARS})")
    seen = bytearray(MAX_CPU_ID + 1)
    top = -1
    text = text.strip()
    if not text:
        return []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        if part.startswith("-"):
            raise ValueError(f"negative cpu {_short(part)} in cpulist {_short(text)}")
        if "-" in part:
            lo_s, _, hi_s = part.partition("-")
            stride = 1
            if ":" in hi_s:  # "0-15:2" form
                hi_s, _, st = hi_s.partition(":")
                st = st.strip()
                if not st.isascii() or not st.isdigit() or len(st) > 5:
                    raise ValueError(f"bad stride in range {_short(part)}")
                stride = int(st)
            lo, hi = _cpu_id(lo_s, part), _cpu_id(hi_s, part)
            if lo > hi or stride < 1:
                raise ValueError(f"bad range {_short(part)} in cpulist {_short(text)}")
            seen[lo:hi + 1:stride] = b"\x01" * len(range(lo, hi + 1, stride))
            top = max(top, hi)
        else:
            cpu = _cpu_id(part, part)
            seen[cpu] = 1
            top = max(top, cpu)
    return [i for i in range(top + 1) if seen[i]]


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
