#!/usr/bin/env python3
"""Produces jobs with a third-party client (confluent-kafka) and one compression codec.

Usage: produce-codecs.py BOOTSTRAP TOPIC CODEC < jobs.jsonl
Each stdin line is one job's JSON body; its key is the job's campaign_id. Exits non-zero
if any message is not acknowledged, printing the reason.
"""
import json
import sys

from confluent_kafka import Producer


def main():
    bootstrap, topic, codec = sys.argv[1:4]
    producer = Producer({
        "bootstrap.servers": bootstrap,
        "compression.type": codec,
        "acks": "all",
        # Several jobs per batch, so the batch really is compressed as one.
        "linger.ms": 50,
        "enable.idempotence": False,
    })
    failures = []

    def delivered(err, _msg):
        if err is not None:
            failures.append(str(err))

    count = 0
    for line in sys.stdin:
        line = line.strip()
        if not line:
            continue
        key = json.loads(line)["campaign_id"]
        producer.produce(topic, value=line.encode(), key=key.encode(), on_delivery=delivered)
        producer.poll(0)
        count += 1
    left = producer.flush(30)
    if left or failures:
        print(f"{codec}: {left} unacknowledged, failures: {failures[:3]}", file=sys.stderr)
        sys.exit(1)
    print(f"{codec}: {count} produced")


if __name__ == "__main__":
    main()
