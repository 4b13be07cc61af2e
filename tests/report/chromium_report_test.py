#!/usr/bin/env python3
"""twin report's pages as a browser shows them: a simulation, a sweep, a search and a comparison of a small scenario
(seconds each), each page loaded in headless Chromium (--dump-dom) and its rendered DOM read back. Each page must
have every section of its kind with something drawn in it, its script must have run to the end (data-rendered), and
no console error may have occurred: none counted by the page's own hook (data-console-errors on <html>) and none in
Chromium's log (--enable-logging=stderr prints every console message as a CONSOLE line).

Exits 77 (ctest: skipped) with the reason when no Chromium is installed (Debian: apt-get install chromium).

    chromium_report_test.py --twin build/cli/twin
"""
import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile

SECTIONS = {
    "sim": ["summary", "time-split", "stages", "pipeline"],
    "sweep": ["summary", "curve", "time-split", "variants"],
    "search": ["summary", "ranking", "time-split", "plans"],
    "compare": ["summary", "predicted-vs-measured", "stages"],
}
# One DGX H200 node, micro-batch 1: 8 GPUs, the same plan family as the tests of twin sim.
SMALL = ["--set", 'cluster.node="dgx-h200"', "--set", "cluster.nodes=1", "--set", "parallel.micro_batch=1",
         "--set", "parallel.global_batch=64", "--quiet"]
# An interleaved pipeline (2 stages x 2 chunks, 16 micro-batches), and a model name the page must escape.
INTERLEAVED = ["--set", "parallel.pp=2", "--set", 'parallel.schedule="interleaved"', "--set",
               "parallel.virtual_stages=2", "--set", 'model.name="tiny <b> & \\"q\\""']


def run(command, cwd):
    result = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=120)
    if result.returncode != 0:
        sys.exit(f"FAILED: {' '.join(command)}\n{result.stdout}{result.stderr}")
    return result


def documents(twin, folder):
    """The four --json files, written by twin itself."""
    run([twin, "sim", "gpt-tiny", *SMALL, *INTERLEAVED, "--json", "sim.json"], folder)
    run([twin, "sweep", "gpt-tiny", *SMALL, "--vary", "parallel.pp=1,2,4", "--jobs", "2", "--json", "sweep.json"],
        folder)
    run([twin, "search", "gpt-tiny", *SMALL, "--max", "3", "--jobs", "2", "--json", "search.json"], folder)
    # The same plan at group fidelity as the "measurement": a comparison with every stage in it.
    run([twin, "sim", "gpt-tiny", *SMALL, *INTERLEAVED, "--fidelity", "group", "--json", "group.json"], folder)
    run([twin, "compare", "sim.json", "group.json", "--json", "compare.json"], folder)


def rendered(browser, page, folder):
    """The DOM after the page's scripts ran, and Chromium's log."""
    result = subprocess.run(
        [browser, "--headless", "--disable-gpu", "--no-sandbox", "--no-first-run",
         f"--user-data-dir={os.path.join(folder, 'profile')}", "--enable-logging=stderr", "--v=0", "--dump-dom",
         "file://" + os.path.join(folder, page)],
        capture_output=True, text=True, timeout=120)
    if result.returncode != 0:
        sys.exit(f"FAILED: chromium on {page} exited {result.returncode}\n{result.stderr[-3000:]}")
    return result.stdout, result.stderr


def check(kind, dom, log):
    problems = []
    root = re.search(r"<html[^>]*>", dom)  # the page's hooks mark the <html> element
    root = root.group(0) if root else ""
    if 'data-rendered="yes"' not in root:
        problems.append("the page's script did not run to its end (no data-rendered on <html>)")
    if "data-console-errors" in root:
        problems.append("the page counted console errors: " + root)
    for line in log.splitlines():
        if ":CONSOLE" in line:
            problems.append("console: " + line)
    for section in SECTIONS[kind]:
        found = re.search(rf'<section id="{section}">(.*?)</section>', dom, re.S)
        if not found:
            problems.append(f"no section '{section}'")
        elif not re.search(r"<(svg|table|dl)\b", found.group(1)):
            problems.append(f"section '{section}' draws nothing")
    if kind == "sim":
        pipeline = re.search(r'<section id="pipeline">(.*?)</section>', dom, re.S)
        for text in ("stage 1 chunk 1", "backward (chunk 1)"):
            if pipeline and text not in pipeline.group(1):
                problems.append(f"the pipeline has no '{text}' (a row per stage and chunk, chunks in the legend)")
        if "tiny &lt;b&gt; &amp; " not in dom or "<b>" in dom:
            problems.append("the model's name is not escaped")
    return problems


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--twin", required=True)
    args = parser.parse_args()
    browser = next((shutil.which(name) for name in ("chromium", "chromium-browser") if shutil.which(name)), None)
    if browser is None:
        print("skipped: no chromium on PATH (Debian's chromium package; scripts/install-deps.sh installs it)")
        return 77
    twin = os.path.abspath(args.twin)
    failures = []
    with tempfile.TemporaryDirectory(prefix="twin-report-") as folder:
        documents(twin, folder)
        for kind in SECTIONS:
            run([twin, "report", f"{kind}.json", "-o", f"{kind}.html"], folder)
            dom, log = rendered(browser, f"{kind}.html", folder)
            failures += [f"{kind}: {problem}" for problem in check(kind, dom, log)]
            print(f"{kind}: {len(dom)} characters of rendered DOM, sections {', '.join(SECTIONS[kind])}")
    for failure in failures:
        print("FAILED:", failure)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
