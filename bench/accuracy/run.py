#!/usr/bin/env python3
"""Predicted against published: simulate every run of scenarios/published/published.toml with `twin sim` and print
the iteration time twin predicts, the published one, the error and the mean absolute percentage error (MAPE).

    bench/accuracy/run.py                           # finds build*/cli/twin
    bench/accuracy/run.py --twin build/cli/twin --markdown --json accuracy.json
    bench/accuracy/run.py --only mtnlg              # runs whose name matches a regular expression
    bench/accuracy/run.py --set cluster.gemm_tflops=267.9 --set 'cluster.gemm_shape=[6912,16384,2048]'
                                                    # a sensitivity: every run with one more override (here
                                                    # today's CUDA 12 GEMM instead of the runs' CUDA 11)

Runs of one `series` (same model and plan, only the data-parallel degree varies) are also split into a time per
sequence and a fixed time per iteration, for the published and the predicted times alike (split_series).

Mixture-of-Experts runs (group "moe") are printed apart, after the dense runs and their series, with their own
table and MAPE: the dense output stays what it was, and "all" stays the dense runs' MAPE. The held-out dense runs
(group "bridge-dense": Megatron-Bridge's Llama 3 rows on H100, B200 and GB200) and the held-out token-dropping MoE
runs (group "moe-tokendrop": Megatron-Bridge's Qwen3-30B-A3B rows of the 25.09 container, padded to capacity) and
the held-out dropless MoE runs of later containers (group "moe-later": the same tables' Qwen3-30B-A3B rows of the
26.02.01 to 26.06 containers) and the held-out MoE runs of Megatron-Bridge's model verification cards (group
"moe-cards") are printed apart the same way, last, with a MAPE per GPU generation (of cluster.node, as
the bands have it), in neither "all" nor "all-hopper" nor "moe".

A run marked `mape = false` (with its reason in `why`) is simulated and printed like the others, marked `*`, but left
out of every MAPE and of --max-mape: published numbers that do not meet the bar the set holds to (a pinned software
version), kept visible rather than dropped (mape_by_group).

--write-bands writes bench/accuracy/bands.json: for each (GPU generation, dense or MoE, precision) the signed error
range of the published runs counted in the MAPE (write_bands). `twin sim` embeds that file when it is built and
prints the band beside its iteration time; the file is generated, never typed (tests/bench/bands_test.py checks it
against the runs it names).

Published TFLOP/s per GPU are turned into seconds with the paper's own count, Narayanan et al.'s
F = 96 B s l h^2 (1 + s/(6h) + V/(16 l h)), so that every error is an error on the iteration time:
error = predicted / published - 1 (negative: twin is too fast). No build step: it needs Python 3.11+ (tomllib) and a
built `twin`.
"""
import argparse
import concurrent.futures
import glob
import json
import os
import re
import subprocess
import sys
import tempfile
import tomllib

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PUBLISHED = os.path.join(ROOT, "scenarios", "published")
# Framework keys this bench's scenarios use that a twin older than docs/accuracy.md does not know (--legacy).
NEW_FRAMEWORK_KEYS = ("dropout", "fused_kernels", "tp_comm_overlap", "gradient_accumulation_fusion",
                      "pipeline_gather_copies")


def find_twin():
    candidates = [p for p in glob.glob(os.path.join(ROOT, "build*", "cli", "twin")) if os.access(p, os.X_OK)]
    if not candidates:
        sys.exit("bench/accuracy: no built twin under build*/cli/twin; pass --twin PATH")
    return max(candidates, key=os.path.getmtime)


def scenario_with_overrides(path, overrides):
    with open(path, "rb") as f:
        scenario = tomllib.load(f)
    for item in overrides:
        key, value = item.split("=", 1)
        section, name = key.split(".", 1)
        try:
            value = tomllib.loads(f"v = {value}")["v"]
        except tomllib.TOMLDecodeError:
            pass
        scenario.setdefault(section, {})[name] = value
    return scenario


