#!/usr/bin/env python3
"""A GPT trained by PyTorch on this machine's CPU under its profiler: the measured side of twin's CPU loop.

The model is twin's GPT as model/program.cpp builds it (learned position embedding, pre-layer-norm blocks, fused QKV
projection, causal softmax attention, GELU MLP of 4h, final layer norm, LM head tied to the word embedding, fp32,
AdamW), so that a twin scenario of the same shape describes it. Each plan trains `--steps` steps of one batch on
random tokens; the profiler (record_shapes) records the last `--active` of them as ProfilerStep#N, and the trace is
written to --trace (what `twin calibrate` and `twin compare` read). Prints one JSON line: the plan, the mean step time
of the profiled steps, and the trace's path.

    bench/measured/torch_cpu_gpt.py --layers 2 --hidden 256 --heads 4 --seq 128 --batch 8 --trace /tmp/p.json

Needs Debian's python3-torch (scripts/install-deps.sh --torch).
"""
import argparse
import json
import math
import sys
import time

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


def write_trace(profiler, path):
    """The profiled operators in Kineto's trace format, input shapes included.

    Debian's PyTorch 1.13 is built without Kineto: its export_chrome_trace writes the legacy profiler's events, with
    neither categories nor the shapes record_shapes recorded. The events themselves have them (FunctionEvent's
    input_shapes), so they are written here as Kineto writes a CPU operator: "cat": "cpu_op" (ProfilerStep#N and
    record_function ranges "user_annotation"), "args": {"Input Dims": [...]}, times in microseconds.
    """
    events = []
    steps = 0
    for e in profiler.events():
        name = e.name
        if name.startswith("ProfilerStep"):  # "ProfilerStep*" in the legacy profiler
            steps += 1
            name = f"ProfilerStep#{steps}"
        annotation = name.startswith("ProfilerStep#") or name.startswith("Optimizer.")
        event = {"ph": "X", "cat": "user_annotation" if annotation else "cpu_op", "name": name, "pid": 1,
                 "tid": e.thread, "ts": e.time_range.start, "dur": e.time_range.end - e.time_range.start}
        if e.input_shapes:
            event["args"] = {"Input Dims": [list(shape) for shape in e.input_shapes]}
        events.append(event)
    with open(path, "w") as f:
        json.dump({"schemaVersion": 1, "traceName": "torch_cpu_gpt", "traceEvents": events}, f)


def run(args):
    torch.manual_seed(1234)
    torch.set_num_threads(args.threads)
    model = GPT(args.layers, args.hidden, args.heads, args.seq, args.vocab)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1)
    tokens = torch.randint(0, args.vocab, (args.batch, args.seq))
    targets = torch.randint(0, args.vocab, (args.batch, args.seq))
    warmup = args.steps - args.active
    schedule = torch.profiler.schedule(wait=0, warmup=max(1, warmup) - 1 if warmup > 1 else 0,
                                       active=args.active, repeat=1, skip_first=1 if warmup >= 1 else 0)
    step_times, step_cpu_times = [], []

    def save(profiler):
        if args.trace:
            write_trace(profiler, args.trace)

    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True,
                                schedule=schedule, on_trace_ready=save) as profiler:
        for _ in range(args.steps):
            start, start_cpu = time.perf_counter(), time.process_time()
            optimizer.zero_grad(set_to_none=True)
            loss = model(tokens, targets)
            loss.backward()
            optimizer.step()
            step_times.append(time.perf_counter() - start)
            step_cpu_times.append(time.process_time() - start_cpu)
            profiler.step()
    active = step_times[-args.active:]
    active_cpu = step_cpu_times[-args.active:]
    return {"step_cpu_s": sum(active_cpu) / len(active_cpu), "layers": args.layers, "hidden": args.hidden, "heads": args.heads, "seq": args.seq, "batch": args.batch,
            "threads": args.threads, "step_s": sum(active) / len(active), "steps_s": active, "trace": args.trace,
            "loss": float(loss)}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--vocab", type=int, default=256)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--steps", type=int, default=5, help="steps in all; the first ones warm up")
    parser.add_argument("--active", type=int, default=3, help="the last steps, profiled and timed")
    parser.add_argument("--threads", type=int, default=1, help="PyTorch's intra-op threads")
    parser.add_argument("--trace", help="write the profiler's Chrome trace here")
    args = parser.parse_args()
    if not 1 <= args.active < args.steps:
        sys.exit("bench/measured/torch_cpu_gpt: need 1 <= --active < --steps")
    print(json.dumps(run(args)))


if __name__ == "__main__":
    main()
