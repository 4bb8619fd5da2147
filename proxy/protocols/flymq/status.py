"""FlyMQ has no status codes on the wire: a response is OK unless it is ERROR (0xFF)."""

OK = 0
ERROR = 1
STATUS_NAMES = {OK: "OK", ERROR: "ERROR"}


def status_name(code: int) -> str:
    return STATUS_NAMES.get(code, f"unknown_{code}")