def megatron_core_flops_per_token(model, vocab):
    """Megatron-Core's model FLOPs per token of a dense GPT (megatron/training/training.py,
    num_floating_point_operations): 3 passes x 2 FLOPs per multiply-add over the QKV and output projections (grouped
    query heads), the MLP (x 3 / 2 for SwiGLU's gate), the logits, and the causal attention core (half the scores:
    6 x heads x head_dim x seq per token and layer). What NVIDIA's NeMo / Megatron-Bridge tables call "Model TFLOP/sec
    /GPU"; no recomputation counted."""
    h, l, s = model["hidden"], model["layers"], model["seq_len"]
    heads = model["heads"]
    kv = model.get("kv_heads", heads)
    d = h // heads
    q, k = heads * d, kv * d
    ffn = model.get("ffn_hidden", 4 * h)
    gated = 3 if model.get("activation", "gelu") == "swiglu" else 2
    per_layer = 6 * (h * (q + 2 * k) + q * h) + 6 * h * ffn * gated + 6 * q * s
    return l * per_layer + 6 * h * vocab


def dense_parameters(model, vocab, tied_embeddings):
    """The parameters of a dense GPT/Llama: each layer's QKV (grouped query heads) and output projections, its MLP
    (x 3 / 2 for SwiGLU's gate) and its two norms' weights, the final norm, the word embedding and, untied, the output
    layer (the counts of the models' released config.json: Llama 3 405B gives 405.85e9)."""
    h, l = model["hidden"], model["layers"]
    heads = model["heads"]
    kv = model.get("kv_heads", heads)
    d = h // heads
    q, k = heads * d, kv * d
    ffn = model.get("ffn_hidden", 4 * h)
    gated = 3 if model.get("activation", "gelu") == "swiglu" else 2
    per_layer = h * (q + 2 * k) + q * h + gated * h * ffn + 2 * h
    return l * per_layer + h + h * vocab * (1 if tied_embeddings else 2)


def published_seconds(run, scenario):
    if "iteration_time_s" in run:
        return float(run["iteration_time_s"])
    m, p, c = scenario["model"], scenario["parallel"], scenario["cluster"]
    gpus = c["nodes"] * c.get("gpus_per_node", 8)
    if "tokens_per_s" in run:  # the whole job's throughput: one global batch of sequences per iteration
        return p["global_batch"] * m["seq_len"] / float(run["tokens_per_s"])
    if "tokens_per_s_per_gpu" in run:  # NVIDIA's performance tables: per GPU
        return p["global_batch"] * m["seq_len"] / (float(run["tokens_per_s_per_gpu"]) * gpus)
    B, s, l, h = p["global_batch"], m["seq_len"], m["layers"], m["hidden"]
    V = run["flops_vocab"]
    if run.get("flop_count") == "megatron-core":
        flops = B * s * megatron_core_flops_per_token(m, V)
    elif run.get("flop_count") == "6nd":  # 6 FLOPs per parameter and token, no attention core
        tied = scenario.get("framework", {}).get("tied_embeddings", True)
        flops = 6 * B * s * dense_parameters(m, V, tied)
    else:
        flops = 96 * B * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h))
    return flops / (gpus * run["tflops_per_gpu"] * 1e12)


BANDS = os.path.join(ROOT, "bench", "accuracy", "bands.json")


def gpu_generation(node):
    """The GPU generation of a cluster.node name (model/scenario/scenario_names.hpp kNodes); api/band.cpp maps the
    same names the same way."""
    if "a100" in node:
        return "ampere"
    if "h100" in node or "h200" in node or "h800" in node:
        return "hopper"
    if "b200" in node:
        return "blackwell"
    return node


def band_key(scenario):
    """(GPU generation, "dense" or "moe", precision) of an effective scenario: precision is model.fp8's format when
    set ("fp8"), else model.dtype."""
    model = scenario["model"]
    generation = gpu_generation(scenario["cluster"].get("node", "dgx-a100"))
    kind = "moe" if model.get("experts", 0) > 0 else "dense"
    precision = "fp8" if model.get("fp8", "none") != "none" else model.get("dtype", "bf16")  # C++ defaults
    return generation, kind, precision


