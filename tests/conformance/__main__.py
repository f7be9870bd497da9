"""`python -m tests.conformance [--all]`: differences per scenario (unexplained ones, or
every one with --all), for reviewing the allowlist."""

from __future__ import annotations

import sys

from tests.conformance._diff import compare, load_allowlist, scenarios, split


def main(argv: list[str]) -> int:
    show_all = "--all" in argv
    allowlist = load_allowlist()
    failed = 0
    for folder in scenarios():
        diffs = compare(folder)
        allowed, unexplained = split(diffs, allowlist)
        print(
            f"== {folder.name}: {len(diffs)} differences, {len(allowed)} allowlisted, "
            f"{len(unexplained)} unexplained"
        )
        for diff in diffs if show_all else unexplained:
            print(f"  {diff}")
        failed += len(unexplained)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
