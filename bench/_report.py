"""A benchmark's figures: printed as JSON, and written to a file too where one is named."""

from __future__ import annotations

import json
from typing import Any


def report(figures: dict[str, Any], path: str | None) -> None:
    print(json.dumps(figures, indent=1))
    if path:
        with open(path, "w") as f:
            json.dump(figures, f, indent=1)
