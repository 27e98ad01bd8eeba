"""client_tour.py walks the official Python Pub/Sub client through the features
a user relies on, against whatever PUBSUB_EMULATOR_HOST points at, and prints a
transcript that is the same on any server that behaves like Pub/Sub: no message
IDs, no times, the order fixed wherever Pub/Sub fixes it. Each feature starts
with a "== name" line; a feature the server refuses prints "unsupported: CODE"
and the tour goes on. Used by the broker's Go tests (broker/python_test.go).
"""

import json
import os
import sys
import threading
import time

from google.api_core import exceptions
from google.cloud import pubsub_v1
from google.pubsub_v1.services.schema_service import SchemaServiceClient
from google.pubsub_v1.types import Encoding, Schema, SchemaSettings

PROJECT = os.environ.get("TOUR_PROJECT", "dedupflow-python")
SUFFIX = os.environ.get("TOUR_SUFFIX", str(time.time_ns()))
TIMEOUT = 10  # seconds to wait for an expected delivery or publish

publisher = pubsub_v1.PublisherClient(
    publisher_options=pubsub_v1.types.PublisherOptions(enable_message_ordering=True))
subscriber = pubsub_v1.SubscriberClient()
schemas = SchemaServiceClient()
cleanup = []


def say(*parts):
    print(*parts, flush=True)


def name(kind):
    return f"py-{kind}-{SUFFIX}"


def topic(kind, **fields):
    path = publisher.topic_path(PROJECT, name(kind))
    publisher.create_topic(request={"name": path, **fields})
    cleanup.append(lambda: publisher.delete_topic(topic=path))
    return path


def subscription(kind, topic_path, **fields):
    path = subscriber.subscription_path(PROJECT, name(kind))
    subscriber.create_subscription(request={"name": path, "topic": topic_path, **fields})
    cleanup.append(lambda: subscriber.delete_subscription(subscription=path))
    return path


def receive(sub_path, n, handle=None):
    """Streaming-pulls up to n messages (fewer when the wait runs out), acks each (through handle when
    given) and returns them in arrival order."""
    got, lock, done = [], threading.Lock(), threading.Event()

    def callback(msg):
        if handle:
            handle(msg)
        else:
            msg.ack()
        with lock:
            got.append(msg)
            if len(got) >= n:
                done.set()

    future = subscriber.subscribe(sub_path, callback)
    done.wait(TIMEOUT)
    future.cancel()
    future.result()
    with lock:
        return list(got)


def publish_and_pull():
    say("== publish with attributes and ordering keys, streaming pull and ack")
    t = topic("orders")
    s = subscription("orders", t, enable_message_ordering=True)
    futures = []
    for key in ("a", "b"):
        for i in range(3):
            futures.append(publisher.publish(
                t, f"{key}-{i}".encode(), ordering_key=key, n=str(i), lang="python", unicode="värde"))
    say("published", len([f.result(TIMEOUT) for f in futures]))
    msgs = receive(s, 6)
    for key in ("a", "b"):
        say(f"key {key}:", " ".join(m.data.decode() for m in msgs if m.ordering_key == key))
    for m in msgs[:1]:
        say("attributes:", json.dumps(dict(m.attributes), sort_keys=True, ensure_ascii=False))


def exactly_once():
    say("== exactly-once subscription")
    t = topic("eod")
    s = subscription("eod", t, enable_exactly_once_delivery=True)
    say("enable_exactly_once_delivery:", subscriber.get_subscription(subscription=s).enable_exactly_once_delivery)
    publisher.publish(t, b"once").result(TIMEOUT)
    results = []

    def ack(msg):
        results.append(msg.ack_with_response().result(TIMEOUT))

    msgs = receive(s, 1, ack)
    say("received:", " ".join(m.data.decode() for m in msgs))
    say("ack result:", " ".join(r.name for r in results))


def schema_topic():
    say("== schema-checked topic")
    definition = json.dumps({"type": "record", "name": "Reading", "fields": [
        {"name": "sensor", "type": "string"}, {"name": "value", "type": "double"}]})
    schema_path = schemas.schema_path(PROJECT, name("reading"))
    try:
        schemas.create_schema(request={
            "parent": f"projects/{PROJECT}", "schema_id": name("reading"),
            "schema": Schema(name=schema_path, type_=Schema.Type.AVRO, definition=definition)})
    except exceptions.GoogleAPICallError as e:
        say("unsupported:", e.grpc_status_code.name)
        return
    cleanup.append(lambda: schemas.delete_schema(name=schema_path))
    say("schema type:", schemas.get_schema(name=schema_path).type_.name)
    t = topic("readings", schema_settings=SchemaSettings(schema=schema_path, encoding=Encoding.JSON))
    s = subscription("readings", t)
    publisher.publish(t, json.dumps({"sensor": "s1", "value": 21.5}).encode()).result(TIMEOUT)
    say("valid message: published")
    try:
        publisher.publish(t, json.dumps({"sensor": 1}).encode()).result(TIMEOUT)
        say("invalid message: published")
    except exceptions.GoogleAPICallError as e:
        say("invalid message:", e.grpc_status_code.name)
    for m in receive(s, 1):
        say("received:", m.data.decode())
        say("attributes:", " ".join(sorted(m.attributes)))


def seek():
    say("== seek to a snapshot and to a time")
    t = topic("seek")
    s = subscription("seek", t, retain_acked_messages=True)  # seek to a time replays acked messages only so
    snap = subscriber.snapshot_path(PROJECT, name("seek"))
    subscriber.create_snapshot(request={"name": snap, "subscription": s})
    cleanup.append(lambda: subscriber.delete_snapshot(snapshot=snap))
    before = time.time() - 1  # a second of slack for the server's clock
    for i in range(3):
        publisher.publish(t, f"m{i}".encode()).result(TIMEOUT)
    say("first delivery:", " ".join(sorted(m.data.decode() for m in receive(s, 3))))
    subscriber.seek(request={"subscription": s, "snapshot": snap})
    say("after seek to snapshot:", " ".join(sorted(m.data.decode() for m in receive(s, 3))))
    subscriber.seek(request={"subscription": s, "time": {"seconds": int(before)}})
    say("after seek to time:", " ".join(sorted(m.data.decode() for m in receive(s, 3))))


def main():
    if not os.environ.get("PUBSUB_EMULATOR_HOST"):
        sys.exit("PUBSUB_EMULATOR_HOST is not set")
    try:
        for step in (publish_and_pull, exactly_once, schema_topic, seek):
            try:
                step()
            except exceptions.GoogleAPICallError as e:
                say("unsupported:", e.grpc_status_code.name)
    finally:
        for undo in reversed(cleanup):
            try:
                undo()
            except exceptions.GoogleAPICallError:
                pass
        subscriber.close()


if __name__ == "__main__":
    main()
