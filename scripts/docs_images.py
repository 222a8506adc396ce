"""Copy the widget pictures the browser tests take into docs/images/, for the README and the docs.

The browser tests (tests/test_browser*.py) screenshot each widget they have just checked, in the
light and dark themes, into `$MACHINE_NB_TEST_ARTIFACTS/gallery/` (`make test` sets it to
`test-artifacts/`). This script copies those pictures over the committed ones, so the pictures in
the README always show what the tests saw:

    make test                                    # or only the browser tests: -m browser
    .venv/bin/python scripts/docs_images.py      # then commit docs/images/

It exits 1, naming them, when a picture the README or the docs show was not taken.
"""

from __future__ import annotations

import argparse
import re
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
IMAGES = ROOT / "docs" / "images"


def shown() -> set[str]:
    """The docs/images/ files the README and the docs pages link to."""
    names: set[str] = set()
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        names.update(re.findall(r"images/([\w.-]+\.png)", page.read_text(encoding="utf-8")))
    return names


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--from", dest="source", default=str(ROOT / "test-artifacts" / "gallery"),
                        help="the gallery folder the browser tests wrote (default test-artifacts/gallery)")
    args = parser.parse_args(argv)
    source = Path(args.source)
    IMAGES.mkdir(parents=True, exist_ok=True)
    copied = []
    for picture in sorted(source.glob("*.png")):
        shutil.copyfile(picture, IMAGES / picture.name)
        copied.append(picture.name)
    print(f"copied {len(copied)} picture(s) from {source} to {IMAGES.relative_to(ROOT)}: {', '.join(copied)}")
    missing = sorted(n for n in shown() if not (IMAGES / n).is_file())
    if missing:
        print(f"pictures shown but not taken: {', '.join(missing)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
