#!/usr/bin/env python3
"""Sizes, checked: no function over 120 lines and no file over 700 lines in the layers (model/, sim/, exec/,
report/, api/, cli/, measured/). A function is a brace block opened at namespace or class level after a parameter
list (a definition, or a class member defined inline); its length counts from its signature's first line to its
closing brace. Prints each one over the limit and exits 1; exits 0 when none is.

    scripts/check_sizes.py [ROOT] [--max-function N] [--max-file N] [--list N]   (--list: the N longest functions)
"""
import argparse
import os
import re
import sys

LAYERS = ("model", "sim", "exec", "report", "api", "cli", "measured")
SOURCES = (".hpp", ".cpp", ".cu", ".cuh", ".h")
SCOPE_OPENER = re.compile(r"\b(namespace|class|struct|union|enum)\b[^;()]*$")


def strip(text):
    """The text with comments, string and character literals blanked (newlines kept), so braces count true."""
    out, i, n = [], 0, len(text)
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
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif text.startswith('R"', i):
            m = re.match(r'R"([^(]*)\(', text[i:])
            end = text.find(")" + m.group(1) + '"', i) if m else -1
            j = n if end < 0 else end + len(m.group(1)) + 2
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c:
                j += 2 if text[j] == "\\" else 1
            out.append(re.sub(r"[^\n]", " ", text[i:j + 1]))
            i = j + 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def functions(path):
    """(name, first line, length) of every function body in a file."""
    with open(path, encoding="utf-8", errors="replace") as f:
        text = strip(f.read())
    found, stack = [], []  # stack of (kind, start line, name): kind 'scope' or 'function' or 'block'
    statement_start, line = 0, 1
    for index, c in enumerate(text):
        if c == "\n":
            line += 1
        elif c == "{":
            header = text[statement_start:index]
            inside_function = any(kind == "function" for kind, _, _ in stack)
            flat = " ".join(header.split())
            if inside_function:
                stack.append(("block", line, ""))
            elif SCOPE_OPENER.search(flat) and ")" not in flat.split("{")[-1][-2:]:
                stack.append(("scope", line, ""))
            elif ")" in flat or flat.endswith("const") or "->" in flat:
                name = re.findall(r"([~\w:<>]+)\s*\(", flat)
                first = line - header.strip("\n").count("\n") if header.strip() else line  # the signature's line
                stack.append(("function", first, name[0] if name else flat[:40]))
            else:
                stack.append(("block", line, ""))  # an initializer list or aggregate at namespace level
            statement_start = index + 1
        elif c == "}":
            if stack:
                kind, start, name = stack.pop()
                if kind == "function" and not any(k == "function" for k, _, _ in stack):
                    found.append((name, start, line - start + 1))
            statement_start = index + 1
        elif c == ";":
            statement_start = index + 1
        elif c in ":" and text[index - 1:index + 1] != "::" and text[index:index + 2] != "::":
            # access specifiers and labels end a header (public:, case x:), but not a constructor's initializer list
            before = text[statement_start:index].strip()
            if before in ("public", "private", "protected"):
                statement_start = index + 1
    return found


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("root", nargs="?", default=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    parser.add_argument("--max-function", type=int, default=120)
    parser.add_argument("--max-file", type=int, default=700)
    parser.add_argument("--list", type=int, default=0)
    args = parser.parse_args()
    over, every = [], []
    for layer in LAYERS:
        for directory, _, files in os.walk(os.path.join(args.root, layer)):
            for name in sorted(files):
                if not name.endswith(SOURCES):
                    continue
                path = os.path.join(directory, name)
                relative = os.path.relpath(path, args.root)
                with open(path, encoding="utf-8", errors="replace") as f:
                    lines = sum(1 for _ in f)
                if lines > args.max_file:
                    over.append(f"{relative}: {lines} lines (file limit {args.max_file})")
                for function, start, length in functions(path):
                    every.append((length, f"{relative}:{start}: {function}"))
                    if length > args.max_function:
                        over.append(f"{relative}:{start}: {function} is {length} lines (limit {args.max_function})")
    for length, where in sorted(every, reverse=True)[:args.list]:
        print(f"{length:5d}  {where}")
    for line in over:
        print(line)
    if over:
        print(f"check_sizes: {len(over)} over the limits")
        return 1
    print(f"check_sizes: {len(every)} functions, none over {args.max_function} lines; no file over {args.max_file}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
