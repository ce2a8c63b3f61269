"""Keeps docs/training.md's settings table in step with `ztrain train --help`.

Every flag that `ztrain train --help` lists (in its usage lines or as an option line) must be a row of the
table whose header starts with "| key | flag |", every flag in that table must be listed by --help, and
every config-file key that --help names under "Config-file keys without a flag" must be a row too.

Usage: test_training_doc.py PATH_TO_ZTRAIN   (ZT_SOURCE_DIR names the source tree; default: two folders up)
"""

import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "pylib"))
import zt_testlib as t  # noqa: E402

FLAG = re.compile(r"--[a-z][a-z0-9-]*")


def help_flags(text):
    """The flags --help lists: those in the usage lines (up to the first blank line) and those that start
    an option line ("  --flag ARG   description")."""
    flags = set()
    usage, _, rest = text.partition("\n\n")
    flags.update(FLAG.findall(usage))
    for line in rest.splitlines():
        m = re.match(r"\s+(--[a-z][a-z0-9-]*)", line)
        if m:
            flags.add(m.group(1))
    return flags


def help_file_keys(text):
    """The config-file keys that --help says have no flag."""
    m = re.search(r"Config-file keys without a flag:(.*?)(?:\n\n|\n[A-Z]|\Z)", text, re.S)
    if not m:
        return set()
    body = re.sub(r"\([^)]*\)", "", m.group(1))  # drop "(exponential schedule)" and the like
    return set(re.findall(r"\b[a-z][a-z0-9_]*\b", body))


def doc_table(text):
    """The rows of the settings table as (key cell, flag cell) pairs."""
    rows = []
    inside = False
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if not inside:
            if line.startswith("|") and len(cells) >= 2 and cells[0] == "key" and cells[1] == "flag":
                inside = True
            continue
        if not line.startswith("|"):
            break
        if set(cells[0]) <= set("-: "):  # the |---|---| line
            continue
        rows.append((cells[0], cells[1]))
    return rows


def main():
    if len(sys.argv) != 2:
        print("usage: test_training_doc.py PATH_TO_ZTRAIN")
        return 2
    ztrain = sys.argv[1]
    src = os.environ.get("ZT_SOURCE_DIR",
                         os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
    doc_path = os.path.join(src, "docs", "training.md")

    run = subprocess.run([ztrain, "train", "--help"], capture_output=True, text=True, timeout=30)
    t.check(run.returncode == 0, "ztrain train --help exits with 0 (got %d)" % run.returncode)
    flags = help_flags(run.stdout)
    file_keys = help_file_keys(run.stdout)
    # Guards against a parser that silently finds nothing (the help lists over 30 flags and 8 such keys).
    t.check(len(flags) >= 30, "--help lists at least 30 flags (found %d: %s)" % (len(flags), sorted(flags)))
    t.check(len(file_keys) >= 5, "--help names at least 5 file-only keys (found %s)" % sorted(file_keys))

    with open(doc_path, encoding="utf-8") as f:
        rows = doc_table(f.read())
    t.check(len(rows) >= 30, "%s has the settings table (| key | flag | ...) with at least 30 rows (found %d)"
            % (doc_path, len(rows)))

    doc_flags, doc_keys = set(), set()
    for key, flag in rows:
        found = FLAG.findall(flag)
        if len(found) > 1:
            t.check(False, "table row %r names one flag at most (found %s)" % (key, found))
        doc_flags.update(found)
        doc_keys.update(re.findall(r"`([a-z][a-z0-9_]*)`", key))

    for flag in sorted(flags - doc_flags):
        t.check(False, "flag %s of `ztrain train --help` is missing from the table of %s" % (flag, doc_path))
    for flag in sorted(doc_flags - flags):
        t.check(False, "the table of %s names %s, which `ztrain train --help` does not list" % (doc_path, flag))
    for key in sorted(file_keys - doc_keys):
        t.check(False, "config-file key %s (named by --help) is missing from the table of %s" % (key, doc_path))
    t.check(flags == doc_flags, "the table's flags are exactly those of --help (%d)" % len(flags))
    t.check(file_keys <= doc_keys, "the table has every file-only key of --help (%d)" % len(file_keys))
    return t.summary()


if __name__ == "__main__":
    sys.exit(main())
