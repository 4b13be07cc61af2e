#!/usr/bin/env python3
"""Replays Megatron-LM's interleaved 1F1B schedule under two exchange semantics, to see whether lock-step exchanges
cost time that twin's eager model of them does not (docs/accuracy-notes.md, "Where the error is").

The schedule is `forward_backward_pipelining_with_interleaving` of megatron/schedules.py at the SC'21 artifact's
commit (NVIDIA/Megatron-LM 6985e58938d40ad91ac07b0fddcfad8132e1447e): per stage, the warm-up forwards, the steady
forward + backward pairs, the cool-down backwards, and after each step one `_communicate` call (sends to and
receives from both neighbours in one `batch_isend_irecv`, then `torch.cuda.synchronize()`).

Semantics of a call, each message taking `delta` seconds:
  lock-step  a message starts when both its sender and its receiver have posted their calls (NCCL send/recv are
             rendezvous); the call ends when all its messages have arrived.
  eager      a message starts when its sender posts; a call ends when its own sends have left and what it receives
             has arrived (twin's model of the interleaved schedule).

Compute: `forward_s` and `backward_s` per model chunk (backward including the recompute), plus `head_forward_s`
and `head_backward_s` on the last virtual stage (LM head and loss).

    bench/accuracy/interleaved_replay.py 35 3 280 --forward-s 0.015 --backward-s 0.045 --delta-s 0.001
    bench/accuracy/interleaved_replay.py --check    # the replay against the ideal bubble; both semantics
"""
import argparse
import sys


def stage_actions(p, v, m, r):
    """Stage r's compute steps ("F"/"B", chunk) and calls ("C", sends, receives), in the order Megatron runs them."""
    total = m * v
    all_warmup = m == p
    warmup = total if all_warmup else min((p - r - 1) * 2 + (v - 1) * p, total)
    remaining = total - warmup

    def chunk(k, forward):
        c = (k % (p * v)) // p
        return c if forward else v - c - 1

    def first(c):
        return r == 0 and c == 0

    def last(c):
        return r == p - 1 and c == v - 1

    actions = [("C", [], [] if r == 0 else ["fwd"])]  # recv_forward for chunk 0
    for k in range(warmup):
        c = chunk(k, True)
        actions.append(("F", c))
        recv_prev = not (r == 0 and chunk(k + 1, True) == 0) and k != total - 1
        sends = [] if last(c) else ["fwd"]
        receives = ["fwd"] if recv_prev else []
        if k == warmup - 1 and not all_warmup and r != p - 1:
            receives.append("bwd")
        actions.append(("C", sends, receives))
    for k in range(remaining):
        forward_k, backward_k = k + warmup, k
        cf, cb = chunk(forward_k, True), chunk(backward_k, False)
        actions += [("F", cf), ("B", cb)]
        sends = ([] if last(cf) else ["fwd"]) + ([] if first(cb) else ["bwd"])
        recv_prev = not (r == 0 and chunk(forward_k - (p - 1), True) == v - 1) and k != remaining - 1
        recv_next = not (r == p - 1 and chunk(backward_k - (p - 1), False) == 0)
        actions.append(("C", sends, (["fwd"] if recv_prev else []) + (["bwd"] if recv_next else [])))
    if all_warmup:
        actions.append(("C", [], ["bwd"]))
    for k in range(remaining, total):
        c = chunk(k, False)
        actions.append(("B", c))
        recv_next = not (r == p - 1 and chunk(k + 1, False) == v - 1) and k != total - 1
        actions.append(("C", [] if first(c) else ["bwd"], ["bwd"] if recv_next else []))
    return actions


