#!/usr/bin/env python3
"""The bench model's training step in PyTorch on the CPU, for a side-by-side with twin_exec_bench.

Same model as twin's executor: GPT-2 (pre-LN, learned positions, GELU tanh, tied input/output embedding, no dropout),
byte vocabulary, fp32, AdamW with decay on matrices and global-norm clipping 1.0. Prints one JSON line.

    python3 bench/exec/torch_step.py [--layers 12] [--hidden 512] [--heads 8] [--seq 256] [--batch 8] [--steps 3]
                                     [--threads 2]
"""
import argparse
import json
import math
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, hidden, heads):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(hidden)
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.proj = nn.Linear(hidden, hidden)
        self.ln2 = nn.LayerNorm(hidden)
        self.fc = nn.Linear(hidden, 4 * hidden)
        self.fc_proj = nn.Linear(4 * hidden, hidden)

    def forward(self, x, mask):
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(c // self.heads)
        scores = scores.masked_fill(mask[:t, :t], float("-inf"))
        attn = (F.softmax(scores, dim=-1) @ v).transpose(1, 2).contiguous().view(b, t, c)
        x = x + self.proj(attn)
        return x + self.fc_proj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, layers, hidden, heads, seq, vocab=256):
        super().__init__()
        self.wte = nn.Embedding(vocab, hidden)
        self.wpe = nn.Embedding(seq, hidden)
        self.blocks = nn.ModuleList(Block(hidden, heads) for _ in range(layers))
        self.lnf = nn.LayerNorm(hidden)
        self.register_buffer("mask", torch.triu(torch.ones(seq, seq, dtype=torch.bool), diagonal=1))

    def forward(self, tokens, targets):
        x = self.wte(tokens) + self.wpe(torch.arange(tokens.shape[1]))
        for block in self.blocks:
            x = block(x, self.mask)
        logits = self.lnf(x) @ self.wte.weight.t()  # tied head
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))


def main():
    p = argparse.ArgumentParser()
    for name, default in [("layers", 12), ("hidden", 512), ("heads", 8), ("seq", 256), ("batch", 8), ("steps", 3),
                          ("threads", 2)]:
        p.add_argument("--" + name, type=int, default=default)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    model = GPT(a.layers, a.hidden, a.heads, a.seq)
    decay = [q for q in model.parameters() if q.dim() >= 2]
    no_decay = [q for q in model.parameters() if q.dim() < 2]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                                  lr=3e-4, betas=(0.9, 0.95), eps=1e-8)
    tokens = torch.randint(0, 256, (a.batch, a.seq))
    targets = torch.randint(0, 256, (a.batch, a.seq))

    def step():
        optimizer.zero_grad(set_to_none=True)
        loss = model(tokens, targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        return loss.item()

    step()  # warm-up
    start = time.perf_counter()
    for _ in range(a.steps):
        step()
    seconds = (time.perf_counter() - start) / a.steps
    b, s, l, h, v = a.batch, a.seq, a.layers, a.hidden, 256
    flops = 72 * b * s * l * h * h * (1 + s / (6 * h) + v / (12 * l * h))  # the executor bench's count
    print(json.dumps({"engine": f"pytorch {torch.__version__}", "threads": a.threads, "step_s": seconds,
                      "tokens_per_s": b * s / seconds, "achieved_gflops": flops / seconds / 1e9}))


if __name__ == "__main__":
    main()
