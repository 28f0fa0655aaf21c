"""``nexus-mcp registry``: validate registry files, print their digests, show what they classify.

nexus-mcp registry validate FILE...      every error of every file; exit 1 if any is invalid
nexus-mcp registry digest FILE           the sha256 to pin in settings
nexus-mcp registry show [--registry-dir DIR]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from nexus_mcp.errors import ConfigError
from nexus_mcp.policy.registry import (
    RegistrySet,
    compute_digest,
    default_registry_dir,
    find_registry_errors,
    load_registry_dir,
    read_registry_file,
)

EXIT_OK = 0
EXIT_INVALID = 1

_COLUMNS = (
    "server",
    "tool",
    "class",
    "document op",
    "encoding",
    "max read",
    "max write",
    "max batch",
)
_NOT_APPLICABLE = "-"


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``registry`` and its subcommands; each sets ``func(args) -> exit code``."""
    parser = subparsers.add_parser("registry", help="tool registry files (validate, digest, show)")
    commands = parser.add_subparsers(dest="registry_command", required=True)

    validate = commands.add_parser("validate", help="validate registry files against the contract")
    validate.add_argument(
        "files", nargs="+", type=Path, metavar="FILE", help="registry files (*.json) to check"
    )
    validate.set_defaults(func=run_validate)

    digest = commands.add_parser("digest", help="print the sha256 of a registry file")
    digest.add_argument("file", type=Path, metavar="FILE", help="a registry file (*.json)")
    digest.set_defaults(func=run_digest)

    show = commands.add_parser("show", help="print every classified tool as a table")
    show.add_argument("--registry-dir", type=Path, default=None, metavar="DIR")
    show.set_defaults(func=run_show)


def run_validate(args: argparse.Namespace) -> int:
    exit_code = EXIT_OK
    for path in args.files:
        try:
            _, document = read_registry_file(path)
        except ConfigError as exc:
            print(f"INVALID {exc}")
            exit_code = EXIT_INVALID
            continue
        errors = find_registry_errors(document)
        if errors:
            exit_code = EXIT_INVALID
            print(f"INVALID {path} ({_count(len(errors))})")
            for error in errors:
                print(f"  {error}")
        else:
            print(f"OK {path} sha256={compute_digest(path)}")
    return exit_code


def run_digest(args: argparse.Namespace) -> int:
    try:
        print(compute_digest(args.file))
    except ConfigError as exc:
        print(str(exc), file=sys.stderr)
        return EXIT_INVALID
    return EXIT_OK


def run_show(args: argparse.Namespace) -> int:
    directory = args.registry_dir or default_registry_dir()
    try:
        registry_set = load_registry_dir(directory)
    except ConfigError as exc:
        print(str(exc), file=sys.stderr)
        return EXIT_INVALID
    print(format_table(registry_set))
    return EXIT_OK


def format_table(registry_set: RegistrySet) -> str:
    """A plain-text table of every tool, one line each, columns padded to their widths."""
    rows: list[tuple[str, ...]] = [_COLUMNS]
    for server_id, registry in sorted(registry_set.registries.items()):
        for entry in registry.entries:
            spec = entry.document_spec
            sizes = (
                (str(spec.max_read_bytes), str(spec.max_write_bytes), str(spec.max_batch_bytes))
                if spec is not None
                else (_NOT_APPLICABLE,) * 3
            )
            rows.append(
                (
                    server_id,
                    entry.tool_name,
                    entry.tool_class,
                    "yes" if entry.is_document_op else "no",
                    spec.content_encoding if spec is not None else _NOT_APPLICABLE,
                    *sizes,
                )
            )
    widths = [max(len(row[column]) for row in rows) for column in range(len(_COLUMNS))]
    lines = [
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True))
        for row in rows
    ]
    lines.insert(1, "  ".join("-" * width for width in widths))
    return "\n".join(line.rstrip() for line in lines)


def _count(errors: int) -> str:
    return f"{errors} error" if errors == 1 else f"{errors} errors"


__all__ = ["add_parser", "format_table", "run_digest", "run_show", "run_validate"]