def iteration_time_s(p, v, m, forward_s, backward_s, delta_s, lockstep, head_forward_s=0.0, head_backward_s=0.0):
    actions = [stage_actions(p, v, m, r) for r in range(p)]
    posted = {"s": {}, "r": {}}  # (sender, receiver, direction) -> post times, in order
    slots = [dict() for _ in range(p)]  # action index -> the call's messages, once posted
    position, clock = [0] * p, [0.0] * p

    def peer(r, direction, sending):
        step = 1 if (direction == "fwd") == sending else -1
        return (r + step) % p

    moved = True
    while moved:
        moved = False
        for r in range(p):
            while position[r] < len(actions[r]):
                kind, *rest = actions[r][position[r]]
                if kind in ("F", "B"):
                    head = r == p - 1 and rest[0] == v - 1
                    clock[r] += (forward_s + head * head_forward_s) if kind == "F" else (backward_s + head * head_backward_s)
                    position[r] += 1
                    moved = True
                    continue
                sends, receives = rest
                if position[r] not in slots[r]:
                    messages = []
                    for direction in sends:
                        key = (r, peer(r, direction, True), direction)
                        posted["s"].setdefault(key, []).append(clock[r])
                        messages.append(("s", key, len(posted["s"][key]) - 1))
                    for direction in receives:
                        key = (peer(r, direction, False), r, direction)
                        posted["r"].setdefault(key, []).append(clock[r])
                        messages.append(("r", key, len(posted["r"][key]) - 1))
                    slots[r][position[r]] = messages
                end = clock[r]
                for side, key, index in slots[r][position[r]]:
                    other = posted["r" if side == "s" else "s"].get(key, [])
                    if len(other) <= index:
                        break  # the partner has not posted yet: come back later
                    send_post, receive_post = posted["s"][key][index], posted["r"][key][index]
                    if lockstep:
                        arrival = max(send_post, receive_post) + delta_s
                    else:
                        arrival = send_post + delta_s if side == "s" else max(receive_post, send_post + delta_s)
                    end = max(end, arrival)
                else:
                    clock[r] = end
                    position[r] += 1
                    moved = True
                    continue
                break
    stuck = [r for r in range(p) if position[r] < len(actions[r])]
    if stuck:
        raise RuntimeError(f"the replay deadlocked on stages {stuck[:8]}")
    return max(clock)


def check():
    # No communication time: the schedule's bubble is the ideal (p - 1) chunk-pairs, whatever the semantics.
    for p, v, m in ((4, 2, 8), (12, 4, 96), (35, 3, 70)):
        busy = m * v * (1.0 + 3.0)
        for lockstep in (False, True):
            got = iteration_time_s(p, v, m, 1.0, 3.0, 0.0, lockstep)
            assert abs(got - (busy + (p - 1) * 4.0)) < 1e-9, (p, v, m, lockstep, got)
    # Table 2's plans with a 1 ms exchange and the LM head on the last stage: the two semantics agree.
    for p, v, m, f, b in ((35, 3, 280, 0.015, 0.045), (12, 4, 96, 0.0121, 0.0364)):
        eager = iteration_time_s(p, v, m, f, b, 0.001, False, 0.0023, 0.0047)
        lockstep = iteration_time_s(p, v, m, f, b, 0.001, True, 0.0023, 0.0047)
        print(f"p {p} v {v} m {m}: eager {eager:.3f} s, lock-step {lockstep:.3f} s")
        assert abs(eager - lockstep) < 1e-6 * eager
    print("interleaved replay: ideal bubble without communication; lock-step = eager on Table 2's plans")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("stages", type=int, nargs="?")
    parser.add_argument("chunks", type=int, nargs="?", help="model chunks per stage (v)")
    parser.add_argument("micro_batches", type=int, nargs="?")
    parser.add_argument("--forward-s", type=float, default=0.015)
    parser.add_argument("--backward-s", type=float, default=0.045)
    parser.add_argument("--delta-s", type=float, default=0.001, help="one exchange, seconds")
    parser.add_argument("--head-forward-s", type=float, default=0.0)
    parser.add_argument("--head-backward-s", type=float, default=0.0)
    parser.add_argument("--check", action="store_true", help="run the self-checks and exit")
    args = parser.parse_args()
    if args.check:
        check()
        return 0
    if args.micro_batches is None:
        parser.error("give stages, chunks and micro_batches, or --check")
    p, v, m = args.stages, args.chunks, args.micro_batches
    if p < 2 or v < 2 or m % p != 0:
        parser.error("the interleaved schedule needs stages >= 2, chunks >= 2 and micro_batches a multiple of stages")
    for lockstep in (False, True):
        t = iteration_time_s(p, v, m, args.forward_s, args.backward_s, args.delta_s, lockstep, args.head_forward_s,
                             args.head_backward_s)
        print(f"{'lock-step' if lockstep else 'eager':9s} {t:.4f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
