"""Produces records with the confluent-kafka Python client (an external Kafka client, built on
its own librdkafka), as a user's producer would: the tests' way to get batches compressed with
every codec into a broker.

Reads one JSON object per line on standard input: {"key": hex, "value": hex or null,
"partition": int or null}. Its arguments are librdkafka properties, `name=value`
(bootstrap.servers, compression.type, ...), and the topic last. Writes one JSON object per
delivered record, in input order: {"index": n, "partition": p, "offset": o}; exits 1 if any
delivery failed.
"""

import json
import sys

import confluent_kafka


def main():
    *properties, topic = sys.argv[1:]
    config = dict(prop.split("=", 1) for prop in properties)
    producer = confluent_kafka.Producer(config)
    delivered = {}
    failures = []

    def report(index):
        def callback(err, message):
            if err is not None:
                failures.append((index, str(err)))
            else:
                delivered[index] = (message.partition(), message.offset())

        return callback

    for index, line in enumerate(sys.stdin):
        record = json.loads(line)
        key = bytes.fromhex(record["key"])
        value = None if record["value"] is None else bytes.fromhex(record["value"])
        args = {"key": key, "value": value, "on_delivery": report(index)}
        if record.get("partition") is not None:
            args["partition"] = record["partition"]
        while True:
            try:
                producer.produce(topic, **args)
                break
            except BufferError:
                producer.poll(0.05)
        producer.poll(0)
    remaining = producer.flush(120)
    if remaining or failures:
        print(f"{remaining} undelivered, failures: {failures[:5]}", file=sys.stderr)
        sys.exit(1)
    for index in sorted(delivered):
        partition, offset = delivered[index]
        print(json.dumps({"index": index, "partition": partition, "offset": offset}))


if __name__ == "__main__":
    main()
