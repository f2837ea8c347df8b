#!/usr/bin/env python3
"""How fast a consumer group of three settles on the broker, and after one member
leaves or dies. A diagnostic of the broker, not part of the suite; needs
`pip install confluent-kafka` (it bundles librdkafka) and a broker on 127.0.0.1:9092.

    scripts/group-settle.py form  N [--heartbeat MS] [--strategy S] [--staggered]
    scripts/group-settle.py leave N [--heartbeat MS] [--strategy S]
    scripts/group-settle.py kill  N [--heartbeat MS] [--strategy S]

"Settled": every live member owns partitions, all 6 are owned once, and no assignment
has changed for 9 s; the time printed is when that quiet began. Each trial gets its
own topic and group; a trial that has not settled after 111 s says so.
"""
import argparse, multiprocessing as mp, os, signal, time, uuid

from confluent_kafka import Consumer
from confluent_kafka.admin import AdminClient, NewTopic

BROKER = "127.0.0.1:9092"
PARTITIONS = 6
QUIET = 9.0
LIMIT = 120.0


def member(topic, group, args, events, idx, stop):
    c = Consumer({"bootstrap.servers": BROKER, "group.id": group,
                  "session.timeout.ms": 6000, "max.poll.interval.ms": 12000,
                  "heartbeat.interval.ms": args.heartbeat,
                  "partition.assignment.strategy": args.strategy,
                  "isolation.level": "read_uncommitted", "enable.auto.commit": False})
    coop = args.strategy == "cooperative-sticky"

    def on_assign(c_, parts):
        events.put((time.time(), idx, True, [p.partition for p in parts]))
        c_.incremental_assign(parts) if coop else c_.assign(parts)

    def on_revoke(c_, parts):
        events.put((time.time(), idx, False, [p.partition for p in parts]))
        c_.incremental_unassign(parts) if coop else c_.unassign()

    c.subscribe([topic], on_assign=on_assign, on_revoke=on_revoke)
    while not stop.is_set():
        c.poll(0.1)
    c.close()


class Group:
    def __init__(self, args):
        self.topic = "settle_" + uuid.uuid4().hex[:8]
        admin = AdminClient({"bootstrap.servers": BROKER})
        for f in admin.create_topics([NewTopic(self.topic, PARTITIONS, 1)]).values():
            f.result()
        self.group, self.args = "g_" + uuid.uuid4().hex[:8], args
        self.events, self.owned, self.last = mp.Queue(), [set(), set(), set()], time.time()
        self.stops, self.procs = [mp.Event() for _ in range(3)], []

    def start(self, i):
        p = mp.Process(target=member, args=(self.topic, self.group, self.args,
                                            self.events, i, self.stops[i]))
        p.start()
        self.procs.append(p)

    def drain(self, span):
        end = time.time() + span
        while time.time() < end:
            try:
                t, i, assigned, parts = self.events.get(timeout=max(0.01, end - time.time()))
            except Exception:
                return
            (self.owned[i].update if assigned else self.owned[i].difference_update)(parts)
            self.last = t

    def settled(self, live):
        sets = [self.owned[i] for i in live]
        return (all(sets) and sum(map(len, sets)) == PARTITIONS
                and len(set().union(*sets)) == PARTITIONS and time.time() - self.last >= QUIET)

    def wait(self, live, since):
        while time.time() - since < LIMIT and not self.settled(live):
            self.drain(0.25)
        return self.settled(live), time.time() - since - QUIET

    def close(self):
        for s in self.stops:
            s.set()
        for p in self.procs:
            p.join(15)
            if p.is_alive():
                p.kill()


def trial(args):
    g, t0 = Group(args), time.time()
    try:
        for i in range(3):
            g.start(i)
            if args.staggered and i < 2:
                g.wait(range(i + 1), t0)
        ok, took = g.wait([0, 1, 2], t0)
        if not ok:
            return "formation: NOT settled in %.0f s" % (LIMIT - QUIET)
        out = "formation settled after %.1f s" % took
        if args.mode == "form":
            return out
        t1 = time.time()
        if args.mode == "kill":
            os.kill(g.procs[1].pid, signal.SIGKILL)
        else:
            g.stops[1].set()
        g.owned[1], g.last = set(), time.time()
        ok, took = g.wait([0, 2], t1)
        state = "settled after %.1f s" % took if ok else "NOT settled in %.0f s" % (LIMIT - QUIET)
        return out + "; after %s: %s" % (args.mode, state)
    finally:
        g.close()


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["form", "leave", "kill"])
    ap.add_argument("trials", type=int)
    ap.add_argument("--heartbeat", type=int, default=3000, help="heartbeat.interval.ms")
    ap.add_argument("--strategy", default="cooperative-sticky")
    ap.add_argument("--staggered", action="store_true",
                    help="start each member once the ones before it have settled")
    args = ap.parse_args()
    for k in range(args.trials):
        print("%s %s heartbeat %d ms, trial %d: %s" % (
            args.strategy, args.mode, args.heartbeat, k, trial(args)), flush=True)
