"""client_tour.py walks the official Python Pub/Sub client through the features
a user relies on, against whatever PUBSUB_EMULATOR_HOST points at, and prints a
transcript that is the same on any server that behaves like Pub/Sub: no message
IDs, no times, the order fixed wherever Pub/Sub fixes it. Each feature starts
with a "== name" line; a feature the server refuses prints "unsupported: CODE"
and the tour goes on. With TOUR_TRANSPORT=rest the clients speak the REST API
(the client's own REST transport) and receive by synchronous pull, as REST has
no streaming pull. Used by the broker's Go tests (broker/python_test.go).
"""

import json
import os
import sys
import threading
import time

from google.api_core import exceptions
from google.auth.credentials import AnonymousCredentials
from google.cloud import pubsub_v1
from google.pubsub_v1.services.publisher.transports.rest import PublisherRestTransport
from google.pubsub_v1.services.schema_service import SchemaServiceClient
from google.pubsub_v1.services.schema_service.transports.rest import SchemaServiceRestTransport
from google.pubsub_v1.services.subscriber.transports.rest import SubscriberRestTransport
from google.pubsub_v1.types import Encoding, Schema, SchemaSettings

PROJECT = os.environ.get("TOUR_PROJECT", "dedupflow-python")
SUFFIX = os.environ.get("TOUR_SUFFIX", str(time.time_ns()))
TIMEOUT = 10  # seconds to wait for an expected delivery or publish
REST = os.environ.get("TOUR_TRANSPORT", "grpc") == "rest"


def transport(kind):
    """Over REST, a transport made here: given only the emulator host, the client would hand its REST
    transport a gRPC channel."""
    if not REST:
        return {}
    host = os.environ["PUBSUB_EMULATOR_HOST"]
    return {"transport": kind(host=host, url_scheme="http", credentials=AnonymousCredentials())}


publisher = pubsub_v1.PublisherClient(
    publisher_options=pubsub_v1.types.PublisherOptions(enable_message_ordering=True),
    **transport(PublisherRestTransport))
subscriber = pubsub_v1.SubscriberClient(**transport(SubscriberRestTransport))
schemas = SchemaServiceClient(**transport(SchemaServiceRestTransport))
cleanup = []


def publish(topic_path, data, **fields):
    """publisher.publish; over REST with a timeout of its own, as the client gives an ordered publish one of
    2**32 s, which its REST transport's HTTP library takes as already past."""
    if REST:
        fields.update(retry=None, timeout=TIMEOUT)
    return publisher.publish(topic_path, data, **fields)


def code(e):
    """The status code of an error: over REST the client knows only the HTTP status, the body names the code."""
    if e.grpc_status_code is not None:
        return e.grpc_status_code.name
    return e.response.json()["error"]["status"]


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
    if REST:
        return pull(sub_path, n, handle)
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


def pull(sub_path, n, handle=None):
    """receive by synchronous pull, for REST."""
    got, deadline = [], time.monotonic() + TIMEOUT
    while len(got) < n and time.monotonic() < deadline:
        resp = subscriber.pull(request={"subscription": sub_path, "max_messages": n - len(got)}, timeout=TIMEOUT)
        for rm in resp.received_messages:
            msg = Pulled(sub_path, rm)
            if handle:
                handle(msg)
            else:
                msg.ack()
            got.append(msg)
    return got


class Pulled:
    """A pulled message with the streaming client's message's fields and acks."""

    def __init__(self, sub_path, rm):
        self.sub_path, self.ack_id = sub_path, rm.ack_id
        self.data, self.attributes, self.ordering_key = rm.message.data, rm.message.attributes, rm.message.ordering_key

    def ack(self):
        subscriber.acknowledge(subscription=self.sub_path, ack_ids=[self.ack_id])

    def ack_with_response(self):
        self.ack()  # raises if the server refuses it
        return Acked()


class Acked:
    def result(self, timeout):
        return pubsub_v1.subscriber.exceptions.AcknowledgeStatus.SUCCESS


def publish_and_pull():
    say("== publish with attributes and ordering keys, streaming pull and ack")
    t = topic("orders")
    s = subscription("orders", t, enable_message_ordering=True)
    futures = []
    for key in ("a", "b"):
        for i in range(3):
            futures.append(publish(
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
    publish(t, b"once").result(TIMEOUT)
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
        say("unsupported:", code(e))
        return
    cleanup.append(lambda: schemas.delete_schema(name=schema_path))
    say("schema type:", schemas.get_schema(name=schema_path).type_.name)
    t = topic("readings", schema_settings=SchemaSettings(schema=schema_path, encoding=Encoding.JSON))
    s = subscription("readings", t)
    publish(t, json.dumps({"sensor": "s1", "value": 21.5}).encode()).result(TIMEOUT)
    say("valid message: published")
    try:
        publish(t, json.dumps({"sensor": 1}).encode()).result(TIMEOUT)
        say("invalid message: published")
    except exceptions.GoogleAPICallError as e:
        say("invalid message:", code(e))
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
        publish(t, f"m{i}".encode()).result(TIMEOUT)
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
                say("unsupported:", code(e))
    finally:
        for undo in reversed(cleanup):
            try:
                undo()
            except exceptions.GoogleAPICallError:
                pass
        if REST:
            subscriber.api.transport.close()
        else:
            subscriber.close()


if __name__ == "__main__":
    main()
