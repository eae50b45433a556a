#!/usr/bin/env python3
"""A switch in user space that impairs what it forwards, for the multi-host tests.

What `tc qdisc ... netem` does (delay with jitter, random loss) for kernels that lack
sch_netem (this project's CI machines do). netns_hosts.sh `impair` takes the host ports
off the switch namespace's bridge and runs this program in that namespace instead: it
reads every frame a host sends (an AF_PACKET socket per port) and repeats it on every
other port (a hub: the hosts' kernels drop frames addressed to another MAC), each copy
independently:
  - dropped with probability --loss (0..1),
  - or sent after --delay-ms plus a uniform draw in [-jitter, +jitter] ms (at least 0;
    copies may be reordered, as with netem's jitter),
  - and never to or from a port named by --cut (a partition: the link stays up, so the
    host's kernel sees no carrier loss and its connections simply go quiet).
The ports' offloads must be off (netns_hosts.sh does it with ethtool): a frame read
here must be a whole MTU-sized frame with its checksums filled in.

Every second and on SIGTERM / SIGINT it writes its counters as one JSON line to
--stats, so that a test can check that the impairment really applied (frames):
received; sent; dropped (by --loss); cut_from (frames a cut port sent, none
forwarded); cut_to (copies not sent to a cut port); send_errors (a copy the
kernel refused, e.g. a port gone down); oversize (frames longer than an Ethernet
frame: offloads were not off). Exits 0 on SIGTERM / SIGINT.
"""
import argparse
import heapq
import json
import os
import random
import select
import signal
import socket
import sys
import time

ETH_P_ALL = 0x0003
PACKET_OUTGOING = 4  # linux/if_packet.h: a frame this socket's port sent
MAX_FRAME = 1514  # Ethernet header + a 1500-byte MTU


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ports", required=True, help="comma-separated interface names")
    ap.add_argument("--delay-ms", type=float, default=0.0)
    ap.add_argument("--jitter-ms", type=float, default=0.0)
    ap.add_argument("--loss", type=float, default=0.0, help="drop probability per frame, 0..1")
    ap.add_argument("--cut", default="", help="comma-separated ports cut off from the others")
    ap.add_argument("--stats", help="file the counters go to (JSON, rewritten every second)")
    ap.add_argument("--seed", type=int, default=None)
    args = ap.parse_args()
    if not 0.0 <= args.loss <= 1.0 or args.delay_ms < 0 or args.jitter_ms < 0:
        ap.error("--loss must be in [0, 1], --delay-ms and --jitter-ms >= 0")
    ports = [p for p in args.ports.split(",") if p]
    cut = {p for p in args.cut.split(",") if p}
    if len(ports) < 2 or not cut <= set(ports):
        ap.error("need at least two --ports, and --cut must name some of them")
    rng = random.Random(args.seed)

    socks = {}
    for p in ports:
        s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
        s.bind((p, 0))
        s.setblocking(False)
        socks[s.fileno()] = (p, s)
    counters = {"received": 0, "sent": 0, "dropped": 0, "cut_from": 0, "cut_to": 0,
                "send_errors": 0, "oversize": 0}
    queue = []  # (send time, sequence number, socket, frame)
    seq = 0
    stop = False

    def on_signal(*_):
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    def write_stats():
        if not args.stats:
            return
        tmp = args.stats + ".tmp"
        with open(tmp, "w") as f:
            json.dump(counters, f)
            f.write("\n")
        os.replace(tmp, args.stats)

    poller = select.poll()
    for fd in socks:
        poller.register(fd, select.POLLIN)
    next_stats = time.monotonic()
    while not stop:
        now = time.monotonic()
        while queue and queue[0][0] <= now:
            _, _, out, frame = heapq.heappop(queue)
            try:
                out.send(frame)
                counters["sent"] += 1
            except OSError:  # e.g. the port went down: the frame is lost, as on a wire
                counters["send_errors"] += 1
        if now >= next_stats:
            write_stats()
            next_stats = now + 1.0
        timeout_ms = 1000.0 if not queue else max(0.0, (queue[0][0] - now) * 1000.0)
        try:
            ready = poller.poll(min(timeout_ms, 1000.0))
        except InterruptedError:
            continue
        now = time.monotonic()
        for fd, _ in ready:
            src, s = socks[fd]
            while True:
                try:
                    frame, addr = s.recvfrom(65536)
                except (BlockingIOError, InterruptedError):
                    break
                except OSError:
                    break
                if addr[2] == PACKET_OUTGOING:
                    continue
                counters["received"] += 1
                if len(frame) > MAX_FRAME:
                    counters["oversize"] += 1
                if src in cut:
                    counters["cut_from"] += 1
                    continue
                for _, (dst, out) in socks.items():
                    if dst == src:
                        continue
                    if dst in cut:
                        counters["cut_to"] += 1
                        continue
                    if args.loss > 0 and rng.random() < args.loss:
                        counters["dropped"] += 1
                        continue
                    delay = args.delay_ms + rng.uniform(-args.jitter_ms, args.jitter_ms)
                    seq += 1
                    heapq.heappush(queue, (now + max(0.0, delay) / 1000.0, seq, out, frame))
    write_stats()
    return 0


if __name__ == "__main__":
    sys.exit(main())