def write_bands(rows, path, with_slow):
    """bands.json: per band key, the signed errors (predicted / published - 1) of the runs counted in the MAPE,
    rounded to 1e-6 so that the same predictions write the same file."""
    bands = {}
    for r in rows:
        if r.get("in_mape", True) and isinstance(r.get("error"), float):
            bands.setdefault(tuple(r["band"]), []).append({"name": r["name"], "error": round(r["error"], 6)})
    out = {"generated_by": "bench/accuracy/run.py --write-bands (never edit by hand)",
           "error": "predicted / published - 1 (negative: twin is fast)",
           "slow_runs": with_slow,
           "bands": []}
    for (generation, kind, precision), runs in sorted(bands.items()):
        runs.sort(key=lambda run: run["name"])
        errors = [run["error"] for run in runs]
        out["bands"].append({"generation": generation, "kind": kind, "precision": precision,
                             "error_low": min(errors), "error_high": max(errors), "runs": runs})
    with open(path, "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")
    print(f"\nbands written to {path}: " + ", ".join(
        f"{b['generation']} {b['kind']} {b['precision']} ({len(b['runs'])} runs, {100 * b['error_low']:+.1f} % to "
        f"{100 * b['error_high']:+.1f} %)" for b in out["bands"]))


def simulate(twin, run, legacy, fidelity, extra_sets=()):
    path = os.path.join(PUBLISHED, run["scenario"])
    with tempfile.TemporaryDirectory() as tmp:
        if legacy:  # drop the keys an older twin rejects
            lines = [line for line in open(path) if line.split("=")[0].strip() not in NEW_FRAMEWORK_KEYS]
            path = os.path.join(tmp, run["scenario"])
            with open(path, "w") as f:
                f.writelines(lines)
        out = os.path.join(tmp, "summary.json")
        command = [twin, "sim", path, "--quiet", "--json", out, "--fidelity", fidelity]
        for item in [*run.get("set", []), *extra_sets]:
            command += ["--set", item]
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0:
            # every problem twin names (a scenario can break several rules at once), on one line
            lines = [line.strip() for line in (done.stderr or done.stdout).strip().splitlines() if line.strip()]
            return {"error": " | ".join(lines[-5:]) or f"twin exited with status {done.returncode}"}
        with open(out) as f:
            summary = json.load(f)
    return {"iteration_time_s": summary["iteration_time_s"], "tflops_per_gpu": summary["tflops_per_gpu"],
            "bubble": summary["bubble_fraction"], "dp": summary["scenario"]["dp"]}


def fit_line(xs, ys):
    """Least squares y = fixed + slope x; returns (fixed, slope, largest |residual|)."""
    n = len(xs)
    mean_x, mean_y = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mean_x) ** 2 for x in xs)
    slope = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys)) / sxx
    fixed = mean_y - slope * mean_x
    return fixed, slope, max(abs(y - fixed - slope * x) for x, y in zip(xs, ys))


