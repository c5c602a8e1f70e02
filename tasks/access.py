"""A document's own access level and expiry: read from what it declares, checked, held to its source's floor.

Where a document may declare them (docs/configuration.md, "Access level and expiry"):
- Markdown front matter: `access_level`, and `expires_at`, `expires`, `expiration` or `expiry_date`;
- HTML: `<meta name="access-level" content="...">` and `<meta name="expires" content="...">` (any of the
  names above, with - or _); `<meta http-equiv="expires">` is an HTTP caching hint and is not read;
- DOCX: a custom document property named like the front matter fields (File > Properties > Custom in
  Word), or the core property Category when it is exactly one of the levels (Category is free text in
  many documents: any other value is not a declaration).
Names are matched ignoring case, and - _ and camelCase alike (accessLevel, access-level, expiryDate).

Fail closed: a declared level that is not one of ACCESS_LEVELS, or an expiry that is not a date or time,
raises ExtractionError("invalid"): the document is quarantined rather than indexed at its source's level.
The source's level (with its path rules) is a floor: a declaration may raise a document's level, never
lower it; the earlier of the two expiries wins.
"""

from __future__ import annotations

import re
from datetime import UTC, date, datetime
from email.utils import parsedate_to_datetime

from schemas.config import ACCESS_LEVELS
from schemas.errors import INVALID, ExtractionError

ACCESS_FIELDS = ("access_level",)
EXPIRY_FIELDS = ("expires_at", "expires", "expiration", "expiry_date")
_NO_EXPIRY = {"never", "none"}  # an explicit "does not expire": the source's expiry, if any, stands
_LEVELS = ", ".join(ACCESS_LEVELS)


def field_name(key: object) -> str:
    """'accessLevel', 'Access-Level', 'access_level' -> 'access_level'."""
    text = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", str(key).strip())
    return re.sub(r"[-\s]+", "_", text).lower()


def _level(value: object, where: str, name: str) -> str:
    if isinstance(value, str) and value.strip().lower() in ACCESS_LEVELS:
        return value.strip().lower()
    msg = f"{where} '{name}': {value!r} is not an access level (one of {_LEVELS})"
    raise ExtractionError(INVALID, msg)


def _moment(value: object, where: str, name: str) -> datetime | None:
    """A date (its midnight UTC) or a time (UTC when it names no zone); None for 'never'."""
    if isinstance(value, datetime):
        moment = value
    elif isinstance(value, date):
        moment = datetime(value.year, value.month, value.day)
    elif isinstance(value, str) and value.strip().lower() in _NO_EXPIRY:
        return None
    elif isinstance(value, str) and value.strip():
        moment = _parse_moment(value.strip())
    else:
        moment = None
    if moment is None:
        msg = f"{where} '{name}': {value!r} is not a date or time (e.g. 2027-01-31 or 2027-01-31T12:00:00Z)"
        raise ExtractionError(INVALID, msg)
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)


def _parse_moment(text: str) -> datetime | None:
    """ISO 8601 (2027-01-31, 2027-01-31T12:00:00Z) or an HTTP date (Sun, 31 Jan 2027 12:00:00 GMT)."""
    try:
        return datetime.fromisoformat(text)
    except ValueError:
        pass
    try:
        return parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError):
        return None


def declared_access(fields: list[tuple[object, object]], where: str) -> dict[str, object]:
    """What (name, value) pairs declare: {'declared_level', 'declared_expiry'}, each only if declared.

    Names are compared as field_name gives them; other names are ignored. Several declarations of one
    thing (expires and expiration, two <meta> tags) take the strictest: the higher level, the earlier expiry.
    Raise ExtractionError('invalid') naming the field as written and its value when one is not valid.
    """
    levels: list[str] = []
    moments: list[datetime] = []
    for name, value in fields:
        key = field_name(name)
        if key in ACCESS_FIELDS:
            levels.append(_level(value, where, str(name)))
        elif key in EXPIRY_FIELDS and (moment := _moment(value, where, str(name))) is not None:
            moments.append(moment)
    out: dict[str, object] = {}
    if levels:
        out["declared_level"] = max(levels, key=ACCESS_LEVELS.index)
    if moments:
        out["declared_expiry"] = min(moments)
    return out


def stricter(first: dict[str, object], second: dict[str, object]) -> dict[str, object]:
    """Two declarations as one: the higher level, the earlier expiry."""
    out = {**first, **second}
    levels = [d["declared_level"] for d in (first, second) if d.get("declared_level")]
    if levels:
        out["declared_level"] = max(levels, key=ACCESS_LEVELS.index)
    moments = [d["declared_expiry"] for d in (first, second) if d.get("declared_expiry")]
    if moments:
        out["declared_expiry"] = min(moments)
    return out


def effective_access(source_level: str, source_expiry: datetime | None, own: dict) -> dict[str, object]:
    """The document's access level and expiry: its declaration over its source's floor; None where it declares none.

    A declared level below the source's is ignored (the report names the document); the earlier expiry wins.
    """
    declared = own.get("declared_level")
    level = None if declared is None else max(source_level, declared, key=ACCESS_LEVELS.index)
    expiry = own.get("declared_expiry")
    if expiry is not None and source_expiry is not None:
        expiry = min(expiry, source_expiry)
    return {"access_level": level, "expires_at": expiry, "declared_level": declared}


def raised_and_lowered(source_levels: list[str], declared: list[str | None]) -> tuple[list[int], list[int]]:
    """Positions whose declared level is above their source's (raised) and below it (an ignored lowering)."""
    raised, lowered = [], []
    for i, (floor, own) in enumerate(zip(source_levels, declared)):
        if own is None or floor is None:
            continue
        if ACCESS_LEVELS.index(own) > ACCESS_LEVELS.index(floor):
            raised.append(i)
        elif ACCESS_LEVELS.index(own) < ACCESS_LEVELS.index(floor):
            lowered.append(i)
    return raised, lowered
