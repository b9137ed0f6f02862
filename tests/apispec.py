"""The REST API's published schema (jupyter_gpushare/server/api/openapi.yaml), for checking real replies against it."""

from __future__ import annotations

from pathlib import Path

import yaml
from openapi_schema_validator import OAS30Validator, validate

import jupyter_gpushare

SPEC = yaml.safe_load((Path(jupyter_gpushare.__file__).parent / "server" / "api" / "openapi.yaml").read_text())


def conforms(instance, schema_name: str) -> None:
    """Raise if ``instance`` does not match the spec's component schema ``schema_name``."""
    validate(
        instance, {"$ref": f"#/components/schemas/{schema_name}", "components": SPEC["components"]}, cls=OAS30Validator
    )
