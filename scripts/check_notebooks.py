"""Executes notebooks headlessly with the Rust kernel (evcxr_jupyter) and checks them.

    check_notebooks.py NOTEBOOK...          run each; fail on a cell error or stale outputs
    check_notebooks.py --write NOTEBOOK...  run each and save it with its fresh outputs

A notebook passes when no cell fails and every cell's outputs equal the committed ones, apart
from execution counts and metadata, and apart from cells tagged `volatile` (live timings), whose
outputs are not compared. evcxr's error replies carry no text, so a failing cell is reported with
its source and what it wrote to stderr.

The first code cell (`:dep lab = ...`) compiles lab and its dependencies: it gets
LAB_NOTEBOOK_FIRST_CELL_TIMEOUT seconds (default 3600), the others LAB_NOTEBOOK_CELL_TIMEOUT
(default 600).
"""

import argparse
import copy
import difflib
import os
import sys
import time

import nbformat
from nbclient import NotebookClient

VOLATILE = "volatile"


def cell_text(output):
    """What an output shows, as text: stream text, each MIME type's data, or the error."""
    kind = output["output_type"]
    if kind == "stream":
        return f"[{output['name']}]\n{output['text']}"
    if kind in ("display_data", "execute_result"):
        data = output.get("data", {})
        return "\n".join(f"[{mime}]\n{_join(data[mime])}" for mime in sorted(data))
    if kind == "error":
        return f"[error] {output.get('ename', '')}: {output.get('evalue', '')}"
    return f"[{kind}]"


def _join(v):
    return "".join(v) if isinstance(v, list) else str(v)


def shown(cell):
    """A cell's outputs as one text, trailing spaces dropped line by line."""
    text = "\n".join(cell_text(o) for o in cell.get("outputs", []))
    return "\n".join(line.rstrip() for line in text.splitlines())


def is_volatile(cell):
    return VOLATILE in cell.get("metadata", {}).get("tags", [])


def execute(path):
    nb = nbformat.read(path, as_version=4)
    fresh = copy.deepcopy(nb)
    first = next((i for i, c in enumerate(fresh.cells) if c.cell_type == "code"), None)
    first_timeout = int(os.environ.get("LAB_NOTEBOOK_FIRST_CELL_TIMEOUT", "3600"))
    cell_timeout = int(os.environ.get("LAB_NOTEBOOK_CELL_TIMEOUT", "600"))

    def timeout_func(cell):
        return first_timeout if first is not None and cell is fresh.cells[first] else cell_timeout

    client = NotebookClient(
        fresh,
        kernel_name="rust",
        timeout_func=timeout_func,
        allow_errors=True,  # every failing cell is reported below, with its stderr
        record_timing=False,
        resources={"metadata": {"path": os.path.dirname(os.path.abspath(path))}},
    )
    started = time.monotonic()
    client.execute()
    return nb, fresh, time.monotonic() - started


def errors(nb):
    """One message per failing cell: its source, its stderr and the error itself."""
    out = []
    for i, cell in enumerate(nb.cells):
        errs = [o for o in cell.get("outputs", []) if o["output_type"] == "error"]
        if not errs:
            continue
        stderr = "".join(o["text"] for o in cell.outputs if o["output_type"] == "stream" and o["name"] == "stderr")
        msg = [f"cell {i} failed:", _indent(cell.source), "stderr:", _indent(stderr or "(nothing)")]
        for e in errs:
            msg.append(f"error: {e.get('ename', '')} {e.get('evalue', '')}".rstrip())
            msg.extend(_indent(line) for line in e.get("traceback", []))
        out.append("\n".join(msg))
    return out


def stale(committed, fresh):
    """One message per cell whose committed outputs differ from the fresh ones."""
    if len(committed.cells) != len(fresh.cells):
        return ["the number of cells changed while running"]
    out = []
    for i, (old, new) in enumerate(zip(committed.cells, fresh.cells)):
        if new.cell_type != "code" or is_volatile(new):
            continue
        a, b = shown(old), shown(new)
        if a != b:
            diff = difflib.unified_diff(a.splitlines(), b.splitlines(), "committed", "fresh", lineterm="", n=1)
            lines = list(diff)
            more = f"\n    ... {len(lines) - 40} more diff lines" if len(lines) > 40 else ""
            out.append(f"cell {i} outputs differ from the committed ones:\n" + _indent("\n".join(lines[:40])) + more)
    return out


def _indent(text):
    return "\n".join("    " + line for line in str(text).splitlines())


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--write", action="store_true", help="save each notebook with its fresh outputs")
    ap.add_argument("notebooks", nargs="+")
    args = ap.parse_args()
    passed, failed = 0, 0
    for path in args.notebooks:
        committed, fresh, seconds = execute(path)
        problems = errors(fresh)
        if args.write:
            if not problems:
                nbformat.write(fresh, path)
        else:
            problems += stale(committed, fresh)
        status = "ok" if not problems else "FAILED"
        print(f"{path}: {status} ({seconds:.0f} s)", flush=True)
        for p in problems:
            print(_indent(p), flush=True)
        if problems:
            failed += 1
        else:
            passed += 1
    if failed and not args.write:
        print("to refresh the committed outputs: python scripts/check_notebooks.py --write notebooks/*.ipynb")
    print(f"notebooks: {passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
