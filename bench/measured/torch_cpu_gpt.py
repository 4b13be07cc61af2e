#!/usr/bin/env python3
"""A GPT trained by PyTorch on this machine's CPU under its profiler: the measured side of twin's CPU loop.

The model is twin's GPT as model/program/program.cpp builds it (learned position embedding, pre-layer-norm blocks, fused QKV
projection, causal softmax attention, GELU MLP of 4h, final layer norm, LM head tied to the word embedding, fp32,
AdamW), so that a twin scenario of the same shape describes it. Every plan (layers x batch) trains on random tokens,
one step of each plan in turn, so that other work on a shared machine slows every plan alike; the profiler
(record_shapes) records the last `--active` rounds, and each plan's steps are written as its own trace,
DIR/torch_LAYERSxBATCH.json, with its steps as ProfilerStep#N (what `twin calibrate` and `twin compare` read). Prints
one JSON line per plan: the plan, its mean and fastest profiled step, the trace's path.

    /usr/bin/python3 bench/measured/torch_cpu_gpt.py --plans 2x8,1x8,3x8 --trace-dir /tmp/traces

Needs Debian's python3-torch (scripts/install-deps.sh --torch).
"""
import argparse
import json
import math
import os
import sys
import time

# One thread in all: PyTorch's (set_num_threads below) and OpenBLAS's own pool, which Debian's PyTorch calls for its
# GEMMs and which set_num_threads does not reach.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
try:
    import torch
    import torch.nn.functional as F
except ImportError:
    sys.exit("bench/measured/torch_cpu_gpt: no PyTorch (apt install python3-torch, or scripts/install-deps.sh --torch)")


class Block(torch.nn.Module):
    def __init__(self, hidden, heads):
        super().__init__()
        self.heads = heads
        self.ln1 = torch.nn.LayerNorm(hidden)
        self.qkv = torch.nn.Linear(hidden, 3 * hidden)
        self.proj = torch.nn.Linear(hidden, hidden)
        self.ln2 = torch.nn.LayerNorm(hidden)
        self.up = torch.nn.Linear(hidden, 4 * hidden)
        self.down = torch.nn.Linear(4 * hidden, hidden)

    def forward(self, x, mask):
        b, s, h = x.shape
        d = h // self.heads
        q, k, v = self.qkv(self.ln1(x)).split(h, dim=2)
        q, k, v = (t.view(b, s, self.heads, d).transpose(1, 2) for t in (q, k, v))
        scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(d))
        attention = F.softmax(scores.masked_fill(mask, float("-inf")), dim=-1)
        context = (attention @ v).transpose(1, 2).reshape(b, s, h)
        x = x + self.proj(context)
        return x + self.down(F.gelu(self.up(self.ln2(x))))


class GPT(torch.nn.Module):
    def __init__(self, layers, hidden, heads, seq, vocab):
        super().__init__()
        self.word = torch.nn.Embedding(vocab, hidden)
        self.position = torch.nn.Embedding(seq, hidden)
        self.blocks = torch.nn.ModuleList(Block(hidden, heads) for _ in range(layers))
        self.ln_f = torch.nn.LayerNorm(hidden)
        self.register_buffer("mask", torch.triu(torch.ones(seq, seq, dtype=torch.bool), diagonal=1))

    def forward(self, tokens, targets):
        x = self.word(tokens) + self.position(torch.arange(tokens.shape[1]))
        for block in self.blocks:
            x = block(x, self.mask)
        logits = self.ln_f(x) @ self.word.weight.t()  # tied LM head
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))


