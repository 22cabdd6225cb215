#!/usr/bin/env python3
"""The longest function bodies of troupe's sources, and a limit on them.

Reads the *.cpp and *.hpp files of node/, proxy/, replica/, controller/,
config/ and runtime/, finds every function defined at namespace or class
scope, and measures its body in lines: from the line of its opening `{` to the
line of the matching `}`, both counted. Everything inside a body belongs to
it: the lambdas of an actor behaviour (`return { handlers... };`), local
classes, nested blocks. A lambda stored in a variable at namespace or class
scope is not a function here.

The scanner:
  * blanks comments, string literals (raw strings R"d(...)d" too, with their
    prefixes), character literals (not digit separators: 1'000) and
    preprocessor lines, and keeps only the first branch of #if/#else (its
    other branches are blanked), so braces are matched on code alone;
  * at namespace or class scope, judges each `{` by the declaration before it
    (since the last `;`, `{` or `}` of that scope): `namespace X {`,
    `extern "C" {`, `class/struct/union X ... {` are entered; `enum`,
    initialisers (`= {`, `x{...}`) and anything else are skipped whole; a
    function is a parameter list `( ... )` right after a name (or an
    `operator`), followed only by qualifiers (const, noexcept(...), override,
    final, &, &&, ...), a trailing return type `-> T`, or a constructor's
    initialiser list `: a(x), b{y}` (whose braces are not the body).
  * names a function by the (qualified) identifier before its parameters:
    `node_main`, `Core::on_request`, `~Replica`, `operator()`.

Usage:
  check_function_length.py [SOURCE_DIR] [--max N] [--top K] [--allow FILE:FUNCTION]...
  check_function_length.py [SOURCE_DIR] --selftest

Prints the K longest (default 10) as `path:line: name: N lines`, then every
function over N lines (default 150) that is not allowed. An --allow names one
known exception by the file (relative to SOURCE_DIR) and the name printed; it
must still exist and still be over the limit, or the check fails and asks for
the entry to be removed, so the list only shrinks as functions are split.
Exits 1 when a function is over the limit without an --allow, or an --allow
is stale; 0 otherwise.

--selftest measures the files of tests/tools/function_length_fixture/ (raw
strings and comments holding braces, a class with inline methods, constructors
with initialiser lists, a lambda-heavy behaviour, preprocessor branches) and
compares every function found, its line and its length with the known ones,
then runs the limit and the --allow rules over it. Exits 0 when all hold.
"""

import argparse
import bisect
import io
import os
import re
import sys
from contextlib import redirect_stdout

SCANNED_DIRS = ("node", "proxy", "replica", "controller", "config", "runtime")
EXTENSIONS = (".cpp", ".hpp")
FIXTURE = os.path.join("tests", "tools", "function_length_fixture")

# --------------------------------------------------------------------------
# Blanking: comments, literals and preprocessor lines become spaces (newlines
# are kept, so offsets and line numbers stay those of the file).

RAW_PREFIXES = ("", "u8", "u", "U", "L")


def _blank(chars, start, end, keep_ends=False):
    """Blanks chars[start:end] but its newlines; keep_ends keeps the first
    and last character (a literal's quotes)."""
    lo, hi = (start + 1, end - 1) if keep_ends else (start, end)
    for k in range(lo, hi):
        if chars[k] != "\n":
            chars[k] = " "


def _ident_before(text, i):
    j = i
    while j > 0 and (text[j - 1].isalnum() or text[j - 1] == "_"):
        j -= 1
    return text[j:i]


