#!/usr/bin/env python3
"""Every test case that docs/ray-serve.md names exists in the suite.

The guide names the test that shows each behaviour. Its convention (stated in
the guide, under "Seed behaviours, one by one"): a test binary or test file in
backticks, ending in `_test`, then the names of its test cases in double
quotes, separated by commas; the list may wrap over lines (a line break in a
name counts as one space). For example

    `controller_core_test` "health: a crash marks the replica unhealthy at once
    and replaces it", "health: replicas on a node that died are replaced"

Every quoted name must be the exact name of a doctest TEST_CASE of that binary
(a source file of its add_executable in tests/**/CMakeLists.txt) or of a test
file of that name (tests/**/<name>.cpp). Names are read from the sources:
adjacent string literals are joined, comments skipped, escapes decoded. (A
test case whose name holds a double quote cannot be quoted this way.)

Usage: check_doc_test_names.py [SOURCE_DIR] [--doc PATH]
Exit status 0 when every name exists; 1 with one line per missing name.
"""

import argparse
import os
import re
import sys

SOURCE_SUFFIXES = (".cpp", ".cc", ".hpp", ".h")
# The macros whose first string argument is a test case's name.
TEST_MACROS = ("TEST_CASE", "TEST_CASE_FIXTURE", "TEST_CASE_TEMPLATE", "SCENARIO")


def strip_comments(text):
    """C++ text with comments replaced by spaces (newlines kept), string and
    character literals left as they are."""
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append("".join(ch if ch == "\n" else " " for ch in text[i:j]))
            i = j
        elif c == 'R' and text.startswith('R"', i) and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
            m = re.match(r'R"([^()\\\s]{0,16})\(', text[i:])
            if not m:
                out.append(c)
                i += 1
                continue
            end = text.find(")" + m.group(1) + '"', i + m.end())
            j = n if end < 0 else end + len(m.group(1)) + 2
            out.append(text[i:j])
            i = j
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            j = min(j + 1, n)
            out.append(text[i:j])
            i = j
        else:
            out.append(c)
            i += 1
    return "".join(out)


ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\", '"': '"', "'": "'", "0": "\0", "?": "?"}


def decode(body):
    return re.sub(r"\\(.)", lambda m: ESCAPES.get(m.group(1), m.group(1)), body)


LITERAL = re.compile(r'\s*(?:u8|u|U|L)?"((?:[^"\\\n]|\\.)*)"')
RAW_LITERAL = re.compile(r'\s*(?:u8|u|U|L)?R"([^()\\\s]{0,16})\((.*?)\)\1"', re.S)


def literal_sequence(text, pos):
    """The joined adjacent string literals at `pos` (after whitespace), or None."""
    parts = []
    while True:
        m = RAW_LITERAL.match(text, pos)
        if m:
            parts.append(m.group(2))
            pos = m.end()
            continue
        m = LITERAL.match(text, pos)
        if m:
            parts.append(decode(m.group(1)))
            pos = m.end()
            continue
        break
    return "".join(parts) if parts else None


MACRO = re.compile(r"\b(" + "|".join(TEST_MACROS) + r")\s*\(")


def test_case_names(path):
    with open(path, encoding="utf-8", errors="replace") as f:
        text = strip_comments(f.read())
    names = []
    for m in MACRO.finditer(text):
        pos = m.end()
        if m.group(1) == "TEST_CASE_FIXTURE":
            comma = text.find(",", pos)
            if comma < 0:
                continue
            pos = comma + 1
        name = literal_sequence(text, pos)
        if name is None:
            continue  # the macro's own definition or a use without a literal
        if m.group(1) == "SCENARIO":
            name = "  Scenario: " + name  # what doctest calls it
        names.append(name)
    return names


def test_sources(tests_dir):
    for root, dirs, files in os.walk(tests_dir):
        dirs.sort()
        for f in sorted(files):
            if f.endswith(SOURCE_SUFFIXES):
                yield os.path.join(root, f)