def split_series(rows):
    """Runs of one series share model and plan and differ only in the data-parallel degree DP, so each replica
    processes B / DP sequences. Their iteration times lie on T = fixed + per_sequence x B / DP: per_sequence is the
    steady pipeline's time per sequence (compute, exposed TP and PP), fixed what does not shrink with B / DP (the
    pipeline's fill and drain, (p - 1) micro-batches' worth, the gradient reduction, the optimizer step). Fitting the
    published and the predicted times separately says which of the two parts an error is in; it needs no constant."""
    series = {}
    for r in rows:
        if r.get("series") and isinstance(r.get("error"), float):
            series.setdefault(r["series"], []).append(r)
    out = []
    for name, members in series.items():
        if len({r["sequences_per_replica"] for r in members}) < 3:
            continue  # two points always lie on a line: nothing to check
        xs = [r["sequences_per_replica"] for r in members]
        published = fit_line(xs, [r["published_s"] for r in members])
        predicted = fit_line(xs, [r["iteration_time_s"] for r in members])
        # Two one-number corrections of twin's times, to tell the kinds of error apart: a constant added to every
        # iteration (time twin misses once per iteration), or a factor on every time (a rate twin has wrong). Each is
        # the least-squares best; the worst relative error left says how well it explains the series.
        ts = [r["iteration_time_s"] for r in members]
        ps = [r["published_s"] for r in members]
        constant = sum(p - t for p, t in zip(ps, ts)) / len(ts)
        factor = sum(p * t for p, t in zip(ps, ts)) / sum(t * t for t in ts)
        out.append({"series": name, "runs": len(members),
                    "published_per_sequence_s": published[1], "published_fixed_s": published[0],
                    "published_worst_residual_s": published[2],
                    "twin_per_sequence_s": predicted[1], "twin_fixed_s": predicted[0],
                    "twin_worst_residual_s": predicted[2],
                    "constant_s": constant,
                    "constant_worst_error": max(abs((t + constant) / p - 1) for p, t in zip(ps, ts)),
                    "factor": factor,
                    "factor_worst_error": max(abs(t * factor / p - 1) for p, t in zip(ps, ts))})
    return out


def in_group(row, group):
    """"all": the A100 runs (the set the MAPE guard holds); "all-hopper": the Hopper and Blackwell runs (runs marked
    gpu_generation = "hopper"), their MAPE stated apart; any other name: that group."""
    if group == "all":
        return "generation" not in row
    if group == "all-hopper":
        return row.get("generation") == "hopper"
    return row["group"] == group


def mape_by_group(rows):
    """(group, MAPE %, mean error %, runs) for each group, for "all" (A100) and for "all-hopper", over the simulated
    runs counted in the MAPE; then the same for the runs left out of it (mape = false), each group once, neither
    "all" including them."""
    ok = [r for r in rows if isinstance(r.get("error"), float)]
    out = []
    for counted in (True, False):
        members_of = [r for r in ok if r.get("in_mape", True) == counted]
        groups = sorted({r["group"] for r in members_of})
        if counted:
            groups += [g for g in ("all", "all-hopper") if any(in_group(r, g) for r in members_of)]
        for group in groups:
            members = [r for r in members_of if in_group(r, group)]
            mape = 100 * sum(abs(r["error"]) for r in members) / len(members)
            bias = 100 * sum(r["error"] for r in members) / len(members)
            out.append((group, mape, bias, len(members), counted))
    return out


def print_rate_table(title, rows, markdown, width):
    """Runs printed apart from the dense table: published and predicted tokens per second per GPU beside the seconds
    per iteration, one row each (a failed run says so), names in a column `width` wide."""
    print(f"\n{title}: published against predicted, tokens/s per GPU and seconds per iteration")
    if markdown:
        print("\n| run | published tokens/s/GPU | twin tokens/s/GPU | published s | twin s | error |")
        print("|---|---:|---:|---:|---:|---:|")
    else:
        print(f"{'run':{width}} {'published tok/s/GPU':>20} {'twin tok/s/GPU':>15} {'published s':>12} {'twin s':>10} "
              f"{'error':>8}")
    for r in rows:
        if not isinstance(r.get("error"), float):
            print(f"{r['name']:{width}} failed: {r.get('error')}")
            continue
        twin_rate = r["published_tokens_per_s_per_gpu"] * r["published_s"] / r["iteration_time_s"]
        if markdown:
            print(f"| {r['name']} | {r['published_tokens_per_s_per_gpu']:.0f} | {twin_rate:.0f} | "
                  f"{r['published_s']:.2f} | {r['iteration_time_s']:.2f} | {100 * r['error']:+.1f} % |")
        else:
            print(f"{r['name']:{width}} {r['published_tokens_per_s_per_gpu']:20.0f} {twin_rate:15.0f} "
                  f"{r['published_s']:12.2f} {r['iteration_time_s']:10.2f} {100 * r['error']:+7.1f}%")