def blank_code(text):
    """The text with comments, string and character literals and
    preprocessor directives blanked, and the #elif/#else branches of every
    conditional blanked whole."""
    chars = list(text)
    n = len(text)
    i = 0
    at_line_start = True
    # One entry per open #if: True while its first branch is being read.
    conditionals = []

    def dropping():
        return not all(conditionals)

    while i < n:
        c = text[i]
        if c == "\n":
            at_line_start = True
            i += 1
            continue
        if at_line_start and c in " \t\r\f\v":
            i += 1
            continue
        if at_line_start and c == "#":
            # A directive, with its backslash continuations.
            j = i
            while True:
                k = text.find("\n", j)
                k = n if k < 0 else k
                if k > 0 and text[k - 1] == "\\" and k < n:
                    j = k + 1
                    continue
                break
            directive = re.match(r"#\s*(\w*)", text[i:k]).group(1)
            if directive in ("if", "ifdef", "ifndef"):
                conditionals.append(True)
            elif directive in ("elif", "else", "elifdef", "elifndef") and conditionals:
                conditionals[-1] = False
            elif directive == "endif" and conditionals:
                conditionals.pop()
            _blank(chars, i, k)
            i = k
            continue
        if dropping():
            k = text.find("\n", i)
            k = n if k < 0 else k
            _blank(chars, i, k)
            i = k
            continue
        at_line_start = False
        if text.startswith("//", i):
            k = i
            while True:  # a line comment continues past a trailing backslash
                e = text.find("\n", k)
                e = n if e < 0 else e
                if e < n and e > 0 and text[e - 1] == "\\":
                    k = e + 1
                    continue
                break
            _blank(chars, i, e)
            i = e
        elif text.startswith("/*", i):
            e = text.find("*/", i + 2)
            e = n if e < 0 else e + 2
            _blank(chars, i, e)
            i = e
        elif c == '"':
            prefix = _ident_before(text, i)
            if prefix.endswith("R") and prefix[:-1] in RAW_PREFIXES:
                m = re.match(r'"([^()\\\s]{0,16})\(', text[i:])
                if m:
                    close = ")" + m.group(1) + '"'
                    e = text.find(close, i + m.end())
                    e = n if e < 0 else e + len(close)
                    _blank(chars, i, e, keep_ends=True)
                    i = e
                    continue
            e = i + 1
            while e < n and text[e] != '"' and text[e] != "\n":
                e += 2 if text[e] == "\\" else 1
            e = min(e + 1, n)
            _blank(chars, i, e, keep_ends=True)
            i = e
        elif c == "'":
            run = _ident_before(text, i)
            if run and run[0].isdigit():
                i += 1  # a digit separator: 1'000'000
                continue
            e = i + 1
            while e < n and text[e] != "'" and text[e] != "\n":
                e += 2 if text[e] == "\\" else 1
            e = min(e + 1, n)
            _blank(chars, i, e, keep_ends=True)
            i = e
        else:
            i += 1
    return "".join(chars)


# --------------------------------------------------------------------------
# Tokens of the blanked text.

TOKEN = re.compile(r"""
    (?P<ident>[A-Za-z_]\w*)
  | (?P<number>\.?[0-9](?:[\w.']|[eEpP][+-])*)
  | (?P<string>"[^"\n]*"|'[^'\n]*')
  | (?P<punct>::|->\*?|\.\.\.|&&|\|\||<<=?|>>=?|[<>=!+\-*/%^&|]=|\+\+|--|<=>|\S)
""", re.VERBOSE)


class Tok:
    __slots__ = ("kind", "text", "pos", "end", "items")

    def __init__(self, kind, text, pos, end=None, items=None):
        self.kind = kind  # ident, number, string, punct, or group ( [ {
        self.text = text
        self.pos = pos
        self.end = end
        self.items = items

    def __repr__(self):
        return f"{self.text}" if self.kind != "group" else f"{self.text}...)"


def tokenize(code):
    out = []
    for m in TOKEN.finditer(code):
        kind = m.lastgroup
        out.append(Tok(kind, m.group(kind), m.start()))
    return out


OPEN = {"(": ")", "[": "]", "{": "}"}
CLOSERS = set(OPEN.values())


def read_group(tokens, i):
    """The balanced group opening at tokens[i], as one Tok, and the index
    after it."""
    opener = tokens[i]
    depth = 0
    j = i
    while j < len(tokens):
        t = tokens[j].text
        if tokens[j].kind == "punct":
            if t in OPEN:
                depth += 1
            elif t in CLOSERS:
                depth -= 1
                if depth == 0:
                    break
        j += 1
    end = tokens[j].pos if j < len(tokens) else opener.pos
    return Tok("group", opener.text, opener.pos, end, tokens[i + 1:j]), j + 1


