#!/usr/bin/env python3
"""Extracts the ```cpp code blocks of Markdown files into .cpp files, so that
the build compiles every snippet the documentation shows (test/meson.build).

Each block must be a complete translation unit (its own includes and
namespace aliases). A block is written to <stem>-<n>.cpp (n counting the
file's cpp blocks from 1) behind a one-line comment that names the Markdown
file and says how line numbers map. (Not a #line directive naming the
Markdown file: GCC then takes the snippet for a header and warns
-Wsubobject-linkage on every lambda in a coroutine.)

  doc-snippets.py --list FILE.md           print the output names, one a line
  doc-snippets.py --extract FILE.md OUTDIR write them into OUTDIR
"""

import pathlib
import re
import sys

# An opening fence of a cpp block: ```cpp (optionally indented, nothing after
# the language tag but spaces). Other languages and bare ``` are left alone.
OPEN = re.compile(r"^(\s*)```cpp\s*$")
CLOSE = re.compile(r"^\s*```\s*$")


def blocks(path):
    """Yields (first line number, text) for each cpp block of the file."""
    lines = pathlib.Path(path).read_text(encoding="utf-8").splitlines()
    i = 0
    while i < len(lines):
        m = OPEN.match(lines[i])
        if not m:
            i += 1
            continue
        indent = len(m.group(1))
        start = i + 1
        j = start
        while j < len(lines) and not CLOSE.match(lines[j]):
            j += 1
        if j == len(lines):
            sys.exit(f"{path}:{i + 1}: cpp block is never closed")
        body = [line[indent:] if line[:indent].isspace() else line for line in lines[start:j]]
        yield start + 1, "\n".join(body) + "\n"
        i = j + 1


def names(path):
    stem = pathlib.Path(path).stem
    return [f"{stem}-{n}.cpp" for n, _ in enumerate(blocks(path), start=1)]


def main(argv):
    if len(argv) == 3 and argv[1] == "--list":
        for name in names(argv[2]):
            print(name)
        return 0
    if len(argv) == 4 and argv[1] == "--extract":
        src, out = pathlib.Path(argv[2]), pathlib.Path(argv[3])
        out.mkdir(parents=True, exist_ok=True)
        for name, (line, text) in zip(names(src), blocks(src)):
            header = (f"// From {src.resolve().as_posix()}: line L of this file is "
                      f"line L + {line - 2} there.\n")
            target = out / name
            content = header + text
            # Rewrite only on change, so that an edit elsewhere in the
            # Markdown file does not recompile every snippet.
            if not target.exists() or target.read_text(encoding="utf-8") != content:
                target.write_text(content, encoding="utf-8")
        return 0
    sys.stderr.write(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
