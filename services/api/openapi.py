"""`python -m services.api.openapi`: write the API's OpenAPI document to docs/api/openapi.json.

The committed document is the API's reference: what each endpoint takes and what
it answers. It is generated from the app, never edited by hand; `--check` exits 1
when it is stale, and a unit test fails when it and the app disagree.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from shared.settings.common import DatabaseSettings

from .app import create_app
from .settings import ApiSection

DOCUMENT = Path(__file__).resolve().parents[2] / "docs" / "api" / "openapi.json"


def document() -> dict[str, Any]:
    """The OpenAPI document the app serves at /openapi.json (creating the app opens no connection)."""
    schema: dict[str, Any] = create_app(DatabaseSettings(), ApiSection()).openapi()
    return schema


def rendered(schema: dict[str, Any]) -> str:
    return json.dumps(schema, indent=2, ensure_ascii=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m services.api.openapi", description=__doc__)
    parser.add_argument("--check", action="store_true", help="exit 1 if the committed document is stale")
    parser.add_argument("--output", type=Path, default=DOCUMENT, help="where the document goes")
    args = parser.parse_args(argv)
    text = rendered(document())
    if args.check:
        if not args.output.exists() or args.output.read_text() != text:
            sys.stderr.write(f"{args.output} is stale: run `python -m services.api.openapi`\n")
            return 1
        return 0
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(text)
    sys.stderr.write(f"wrote {args.output}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