# --------------------------------------------------------------------------
# Judging the declaration before a `{` at namespace or class scope.

NOT_NAMES = {
    "if", "while", "for", "switch", "return", "sizeof", "decltype", "alignof", "alignas",
    "noexcept", "throw", "static_assert", "__attribute__", "__declspec", "requires", "typeid",
    "catch", "void", "int", "char", "bool", "long", "short", "unsigned", "signed", "float",
    "double", "auto", "explicit", "new", "delete", "case", "default",
}
QUALIFIERS = {"const", "volatile", "override", "final", "mutable", "constexpr", "consteval",
              "&", "&&", "try"}
TYPE_PUNCT = {"::", "<", ">", ">>", ",", "*", "&", "&&", "..."}


def is_group(tok, opener="("):
    return tok.kind == "group" and tok.text == opener


def name_before(head, k):
    """The name of the function whose parameter group is head[k], or None
    when head[k] does not follow a name."""
    if k == 0:
        return None
    name = j = None
    # operator(), operator==, operator<<, operator new, operator std::string:
    # `operator` then symbols, names or an empty `()`, then the parameters.
    for back in range(1, min(k, 6) + 1):
        t = head[k - back]
        if t.kind == "ident" and t.text == "operator":
            rest = head[k - back + 1:k]
            spelled = "".join("()" if x.kind == "group" else x.text for x in rest)
            sep = " " if rest and rest[0].kind == "ident" else ""
            name, j = "operator" + sep + spelled, k - back
            break
        if t.kind == "group" and not (back == 1 and is_group(t) and not t.items):
            break
        if t.text in (";", "{", "}"):
            break
    if name is None:
        prev = head[k - 1]
        if prev.kind != "ident" or prev.text in NOT_NAMES:
            return None
        name, j = prev.text, k - 1
        if j > 0 and head[j - 1].text == "~":
            name, j = "~" + name, j - 1
    # Qualification: A::B::name
    while j >= 2 and head[j - 1].text == "::" and head[j - 2].kind == "ident":
        name, j = head[j - 2].text + "::" + name, j - 2
    return name


def function_suffix(rest):
    """Judges what follows a parameter list: 'function' when it is only
    qualifiers, a trailing return type and a complete initialiser list;
    'init' when it ends inside an initialiser list (the `{` to come is a
    member's initialiser); None when it is not a function."""
    i, n = 0, len(rest)
    while i < n:
        t = rest[i]
        if t.kind == "punct" and t.text in QUALIFIERS or t.kind == "ident" and t.text in QUALIFIERS:
            i += 1
        elif t.text in ("noexcept", "throw") and t.kind == "ident":
            i += 1
            if i < n and is_group(rest[i]):
                i += 1
        elif is_group(t, "["):  # [[attributes]]
            i += 1
        else:
            break
    if i < n and rest[i].text == "->":  # trailing return type
        i += 1
        while i < n and (rest[i].kind == "ident" and rest[i].text not in ("requires",) or
                         rest[i].kind == "punct" and rest[i].text in TYPE_PUNCT or
                         is_group(rest[i])):
            i += 1
    if i < n and rest[i].text == "requires":
        return None  # constraints: not read (none in the tree)
    if i == n:
        return "function"
    if rest[i].text != ":":
        return None
    # The constructor's initialiser list: item (, item)*, item = name args
    i += 1
    while True:
        start = i
        depth = 0
        while i < n and (rest[i].kind == "ident" or rest[i].text in ("::", "<", ">", ">>", ",")
                         and (rest[i].text != "," or depth > 0)):
            if rest[i].text == "<":
                depth += 1
            elif rest[i].text == ">":
                depth -= 1
            elif rest[i].text == ">>":
                depth -= 2
            i += 1
        if i == start:
            return None
        if i == n:
            return "init"  # the coming `{` initialises this member
        if not (is_group(rest[i]) or is_group(rest[i], "{")):
            return None
        i += 1
        if i < n and rest[i].text == "...":
            i += 1
        if i == n:
            return "function"
        if rest[i].text != ",":
            return None
        i += 1


