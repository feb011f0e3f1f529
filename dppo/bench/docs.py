"""A benchmark's output: its table on stdout, its rows as JSON (``--json``) and its own section of
docs/benchmarks.md (``--write-docs``); the diagnostics of `dppo bench` and a clone's ``benchmarks/`` write it alike.

Each section sits between markers named by its key, so a rerun replaces that section and leaves the others
(written by other commands, other machines, other days) as they were.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
from pathlib import Path
from typing import Any

from dppo.bench.common import Row, typed_argv
from dppo.markdown import table

DOCS_TITLE = ("# Benchmarks\n\nEvery section below is written by the command it shows (`dppo bench ...` or a clone's "
              "`python -m benchmarks ...`, with `--write-docs`).\n")


def section_markers(key: str) -> tuple[str, str]:
    """The HTML comments that open and close section ``key`` (invisible in rendered Markdown)."""
    return f"<!-- dppo-bench:{key}:begin -->", f"<!-- dppo-bench:{key}:end -->"


def replace_section(text: str, key: str, body: str) -> str:
    """Put ``body`` between the section's markers, replacing what was there; append a new section."""
    begin, end = section_markers(key)
    block = f"{begin}\n{body.rstrip()}\n{end}"
    if begin in text and end in text and text.index(begin) < text.index(end):
        head, rest = text.split(begin, 1)
        return head + block + rest.split(end, 1)[1]
    return text.rstrip() + "\n\n" + block + "\n"


def write_docs(path: Path, key: str, title: str, note: str, command: str, table_md: str, info: dict[str, Any],
               figure: Path | None = None) -> None:
    """Replace section ``key`` of ``path``: title, note, machine, command, table and figure; atomically, one
    writer at a time (benchmarks run side by side write the same file)."""
    import fcntl

    from dppo.run.run_dir import atomic_write

    path.parent.mkdir(parents=True, exist_ok=True)
    gpu = f", GPU {info['gpu']}" if info.get("gpu") else ", no GPU"
    box = (f"{info['cpu']}, {info['cpus']} CPUs, {info['memory_gib']} GiB{gpu}; {info['os']}; Python {info['python']}, "
           f"torch {info['torch']}, Ray {info['ray']}, gymnasium {info['gymnasium']}, numpy {info['numpy']}; "
           f"load average {info['load_avg_1m']} at the start (the machine is shared); {info['date']}")
    body = [f"## {title}", "", note, "", f"Machine: {box}.", "", "```", command, "```", "", table_md]
    if figure is not None:
        body += ["", f"![{title}]({os.path.relpath(figure, path.parent)})"]
    lock = os.open(path.parent, os.O_RDONLY)  # benchmarks run side by side (bench learn per env): one writer
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        text = path.read_text() if path.exists() else DOCS_TITLE
        atomic_write(path, replace_section(text, key, "\n".join(body)).encode())
    finally:
        os.close(lock)


def emit(args: argparse.Namespace, rows: list[Row], columns: list[str], key: str, title: str, note: str,
         info: dict[str, Any], figure: Path | None = None) -> None:
    """Print the table; write the rows to ``--json`` and the section to ``--write-docs`` when asked."""
    md = table(rows, columns)
    print(md, flush=True)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(rows, indent=2) + "\n")
    if args.write_docs:
        command = shlex.join(typed_argv(args))
        write_docs(Path(args.write_docs), key, title, note, command, md, info, figure)
        print(f"wrote section {key!r} of {args.write_docs}", flush=True)