ADD_EXECUTABLE = re.compile(r"\badd_executable\s*\(\s*([A-Za-z0-9_.+-]+)([^)]*)\)", re.S)


def binaries(tests_dir):
    """Test binary -> the source files of its add_executable."""
    result = {}
    for root, dirs, files in os.walk(tests_dir):
        dirs.sort()
        if "CMakeLists.txt" not in files:
            continue
        with open(os.path.join(root, "CMakeLists.txt"), encoding="utf-8") as f:
            text = re.sub(r"#[^\n]*", "", f.read())
        for m in ADD_EXECUTABLE.finditer(text):
            sources = [os.path.normpath(os.path.join(root, s))
                       for s in m.group(2).split() if s.endswith(SOURCE_SUFFIXES)]
            result.setdefault(m.group(1), []).extend(sources)
    return result


# `binary_or_file_test` then one or more "names" separated by commas; a ';'
# or anything else ends the list.
REFERENCE = re.compile(r'`([A-Za-z0-9_]+_test)`\s*,?\s*("[^"]*"(?:\s*,\s*"[^"]*")*)')
QUOTED = re.compile(r'"([^"]*)"')


def doc_references(doc_text):
    """(line, qualifier, name) of every test case the doc names."""
    refs = []
    for m in REFERENCE.finditer(doc_text):
        for q in QUOTED.finditer(m.group(2)):
            start = m.start(2) + q.start()
            line = doc_text.count("\n", 0, start) + 1
            name = re.sub(r"\s+", " ", q.group(1)).strip()
            refs.append((line, m.group(1), name))
    return refs


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("source_dir", nargs="?",
                        default=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    parser.add_argument("--doc", help="the guide to check (default: docs/ray-serve.md)")
    args = parser.parse_args(argv)
    tests_dir = os.path.join(args.source_dir, "tests")
    doc = args.doc or os.path.join(args.source_dir, "docs", "ray-serve.md")
    with open(doc, encoding="utf-8") as f:
        doc_text = f.read()

    names_in = {}  # source file -> its test case names
    for path in test_sources(tests_dir):
        names_in[os.path.normpath(path)] = set(test_case_names(path))
    all_names = set().union(*names_in.values()) if names_in else set()
    by_binary = binaries(tests_dir)
    by_stem = {}
    for path in names_in:
        by_stem.setdefault(os.path.splitext(os.path.basename(path))[0], []).append(path)

    refs = doc_references(doc_text)
    if not refs:
        print(f"{doc}: no test names found (expected `binary_test` \"name\", ...): "
              "the convention changed or the extraction broke", file=sys.stderr)
        return 1
    shown = os.path.relpath(doc, args.source_dir)
    problems = []
    for line, qualifier, name in refs:
        files = set(by_binary.get(qualifier, [])) | set(by_stem.get(qualifier, []))
        if not files:
            problems.append(f"{shown}:{line}: `{qualifier}` is neither a test binary "
                            f"(add_executable in tests/) nor a test file (tests/**/{qualifier}.cpp)")
            continue
        if any(name in names_in.get(f, ()) for f in files):
            continue
        if name in all_names:
            where = sorted(os.path.relpath(f, args.source_dir) for f, n in names_in.items() if name in n)
            problems.append(f"{shown}:{line}: `{qualifier}` has no test case \"{name}\" "
                            f"(it is in {', '.join(where)})")
        else:
            problems.append(f"{shown}:{line}: no test case \"{name}\" in `{qualifier}` "
                            "(nor anywhere in tests/)")
    for p in problems:
        print(p, file=sys.stderr)
    if problems:
        print(f"{len(problems)} of {len(refs)} test names quoted in {shown} do not exist",
              file=sys.stderr)
        return 1
    print(f"{len(refs)} test names quoted in {shown}: all exist "
          f"({len(all_names)} test cases in tests/)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