def top_level_keyword(head, words):
    """The index of the last ident of head in words, or -1 (a group of
    head, `( ... )` or `[ ... ]`, is one token: its inside is not searched)."""
    for k in range(len(head) - 1, -1, -1):
        if head[k].kind == "ident" and head[k].text in words:
            return k
    return -1


def judge(head):
    """('namespace'|'class'|'function'|'init'|'other', name, name_token)."""
    if not head:
        return ("other", None, None)
    k = top_level_keyword(head, {"namespace"})
    if k >= 0 and all(t.kind == "ident" or t.text == "::" for t in head[k + 1:]):
        return ("namespace", None, None)
    if len(head) >= 2 and head[-2].text == "extern" and head[-1].kind == "string":
        return ("namespace", None, None)  # extern "C" {
    k = top_level_keyword(head, {"enum"})
    if k >= 0 and not any(t.kind == "group" and t.text == "(" for t in head[k + 1:]):
        return ("other", None, None)
    k = top_level_keyword(head, {"class", "struct", "union"})
    if k >= 0 and not any(is_group(t) and head[j - 1].text != "alignas" or t.text == "="
                          for j, t in enumerate(head[k + 1:], k + 1)):
        return ("class", None, None)
    for k, t in enumerate(head):
        if not is_group(t):
            continue
        name = name_before(head, k)
        if name is None:
            continue
        verdict = function_suffix(head[k + 1:])
        if verdict is None:
            continue
        return (verdict, name, head[k - 1])  # the name's last token, for its line
    return ("other", None, None)


# --------------------------------------------------------------------------
# The scan of one file.

class Function:
    __slots__ = ("path", "line", "name", "lines")

    def __init__(self, path, line, name, lines):
        self.path, self.line, self.name, self.lines = path, line, name, lines

    def __repr__(self):
        return f"{self.path}:{self.line}: {self.name}: {self.lines} lines"


def scan_text(text, path="<text>"):
    code = blank_code(text)
    newlines = [m.start() for m in re.finditer("\n", code)]

    def line_of(pos):
        return bisect.bisect_right(newlines, pos - 1) + 1

    tokens = tokenize(code)
    found = []

    def matching_brace(i):
        depth = 0
        for j in range(i, len(tokens)):
            t = tokens[j]
            if t.kind != "punct":
                continue
            if t.text == "{":
                depth += 1
            elif t.text == "}":
                depth -= 1
                if depth == 0:
                    return j
        return len(tokens) - 1

    def scope(i):
        """Reads declarations from tokens[i] to the `}` closing this scope;
        returns the index after that `}`."""
        head = []
        while i < len(tokens):
            t = tokens[i]
            if t.kind == "punct" and t.text == ";":
                head = []
                i += 1
            elif t.kind == "punct" and t.text == "}":
                return i + 1
            elif t.kind == "punct" and t.text in ("(", "["):
                group, i = read_group(tokens, i)
                head.append(group)
            elif t.kind == "punct" and t.text == "{":
                kind, name, name_tok = judge(head)
                if kind in ("namespace", "class"):
                    i = scope(i + 1)
                    head = []
                elif kind == "function":
                    close = matching_brace(i)
                    found.append(Function(path, line_of(name_tok.pos), name,
                                          line_of(tokens[close].pos) - line_of(t.pos) + 1))
                    i = close + 1
                    head = []
                else:
                    # A member's initialiser in a constructor's list, an
                    # enum, `x{...}`, `= {...}`: skipped whole, a part of the
                    # declaration (which a `;` ends).
                    group, i = read_group(tokens, i)
                    head.append(group)
            else:
                head.append(t)
                i += 1
        return i

    i = 0
    while i < len(tokens):
        i = scope(i)  # a stray `}` at file scope is skipped
    return found


def scan_tree(source_dir, dirs=SCANNED_DIRS):
    functions = []
    for top in dirs:
        root = os.path.join(source_dir, top)
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames.sort()
            for name in sorted(filenames):
                if not name.endswith(EXTENSIONS):
                    continue
                full = os.path.join(dirpath, name)
                rel = os.path.relpath(full, source_dir).replace(os.sep, "/")
                with open(full, encoding="utf-8", errors="replace") as f:
                    functions += scan_text(f.read(), rel)
    return functions


