#!/usr/bin/env python3
"""scripts/check_sizes.py on the tree (no function over 120 lines in model/, sim/, exec/, report/; no file there over
700 lines) and on made-up trees: it must find a long free function, a long member defined in its class and a long file, and must not count a function's braces inside strings, comments or nested
blocks, nor a long class or namespace as one function."""
import os
import subprocess
import sys
import tempfile

ROOT = os.environ.get("TWIN_SOURCE_DIR") or os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "scripts", "check_sizes.py")


def run(root, *flags):
    return subprocess.run([sys.executable, SCRIPT, root, *flags], capture_output=True, text=True)


def tree(files):
    root = tempfile.mkdtemp()
    for path, text in files.items():
        os.makedirs(os.path.join(root, os.path.dirname(path)), exist_ok=True)
        with open(os.path.join(root, path), "w") as f:
            f.write(text)
    return root


def body(lines):
    return "".join(f"  x += {i};  // {{ not a brace\n" for i in range(lines))


checks, failures = 0, []


def expect(condition, what):
    global checks
    checks += 1
    if not condition:
        failures.append(what)


result = run(ROOT)
expect(result.returncode == 0, "the tree is over the limits:\n" + result.stdout)

long_free = "namespace a {\nint f(int x) {\n" + body(130) + "  return x;\n}\n}  // namespace a\n"
result = run(tree({"model/a.cpp": long_free}))
expect(result.returncode == 1 and "model/a.cpp:2: f is 133 lines" in result.stdout, "long free function: " + result.stdout)

long_member = "class C {\n public:\n  void g() const {\n" + body(125) + "  }\n};\n"
result = run(tree({"sim/c.hpp": long_member}))
expect(result.returncode == 1 and "sim/c.hpp:3: g is 127 lines" in result.stdout, "long member: " + result.stdout)

short_in_long_class = "class D {\n" + "".join(f"  int f{i}() {{ return {i}; }}\n" for i in range(200)) + "};\n"
strings = 'const char* s = "}}}}";\nint h(int x) {\n  if (x) {\n    x = 1;\n  }\n  /* } */ return x;\n}\n'
result = run(tree({"exec/d.hpp": short_in_long_class, "exec/e.cpp": strings}))
expect(result.returncode == 0, "short functions in a long class, braces in strings: " + result.stdout)

long_file = "".join(f"int v{i} = {i};\n" for i in range(701))
result = run(tree({"report/f.cpp": long_file}))
expect(result.returncode == 1 and "report/f.cpp: 701 lines" in result.stdout, "long file: " + result.stdout)

result = run(tree({"kernels/g.cpp": long_free}))
expect(result.returncode == 0, "a folder outside the core layers is not checked: " + result.stdout)

for failure in failures:
    print("FAIL:", failure)
print(f"{checks - len(failures)} passed, {len(failures)} failed")
sys.exit(1 if failures else 0)
