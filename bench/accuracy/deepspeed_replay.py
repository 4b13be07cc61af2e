#!/usr/bin/env python3
"""Replays DeepSpeed's pipeline TrainSchedule with its blocking exchanges, to see whether its lock-step steps cost
time that the 1F1B bubble does not (docs/accuracy-notes.md, "DeepSpeed, modelled and not").

The schedule is `TrainSchedule.steps()` of deepspeed/runtime/pipe/schedule.py (identical from v0.3 to v0.8.2):
2 (m + p - 1) steps; stage s runs the forward of micro-batch k in step 2k + s and its backward in step
2k + 2p - 1 - s; a step first exchanges (entering a forward step: RecvActivation from the previous stage, then
SendGrad of the last backward's input gradient; entering a backward step: SendActivation of the last forward's
output, then RecvGrad), then computes. v0.8.3 (March 2023, #2862) swapped the two exchanges of a step: `--order
v0.8.3`. Every message is a blocking NCCL broadcast in a two-rank group (runtime/pipe/p2p.py): it starts once both
stages have reached it and holds both for `delta` seconds.

Compute per stage: `forward_s` and `backward_s` (backward including the recompute), the last stage adding
`head_forward_s` and `head_backward_s` (LM head and loss).

    bench/accuracy/deepspeed_replay.py 35 240 --forward-s 0.047 --backward-s 0.140 --delta-s 0.0005
    bench/accuracy/deepspeed_replay.py --check    # the replay against 1F1B's closed form, both orders
"""
import argparse
import sys


def stage_commands(p, m, s, order):
    """Stage s's commands in TrainSchedule order: ("F"|"B", k) or (message, k), message one of "recv_act",
    "send_grad", "send_act", "recv_grad"."""
    commands = []
    previous = None  # the micro-batch of the previous step's pass, when it had one (prev_micro_batch_id)
    for step in range(2 * (m + p - 1)):
        forward = (step % 2) == (s % 2)
        k = (step - s) // 2 if forward else (step - (2 * p - 1 - s)) // 2
        valid = 0 <= k < m
        exchange = []
        if forward and s > 0:
            if valid:
                exchange.append(("recv_act", k))
            if previous is not None:
                exchange.append(("send_grad", previous))
        if not forward and s < p - 1:
            if previous is not None:
                exchange.append(("send_act", previous))
            if valid:
                exchange.append(("recv_grad", k))
        if order == "v0.8.3":
            exchange.reverse()
        commands += exchange
        if valid:
            commands.append(("F" if forward else "B", k))
        previous = k if valid else None
    return commands


# The command a message meets on the other stage.
PARTNER = {"send_act": ("recv_act", +1), "recv_act": ("send_act", -1),
           "send_grad": ("recv_grad", -1), "recv_grad": ("send_grad", +1)}


def stage_times(p, pass_s, head_s):
    """A pass's seconds on each of p stages: pass_s, the last stage adding head_s (the LM head and loss)."""
    return [pass_s] * (p - 1) + [pass_s + head_s]


def replay(p, m, forward, backward, delta_s=0.0, order="v0.5"):
    """Iteration time of the schedule (the last stage to finish), forward and backward the stages' pass times;
    raises RuntimeError on a deadlock."""
    commands = [stage_commands(p, m, s, order) for s in range(p)]
    at = [0] * p
    clock = [0.0] * p
    while True:
        progressed = False
        for s in range(p):
            while at[s] < len(commands[s]):
                what, k = commands[s][at[s]]
                if what in ("F", "B"):
                    clock[s] += forward[s] if what == "F" else backward[s]
                    at[s] += 1
                    progressed = True
                    continue
                partner_what, direction = PARTNER[what]
                peer = s + direction
                if at[peer] < len(commands[peer]) and commands[peer][at[peer]] == (partner_what, k):
                    clock[s] = clock[peer] = max(clock[s], clock[peer]) + delta_s
                    at[s] += 1
                    at[peer] += 1
                    progressed = True
                    continue
                break
        if all(at[s] == len(commands[s]) for s in range(p)):
            return max(clock)
        if not progressed:
            stuck = [(s, commands[s][at[s]]) for s in range(p) if at[s] < len(commands[s])]
            raise RuntimeError(f"deadlock: {stuck[:4]}")


def one_f_one_b(p, m, forward, backward):
    """1F1B without exchange costs: every stage's fill and drain, then m - 1 micro-batches at the slowest stage."""
    per_stage = [f + b for f, b in zip(forward, backward)]
    return sum(per_stage) + (m - 1) * max(per_stage)


def check():
    failures = 0
    for p, m in [(2, 1), (2, 4), (4, 2), (4, 3), (4, 8), (8, 8), (8, 64), (35, 160), (35, 240)]:
        for head in (0.0, 0.2):
            forward, backward = stage_times(p, 1.0, head), stage_times(p, 3.0, 3 * head)
            expected = one_f_one_b(p, m, forward, backward)
            for order in ("v0.5", "v0.8.3"):
                got = replay(p, m, forward, backward, 0.0, order)
                ok = abs(got - expected) < 1e-9 * expected
                failures += not ok
                if not ok:
                    print(f"p {p} m {m} head {head} {order}: replay {got} against 1F1B {expected}")
            # With messages that take time, both orders still finish; each is at least the compute-only time.
            for order in ("v0.5", "v0.8.3"):
                got = replay(p, m, forward, backward, 0.01, order)
                failures += got < expected
    print("deepspeed_replay: " + ("ok" if failures == 0 else f"{failures} failures"))
    return failures == 0


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("stages", type=int, nargs="?")
    parser.add_argument("micro_batches", type=int, nargs="?")
    parser.add_argument("--forward-s", type=float, default=1.0)
    parser.add_argument("--backward-s", type=float, default=3.0)
    parser.add_argument("--head-forward-s", type=float, default=0.0)
    parser.add_argument("--head-backward-s", type=float, default=0.0)
    parser.add_argument("--delta-s", type=float, default=0.0, help="seconds per message")
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args()
    if args.check:
        return 0 if check() else 1
    if not args.stages or not args.micro_batches or args.stages < 2 or args.micro_batches < 1:
        parser.error("give STAGES (at least 2) and MICRO_BATCHES (at least 1), or --check")
    p, m = args.stages, args.micro_batches
    forward = stage_times(p, args.forward_s, args.head_forward_s)
    backward = stage_times(p, args.backward_s, args.head_backward_s)
    ideal = one_f_one_b(p, m, forward, backward)
    print(f"1F1B without exchange costs: {ideal:.6f} s")
    for order in ("v0.5", "v0.8.3"):
        t = replay(p, m, forward, backward, args.delta_s, order)
        print(f"TrainSchedule {order:7}: {t:.6f} s ({100 * (t / ideal - 1):+.3f} %)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