def longest_first(functions):
    return sorted(functions, key=lambda f: (-f.lines, f.path, f.line))


# --------------------------------------------------------------------------

def check(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("source_dir", nargs="?",
                        default=os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    parser.add_argument("--max", type=int, default=150, help="longest body allowed, in lines")
    parser.add_argument("--top", type=int, default=10, help="how many of the longest to print")
    parser.add_argument("--allow", action="append", default=[], metavar="FILE:FUNCTION",
                        help="a known exception to the limit (repeatable)")
    parser.add_argument("--selftest", action="store_true")
    args = parser.parse_args(argv)
    source_dir = os.path.abspath(args.source_dir)
    if args.selftest:
        return selftest(source_dir)

    functions = longest_first(scan_tree(source_dir))
    if not functions:
        print(f"no functions found under {source_dir} ({', '.join(SCANNED_DIRS)})")
        return 1
    if args.top > 0:
        print(f"the {min(args.top, len(functions))} longest of {len(functions)} functions:")
        for f in functions[:args.top]:
            print(f"  {f}")

    allowed = {}
    problems = []
    for entry in args.allow:
        # FILE:FUNCTION; the function's name may hold '::' (FILE:Class::method).
        m = re.match(r"^([^:]+):(.+)$", entry)
        if not m:
            problems.append(f"--allow {entry}: expected FILE:FUNCTION")
            continue
        allowed[(m.group(1), m.group(2))] = entry

    over = [f for f in functions if f.lines > args.max]
    for f in over:
        if (f.path, f.name) not in allowed:
            problems.append(f"{f.path}:{f.line}: {f.name}: {f.lines} lines, over the limit of "
                            f"{args.max}: split it")
    for (path, name), entry in sorted(allowed.items()):
        same = [f for f in functions if f.path == path and f.name == name]
        if not same:
            problems.append(f"--allow {entry}: no function {name} in {path} any more: remove "
                            f"this --allow from the list (tests/CMakeLists.txt)")
        elif all(f.lines <= args.max for f in same):
            longest = max(f.lines for f in same)
            problems.append(f"--allow {entry}: {name} is {longest} lines now, within the limit "
                            f"of {args.max}: remove this --allow from the list "
                            f"(tests/CMakeLists.txt)")
    for p in problems:
        print(p)
    if problems:
        print(f"{len(problems)} problem(s) with the length of functions "
              f"(limit {args.max} lines; tools/check_function_length.py)")
        return 1
    excused = len([f for f in over if (f.path, f.name) in allowed])
    print(f"no function over {args.max} lines" +
          (f" but the {excused} allowed" if excused else ""))
    return 0


# --------------------------------------------------------------------------
# Self-test over tests/tools/function_length_fixture/.

# (path, line of the name, name, lines of the body): every function in it,
# counted by hand.
FIXTURE_FUNCTIONS = [
    ("node/behaviour.cpp", 14, "spawn_worker", 8),  # braces in literals and comments
    ("node/behaviour.cpp", 24, "worker", 38),  # an actor behaviour: lambdas, a local struct
    ("node/behaviour.cpp", 66, "operator()", 3),
    ("node/behaviour.cpp", 70, "operator==", 3),
    ("node/behaviour.cpp", 75, "legacy_entry", 4),  # in extern "C" { }
    ("node/behaviour.cpp", 81, "platform_name", 11),  # an #if/#else of unbalanced braces
    ("proxy/widgets.hpp", 17, "Widget", 2),  # an initialiser list over lines, with braces
    ("proxy/widgets.hpp", 23, "Widget", 1),  # initialisers of braces only
    ("proxy/widgets.hpp", 24, "~Widget", 3),
    ("proxy/widgets.hpp", 28, "size", 1),
    ("proxy/widgets.hpp", 29, "name", 3),
    ("proxy/widgets.hpp", 35, "Inner", 1),
    ("proxy/widgets.hpp", 36, "twice", 1),
    ("proxy/widgets.hpp", 50, "make_widget", 3),  # a trailing return type
    ("proxy/widgets.hpp", 54, "Widget::area", 6),
    ("proxy/widgets.hpp", 61, "page", 16),  # raw strings holding braces
    ("proxy/widgets.hpp", 79, "escape", 8),  # character literals '"' and '\\'
    ("proxy/widgets.hpp", 89, "sum", 3),
]
ALL_OVER_5 = ["node/behaviour.cpp:worker", "proxy/widgets.hpp:page",
              "node/behaviour.cpp:platform_name", "node/behaviour.cpp:spawn_worker",
              "proxy/widgets.hpp:escape", "proxy/widgets.hpp:Widget::area"]


def selftest(source_dir):
    fixture = os.path.join(source_dir, FIXTURE)
    failures = []
    got = [(f.path, f.line, f.name, f.lines) for f in scan_tree(fixture)]
    for want in FIXTURE_FUNCTIONS:
        if want not in got:
            failures.append(f"expected {want[0]}:{want[1]}: {want[2]}: {want[3]} lines; not found")
    for g in got:
        if g not in FIXTURE_FUNCTIONS:
            failures.append(f"found {g[0]}:{g[1]}: {g[2]}: {g[3]} lines; not expected")

    def run(*argv):
        out = io.StringIO()
        with redirect_stdout(out):
            rc = check([fixture, *argv])
        return rc, out.getvalue()

    def allow(*entries):
        return [arg for e in entries for arg in ("--allow", e)]

    cases = [
        # (argv, exit status, strings the output must hold)
        ([], 0, ["the 10 longest of 18 functions:\n  node/behaviour.cpp:24: worker: 38 lines\n",
                 "no function over 150 lines\n"]),
        (["--max", "15", "--top", "3"], 1,
         ["the 3 longest of 18 functions:\n  node/behaviour.cpp:24: worker: 38 lines\n"
          "  proxy/widgets.hpp:61: page: 16 lines\n"
          "  node/behaviour.cpp:81: platform_name: 11 lines\n"
          "node/behaviour.cpp:24: worker: 38 lines, over the limit of 15: split it\n"
          "proxy/widgets.hpp:61: page: 16 lines, over the limit of 15: split it\n"
          "2 problem(s)"]),
        (["--max", "15", *allow("node/behaviour.cpp:worker", "proxy/widgets.hpp:page")], 0,
         ["no function over 15 lines but the 2 allowed\n"]),
        (["--max", "5", *allow(*ALL_OVER_5)], 0, ["no function over 5 lines but the 6 allowed\n"]),
        (["--max", "5", *allow(*ALL_OVER_5[1:])], 1,
         ["node/behaviour.cpp:24: worker: 38 lines, over the limit of 5: split it\n1 problem(s)"]),
        (["--max", "16", *allow("node/behaviour.cpp:worker", "proxy/widgets.hpp:page")], 1,
         ["--allow proxy/widgets.hpp:page: page is 16 lines now, within the limit of 16: remove "
          "this --allow from the list (tests/CMakeLists.txt)\n1 problem(s)"]),
        (["--max", "15", *allow("node/behaviour.cpp:worker", "proxy/widgets.hpp:page",
                                "node/gone.cpp:split_long_ago")], 1,
         ["--allow node/gone.cpp:split_long_ago: no function split_long_ago in node/gone.cpp any "
          "more: remove this --allow from the list (tests/CMakeLists.txt)\n1 problem(s)"]),
        (["--max", "15", *allow("node/behaviour.cpp")], 1,
         ["--allow node/behaviour.cpp: expected FILE:FUNCTION"]),
    ]
    for argv, want_rc, needles in cases:
        rc, out = run(*argv)
        missing = [s for s in needles if s not in out]
        if rc != want_rc or missing:
            failures.append(f"check {' '.join(argv) or '(defaults)'}: expected exit {want_rc} "
                            f"and {missing}; got exit {rc}:\n{out}")

    for f in failures:
        print(f)
    if failures:
        print(f"{len(failures)} failure(s) in the self-test of tools/check_function_length.py")
        return 1
    print(f"self-test: the {len(FIXTURE_FUNCTIONS)} functions of {FIXTURE} measured as "
          f"expected; {len(cases)} runs of the limit and --allow as expected")
    return 0


if __name__ == "__main__":
    sys.exit(check(sys.argv[1:]))