def write_trace(events, marker, path):
    """The operators inside one plan's steps, in Kineto's trace format, input shapes included.

    Debian's PyTorch 1.13 is built without Kineto: its export_chrome_trace writes the legacy profiler's events, with
    neither categories nor the shapes record_shapes recorded. The events themselves have them (FunctionEvent's
    input_shapes), so they are written here as Kineto writes a CPU operator: "cat": "cpu_op", "args": {"Input Dims":
    [...]}, times in microseconds; the plan's step ranges (`marker`) become "ProfilerStep#N" ("user_annotation", as
    profiler.step() records them), numbered from 1.
    """
    steps = sorted((e.time_range.start, e.time_range.end) for e in events if e.name == marker)
    out = []
    for e in events:
        start, end = e.time_range.start, e.time_range.end
        if e.name.startswith("twin_plan"):
            if e.name != marker:
                continue
            name, category = f"ProfilerStep#{steps.index((start, end)) + 1}", "user_annotation"
        elif any(begin <= start and end <= finish for begin, finish in steps):
            name = e.name
            category = "user_annotation" if name.startswith("Optimizer.") else "cpu_op"
        else:
            continue
        event = {"ph": "X", "cat": category, "name": name, "pid": 1, "tid": e.thread, "ts": start, "dur": end - start}
        if e.input_shapes:
            event["args"] = {"Input Dims": [list(shape) for shape in e.input_shapes]}
        out.append(event)
    with open(path, "w") as f:
        json.dump({"schemaVersion": 1, "traceName": "torch_cpu_gpt", "traceEvents": out}, f)


def run(args, plans):
    """Trains every plan, one step of each in turn (round-robin), so that other work on the machine slows them alike;
    the last `active` rounds are profiled."""
    torch.set_num_threads(args.threads)
    trainers = []
    for layers, batch in plans:
        torch.manual_seed(1234)
        model = GPT(layers, args.hidden, args.heads, args.seq, args.vocab)
        optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1)
        tokens = torch.randint(0, args.vocab, (batch, args.seq))
        targets = torch.randint(0, args.vocab, (batch, args.seq))
        trainers.append((model, optimizer, tokens, targets))
    times = [[] for _ in plans]

    def round_of_steps():
        for index, (model, optimizer, tokens, targets) in enumerate(trainers):
            with torch.autograd.profiler.record_function(f"twin_plan{index}"):
                start = time.perf_counter()
                optimizer.zero_grad(set_to_none=True)
                loss = model(tokens, targets)
                loss.backward()
                optimizer.step()
                times[index].append(time.perf_counter() - start)

    for _ in range(args.steps - args.active):
        round_of_steps()
    with torch.autograd.profiler.profile(record_shapes=True) as profiler:
        for _ in range(args.active):
            round_of_steps()
    events = profiler.function_events
    results = []
    for index, (layers, batch) in enumerate(plans):
        trace = os.path.join(args.trace_dir, f"torch_{layers}x{batch}.json") if args.trace_dir else None
        if trace:
            write_trace(events, f"twin_plan{index}", trace)
        active = times[index][-args.active:]
        results.append({"layers": layers, "batch": batch, "hidden": args.hidden, "heads": args.heads,
                        "seq": args.seq, "threads": args.threads, "step_s": sum(active) / len(active),
                        "fastest_step_s": min(active), "steps_s": active, "trace": trace})
    return results


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--plans", default="2x8", help="LAYERSxBATCH,... trained in turn, one step each")
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--vocab", type=int, default=256)
    parser.add_argument("--steps", type=int, default=6, help="rounds in all; the first ones warm up")
    parser.add_argument("--active", type=int, default=4, help="the last rounds, profiled and timed")
    parser.add_argument("--threads", type=int, default=1, help="PyTorch's intra-op threads")
    parser.add_argument("--trace-dir", help="write each plan's trace here, torch_LAYERSxBATCH.json")
    args = parser.parse_args()
    if not 1 <= args.active < args.steps:
        sys.exit("bench/measured/torch_cpu_gpt: need 1 <= --active < --steps")
    try:
        plans = [tuple(int(x) for x in plan.split("x")) for plan in args.plans.split(",")]
    except ValueError:
        sys.exit(f"bench/measured/torch_cpu_gpt: --plans {args.plans}: expected LAYERSxBATCH,...")
    if args.trace_dir:
        os.makedirs(args.trace_dir, exist_ok=True)
    for result in run(args, plans):
        print(json.dumps(result))


if __name__ == "__main__":
    main()