def print_moe(rows, markdown):
    """The Mixture-of-Experts runs: their own table and MAPE line."""
    print_rate_table("Mixture-of-Experts runs (group moe)", rows, markdown, 32)
    for group, mape, bias, runs, in_mape in mape_by_group(rows):
        if group == "all":
            continue
        note = "" if in_mape else "  * not in the MAPE"
        print(f"MAPE {group:15} {mape:5.1f} %  (mean error {bias:+.1f} %, {runs} runs){note}")


# The held-out groups, each printed last with a MAPE per GPU generation: (group, title).
HELD_OUT_GROUPS = (("bridge-dense", "Held-out dense runs (group bridge-dense)"),
                   ("moe-tokendrop", "Held-out token-dropping MoE runs (group moe-tokendrop)"),
                   ("moe-later", "Held-out dropless MoE runs of later containers (group moe-later)"),
                   ("moe-cards", "Held-out MoE runs of Megatron-Bridge's model verification cards (group moe-cards)"))

# Groups printed apart from the dense table, its series and its MAPE lines (each after them, with a table and MAPE of
# its own): "all", "all-hopper" and --max-mape never count them.
APART_GROUPS = ("moe", *(group for group, _ in HELD_OUT_GROUPS))


def print_held_out(rows, markdown, group, title):
    """A held-out group's runs: their own table, as the MoE runs', and a MAPE per GPU generation (the generation of
    each run's cluster.node, as band_key reads it), then over them all."""
    print_rate_table(title, rows, markdown, max(36, 2 + max(len(r["name"]) for r in rows)))
    counted = [r for r in rows if isinstance(r.get("error"), float) and r.get("in_mape", True)]
    generations = sorted({r["band"][0] for r in counted})
    for label, members in [*((f"{group}-{g}", [r for r in counted if r["band"][0] == g]) for g in generations),
                           (group, counted)]:
        if not members:
            continue
        mape = 100 * sum(abs(r["error"]) for r in members) / len(members)
        bias = 100 * sum(r["error"] for r in members) / len(members)
        print(f"MAPE {label:22} {mape:5.1f} %  (mean error {bias:+.1f} %, {len(members)} runs)")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--twin", help="twin binary (default: the newest build*/cli/twin)")
    parser.add_argument("--only", default="", help="regular expression on run names")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--markdown", action="store_true", help="print a Markdown table")
    parser.add_argument("--json", help="write the rows as JSON")
    parser.add_argument("--write-bands", action="store_true",
                        help="write bench/accuracy/bands.json, each band's error range (every run, no --only/--set; the "
                             "slow ones with --with-slow)")
    parser.add_argument("--series-json", help="write each series' split (per sequence, fixed) as JSON")
    parser.add_argument("--max-mape", type=float, default=None,
                        help="exit 1 when the MAPE over all runs exceeds this many percent (a regression guard)")
    parser.add_argument("--legacy", action="store_true", help="strip framework keys an older twin does not know")
    parser.add_argument("--fidelity", default="group",
                        help="group (default: one actor per TP group), rank (the same times, slower) or replica (one "
                             "pipeline replica replayed, the others mirroring it)")
    parser.add_argument("--check-fidelity", type=float, default=None, metavar="PERCENT",
                        help="also simulate every run at rank fidelity and exit 1 when it and --fidelity differ by "
                             "more than this many percent on any run (the guard behind auto's choice of group "
                             "fidelity; slow for runs of thousands of GPUs: select with --only)")
    parser.add_argument("--reference", default="rank",
                        help="the fidelity --check-fidelity compares with (default rank; group for replica fidelity's "
                             "guard)")
    parser.add_argument("--with-slow", action="store_true",
                        help="also the runs marked slow = true (tens of seconds each: Llama 3 405B on 8K-16K GPUs)")
    parser.add_argument("--groups", default="",
                        help="regular expression on run groups (e.g. '^(?!moe$)': all but the MoE runs)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="one more scenario override for every run, after its own (a sensitivity study; the "
                             "published seconds stay as published)")
    args = parser.parse_args()
    twin = args.twin or find_twin()
    if args.write_bands and (args.only or args.groups or args.set or args.legacy or args.fidelity != "group"):
        parser.error("--write-bands takes every run as published.toml gives it: no --only, --groups, --set, --legacy "
                     "or --fidelity")

    with open(os.path.join(PUBLISHED, "published.toml"), "rb") as f:
        runs = [r for r in tomllib.load(f)["run"]
                if re.search(args.only, r["name"]) and re.search(args.groups, r.get("group", ""))
                and (args.with_slow or not r.get("slow", False))]
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        results = list(pool.map(lambda r: simulate(twin, r, args.legacy, args.fidelity, args.set), runs))
    selected = list(runs)

    rows = []
    for run, result in zip(runs, results):
        scenario = scenario_with_overrides(os.path.join(PUBLISHED, run["scenario"]), run.get("set", []))
        row = {"name": run["name"], "group": run["group"], "published_s": published_seconds(run, scenario),
               "source": run["source"], "band": list(band_key(scenario))}
        if "series" in run:
            row["series"] = run["series"]
        if "gpu_generation" in run:
            row["generation"] = run["gpu_generation"]
        if "tokens_per_s_per_gpu" in run:
            row["published_tokens_per_s_per_gpu"] = float(run["tokens_per_s_per_gpu"])
        if not run.get("mape", True):
            row["in_mape"] = False
            row["why"] = run.get("why", "")
        row.update(result)
        if "dp" in result:
            row["sequences_per_replica"] = scenario["parallel"]["global_batch"] / result["dp"]
        if "iteration_time_s" in result:
            row["error"] = result["iteration_time_s"] / row["published_s"] - 1
        rows.append(row)

    everything = rows
    moe_rows = [r for r in rows if r["group"] == "moe"]
    held_out = [(group, title, [r for r in rows if r["group"] == group]) for group, title in HELD_OUT_GROUPS]
    apart_rows = [r for r in rows if r["group"] in APART_GROUPS]
    rows = [r for r in rows if r["group"] not in APART_GROUPS]
    if args.markdown:
        print("| run | group | published s | twin s | error |")
        print("|---|---|---:|---:|---:|")
        for r in rows:
            mark = "" if r.get("in_mape", True) else " *"
            predicted = f"{r['iteration_time_s']:.2f}" if "error" in r else r.get("error", "?")
            error = f"{100 * r['error']:+.1f} %" if "error" in r else "failed"
            print(f"| {r['name']}{mark} | {r['group']} | {r['published_s']:.2f} | {predicted} | {error} |")
    else:
        print(f"{'run':32} {'group':15} {'published s':>12} {'twin s':>10} {'error':>8}")
        for r in rows:
            name = r["name"] + ("" if r.get("in_mape", True) else " *")
            if "error" in r and isinstance(r["error"], float):
                print(f"{name:32} {r['group']:15} {r['published_s']:12.2f} {r['iteration_time_s']:10.2f} "
                      f"{100 * r['error']:+7.1f}%")
            else:
                print(f"{name:32} {r['group']:15} {r['published_s']:12.2f}   failed: {r.get('error')}")
    ok = [r for r in rows if isinstance(r.get("error"), float)]
    counted = [r for r in ok if r.get("in_mape", True) and in_group(r, "all")]  # the guard holds the A100 set
    print()
    for group, mape, bias, runs, in_mape in mape_by_group(rows):
        note = "" if in_mape else "  * not in the MAPE"
        print(f"MAPE {group:15} {mape:5.1f} %  (mean error {bias:+.1f} %, {runs} runs){note}")
    for why in sorted({r["why"] for r in ok if not r.get("in_mape", True)}):
        print(f"  * {why}")
    series = split_series(rows)
    if series and args.markdown:
        print("\n| series | published s per sequence | published fixed s | twin s per sequence | twin fixed s "
              "| error per sequence | error fixed |")
        print("|---|---:|---:|---:|---:|---:|---:|")
    elif series:
        print("\nSeries (same model and plan, only DP varies): T = fixed + per_sequence x B/DP, least squares")
        print(f"{'series':20} {'published: per sequence':>24} {'fixed':>8}   {'twin: per sequence':>19} {'fixed':>8}"
              f"   {'error: per sequence':>19} {'fixed':>8}")
    for f_ in series:
        per_sequence_error = f_["twin_per_sequence_s"] / f_["published_per_sequence_s"] - 1
        fixed_error = f_["twin_fixed_s"] - f_["published_fixed_s"]
        if args.markdown:
            print(f"| {f_['series']} | {f_['published_per_sequence_s']:.4f} | {f_['published_fixed_s']:.2f} "
                  f"| {f_['twin_per_sequence_s']:.4f} | {f_['twin_fixed_s']:.2f} | {100 * per_sequence_error:+.1f} % "
                  f"| {fixed_error:+.2f} s |")
        else:
            print(f"{f_['series']:20} {f_['published_per_sequence_s']:22.4f} s {f_['published_fixed_s']:6.2f} s"
                  f"   {f_['twin_per_sequence_s']:17.4f} s {f_['twin_fixed_s']:6.2f} s"
                  f"   {100 * per_sequence_error:+17.1f} % {fixed_error:+6.2f} s")
    if series:
        print("\nThe same series, with one number added to every predicted time or multiplying it (least squares); "
              "the worst error it leaves:" if not args.markdown else
              "\n| series | + constant | worst error left | x factor | worst error left |\n|---|---:|---:|---:|---:|")
    for f_ in series:
        if args.markdown:
            print(f"| {f_['series']} | {f_['constant_s']:+.2f} s | {100 * f_['constant_worst_error']:.1f} % "
                  f"| {f_['factor']:.3f} | {100 * f_['factor_worst_error']:.1f} % |")
        else:
            print(f"{f_['series']:20} {f_['constant_s']:+7.2f} s per iteration: {100 * f_['constant_worst_error']:5.1f} %"
                  f"   x {f_['factor']:.3f}: {100 * f_['factor_worst_error']:5.1f} %")
    if moe_rows:
        print_moe(moe_rows, args.markdown)
    for group, title, members in held_out:
        if members:
            print_held_out(members, args.markdown, group, title)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(everything, f, indent=2)
    if args.write_bands:
        if len(ok) != len(rows) or any(not isinstance(r.get("error"), float) for r in apart_rows):
            print("bench/accuracy: a run failed: bands not written")
            return 1
        write_bands(everything, BANDS, args.with_slow)
    if args.series_json:
        with open(args.series_json, "w") as f:
            json.dump(series, f, indent=2)
    if len(ok) != len(rows) or any(not isinstance(r.get("error"), float) for r in apart_rows):
        return 1
    if args.check_fidelity is not None:
        with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
            ranked = list(pool.map(lambda r: simulate(twin, r, args.legacy, args.reference, args.set), selected))
        worst, worst_name = 0.0, ""
        differences = []
        for row, rank in zip(everything, ranked):  # every selected run, MoE ones too, in the order simulated
            if "iteration_time_s" not in rank:
                print(f"bench/accuracy: {row['name']} failed at {args.reference} fidelity: {rank.get('error')}")
                return 1
            difference = abs(rank["iteration_time_s"] / row["iteration_time_s"] - 1)
            differences.append((difference, row["name"]))
            if difference >= worst:
                worst, worst_name = difference, row["name"]
        print(f"\n{args.reference} fidelity against {args.fidelity} over {len(everything)} runs: at most "
              f"{100 * worst:.4f} % ({worst_name}); the largest: " +
              ", ".join(f"{name} {100 * d:.4f} %" for d, name in sorted(differences, reverse=True)[:5]))
        if 100 * worst > args.check_fidelity:
            print(f"bench/accuracy: fidelities differ by more than --check-fidelity {args.check_fidelity} %")
            return 1
    overall = 100 * sum(abs(r["error"]) for r in counted) / max(1, len(counted))
    if args.max_mape is not None and overall > args.max_mape:
        print(f"bench/accuracy: MAPE {overall:.1f} % exceeds --max-mape {args.max_mape} %")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
