package broker

//lint:file-ignore SA1019 the tests pull with ReturnImmediately, deprecated in the API yet still honoured by the service, to see an empty backlog at once

import (
	"context"
	"encoding/binary"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"cloud.google.com/go/iam/apiv1/iampb"
	"cloud.google.com/go/pubsub/v2"
	pubsubapi "cloud.google.com/go/pubsub/v2/apiv1"
	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/api/iterator"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// TestCompactionKeepsEveryKind builds one of every durable resource kind in
// a broker process, fills its log until it is compacted, kills it with
// SIGKILL, restarts it on the same data directory and checks that every Get
// and List answers as before, and that every backlog holds the same
// messages: the checkpoint a compaction writes must carry all of it.
func TestCompactionKeepsEveryKind(t *testing.T) {
	const compactSize = 256 << 10
	bin, dir := buildBrokerd(t), t.TempDir()
	cmd, addr := startBrokerd(t, bin, dir, "--compact-size", fmt.Sprint(compactSize))
	defer func() {
		if cmd != nil {
			cmd.Process.Kill()
			cmd.Wait()
		}
	}()
	c, sc := newClient(t, addr), schemaClient(t, addr)
	pulled := buildEveryKind(t, c, sc)

	// Publishes to a topic nobody subscribes to grow the log and leave the
	// live state as it is, until the log is rewritten as a checkpoint.
	filler := createTopic(t, c)
	log := filepath.Join(dir, logName)
	for i := 0; !startsWithCheckpoint(t, log); i++ {
		if i == 64 {
			t.Fatalf("no compaction after publishing %d KiB to a %d KiB log", i*64, compactSize>>10)
		}
		publish(t, c, filler, &pubsub.Message{Data: make([]byte, 64<<10)})
	}

	before := observe(t, c, sc)
	before["backlogs"] = pulled(t, c)
	kill9(t, cmd)
	cmd, addr = startBrokerd(t, bin, dir, "--compact-size", fmt.Sprint(compactSize))
	c, sc = newClient(t, addr), schemaClient(t, addr)
	after := observe(t, c, sc)
	after["backlogs"] = pulled(t, c)
	if d := cmp.Diff(before, after, protocmp.Transform()); d != "" {
		t.Errorf("state after compaction and kill -9 differs (-before +after):\n%s", d)
	}
}

// startsWithCheckpoint says whether the log at path begins with the record
// a checkpoint starts with, which a log that was never compacted does not.
func startsWithCheckpoint(t *testing.T, path string) bool {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var hdr [9]byte
	if _, err := f.ReadAt(hdr[:], 0); err != nil {
		t.Fatal(err)
	}
	return binary.LittleEndian.Uint32(hdr[:4]) > 0 && hdr[8] == recCounters
}

// buildEveryKind creates topics, subscriptions with every setting, schemas
// with several revisions, snapshots and backlogs with some messages acked
// and some sought back. It returns what pulls every backlog without acking
// (leases are not durable, so a restart makes the same messages pullable).
func buildEveryKind(t *testing.T, c *pubsub.Client, sc *pubsubapi.SchemaClient) func(t *testing.T, c *pubsub.Client) map[string]*pb.PullResponse {
	t.Helper()
	ctx := context.Background()
	parent := "projects/" + project
	sch, err := sc.CreateSchema(ctx, &pb.CreateSchemaRequest{Parent: parent, SchemaId: unique("order"),
		Schema: &pb.Schema{Type: pb.Schema_AVRO, Definition: orderAvro}})
	if err != nil {
		t.Fatal(err)
	}
	rev2, err := sc.CommitSchema(ctx, &pb.CommitSchemaRequest{Name: sch.Name, Schema: &pb.Schema{Type: pb.Schema_AVRO, Definition: orderAvro2}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sc.CreateSchema(ctx, &pb.CreateSchemaRequest{Parent: parent, SchemaId: unique("note"),
		Schema: &pb.Schema{Type: pb.Schema_PROTOCOL_BUFFER, Definition: `syntax = "proto3"; message Note { string text = 1; }`}}); err != nil {
		t.Fatal(err)
	}

	orders, err := c.TopicAdminClient.CreateTopic(ctx, &pb.Topic{Name: topicName(unique("orders")),
		Labels:                   map[string]string{"team": "shop"},
		MessageRetentionDuration: durationpb.New(36 * time.Hour),
		SchemaSettings: &pb.SchemaSettings{Schema: sch.Name, Encoding: pb.Encoding_JSON,
			FirstRevisionId: sch.RevisionId, LastRevisionId: rev2.RevisionId}})
	if err != nil {
		t.Fatal(err)
	}
	events, err := c.TopicAdminClient.CreateTopic(ctx, &pb.Topic{Name: topicName(unique("events")),
		Labels: map[string]string{"env": "test"}, MessageRetentionDuration: durationpb.New(2 * time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	dead := createTopic(t, c)
	full := createSub(t, c, &pb.Subscription{Topic: events.Name, AckDeadlineSeconds: 30,
		Filter:                   `attributes.kind = "keep"`,
		DeadLetterPolicy:         &pb.DeadLetterPolicy{DeadLetterTopic: dead, MaxDeliveryAttempts: 7},
		EnableMessageOrdering:    true,
		ExpirationPolicy:         &pb.ExpirationPolicy{Ttl: durationpb.New(48 * time.Hour)},
		RetainAckedMessages:      true,
		MessageRetentionDuration: durationpb.New(time.Hour),
		Labels:                   map[string]string{"owner": "billing"}})
	exact := createSub(t, c, &pb.Subscription{Topic: events.Name, EnableExactlyOnceDelivery: true, AckDeadlineSeconds: 20})
	seeked := createSub(t, c, &pb.Subscription{Topic: events.Name, RetainAckedMessages: true})
	createSub(t, c, &pb.Subscription{Topic: dead, Labels: map[string]string{"kind": "push"},
		RetryPolicy: &pb.RetryPolicy{MinimumBackoff: durationpb.New(2 * time.Second), MaximumBackoff: durationpb.New(time.Minute)},
		PushConfig:  &pb.PushConfig{PushEndpoint: "http://127.0.0.1:9/push", Attributes: map[string]string{"x-goog-version": "v1"}}})
	schemed := createSub(t, c, &pb.Subscription{Topic: orders.Name})

	var msgs []*pubsub.Message
	for i := range 12 {
		kind := "keep"
		if i%3 == 0 {
			kind = "drop"
		}
		msgs = append(msgs, &pubsub.Message{Data: fmt.Appendf(nil, "event %d", i), OrderingKey: fmt.Sprint("k", i),
			Attributes: map[string]string{"kind": kind, "i": fmt.Sprint(i)}})
	}
	p := c.Publisher(events.Name)
	p.EnableMessageOrdering = true
	for _, m := range msgs {
		if _, err := p.Publish(ctx, m).Get(ctx); err != nil {
			t.Fatal(err)
		}
	}
	p.Stop()
	publish(t, c, orders.Name, &pubsub.Message{Data: []byte(`{"id":"o1","qty":2,"note":null,"kind":"BULK","tags":["a"]}`)})

	// Ack half of each backlog (and nack the rest), snapshot one, and ack
	// all of another and seek it back to before the publishes.
	ackSome := func(sub string, keep func(i int) bool) {
		for _, m := range pullAll(t, c, sub).ReceivedMessages {
			var i int
			fmt.Sscan(m.Message.Attributes["i"], &i)
			var err error
			if keep(i) {
				err = c.SubscriptionAdminClient.ModifyAckDeadline(ctx, &pb.ModifyAckDeadlineRequest{Subscription: sub, AckIds: []string{m.AckId}})
			} else {
				err = c.SubscriptionAdminClient.Acknowledge(ctx, &pb.AcknowledgeRequest{Subscription: sub, AckIds: []string{m.AckId}})
			}
			if err != nil {
				t.Fatal(err)
			}
		}
	}
	ackSome(full.Name, func(i int) bool { return i%2 == 0 })
	ackSome(exact.Name, func(i int) bool { return i < 6 })
	if _, err := c.SubscriptionAdminClient.CreateSnapshot(ctx, &pb.CreateSnapshotRequest{Name: "projects/" + project + "/snapshots/" + unique("snap"),
		Subscription: full.Name, Labels: map[string]string{"why": "test"}}); err != nil {
		t.Fatal(err)
	}
	ackSome(seeked.Name, func(int) bool { return false })
	if _, err := c.SubscriptionAdminClient.Seek(ctx, &pb.SeekRequest{Subscription: seeked.Name,
		Target: &pb.SeekRequest_Time{Time: timestamppb.New(time.Unix(1, 0))}}); err != nil {
		t.Fatal(err)
	}
	snaps := collect(t, c.SubscriptionAdminClient.ListSnapshots(ctx, &pb.ListSnapshotsRequest{Project: parent}))
	for i, ic := range []iamClient{c.TopicAdminClient, c.SubscriptionAdminClient, c.SubscriptionAdminClient, sc} {
		name := []string{events.Name, full.Name, snaps[0].Name, sch.Name}[i]
		pol := &iampb.Policy{Bindings: []*iampb.Binding{{Role: "roles/pubsub.editor", Members: []string{"user:ada@example.com", "group:ops@example.com"}}}}
		if _, err := ic.SetIamPolicy(ctx, &iampb.SetIamPolicyRequest{Resource: name, Policy: pol}); err != nil {
			t.Fatal(err)
		}
	}
	subs := []string{full.Name, exact.Name, seeked.Name, schemed.Name}
	return func(t *testing.T, c *pubsub.Client) map[string]*pb.PullResponse {
		out := map[string]*pb.PullResponse{}
		for _, s := range subs {
			r := pullAll(t, c, s)
			for _, m := range r.ReceivedMessages {
				m.AckId, m.DeliveryAttempt = "", 0 // new on every delivery
			}
			slices.SortFunc(r.ReceivedMessages, func(a, b *pb.ReceivedMessage) int {
				return strings.Compare(a.Message.MessageId, b.Message.MessageId)
			})
			if len(r.ReceivedMessages) == 0 {
				t.Fatalf("%s has an empty backlog; the test proves nothing about it", s)
			}
			out[s] = r
		}
		return out
	}
}

// pullAll pulls without acking until sub has nothing more to hand out.
func pullAll(t *testing.T, c *pubsub.Client, sub string) *pb.PullResponse {
	t.Helper()
	all := &pb.PullResponse{}
	for {
		r, err := c.SubscriptionAdminClient.Pull(context.Background(), &pb.PullRequest{Subscription: sub, MaxMessages: 1000, ReturnImmediately: true}) //nolint:staticcheck
		if err != nil {
			t.Fatal(err)
		}
		if len(r.ReceivedMessages) == 0 {
			return all
		}
		all.ReceivedMessages = append(all.ReceivedMessages, r.ReceivedMessages...)
	}
}

// observe answers every Get and List of the admin APIs, by resource name.
func observe(t *testing.T, c *pubsub.Client, sc *pubsubapi.SchemaClient) map[string]any {
	t.Helper()
	ctx := context.Background()
	parent := "projects/" + project
	out := map[string]any{}
	topics := collect(t, c.TopicAdminClient.ListTopics(ctx, &pb.ListTopicsRequest{Project: parent}))
	out["topics"] = topics
	for _, tp := range topics {
		{
			m, err := c.TopicAdminClient.GetTopic(ctx, &pb.GetTopicRequest{Topic: tp.Name})
			must(t, err)
			out[tp.Name] = m
		}
		out[tp.Name+" subscriptions"] = collect(t, c.TopicAdminClient.ListTopicSubscriptions(ctx, &pb.ListTopicSubscriptionsRequest{Topic: tp.Name}))
		out[tp.Name+" snapshots"] = collect(t, c.TopicAdminClient.ListTopicSnapshots(ctx, &pb.ListTopicSnapshotsRequest{Topic: tp.Name}))
	}
	subs := collect(t, c.SubscriptionAdminClient.ListSubscriptions(ctx, &pb.ListSubscriptionsRequest{Project: parent}))
	out["subscriptions"] = subs
	for _, s := range subs {
		{
			m, err := c.SubscriptionAdminClient.GetSubscription(ctx, &pb.GetSubscriptionRequest{Subscription: s.Name})
			must(t, err)
			out[s.Name] = m
		}
	}
	snaps := collect(t, c.SubscriptionAdminClient.ListSnapshots(ctx, &pb.ListSnapshotsRequest{Project: parent}))
	out["snapshots"] = snaps
	for _, sn := range snaps {
		{
			m, err := c.SubscriptionAdminClient.GetSnapshot(ctx, &pb.GetSnapshotRequest{Snapshot: sn.Name})
			must(t, err)
			out[sn.Name] = m
		}
	}
	schemas := collect(t, sc.ListSchemas(ctx, &pb.ListSchemasRequest{Parent: parent, View: pb.SchemaView_FULL}))
	out["schemas"] = schemas
	for _, s := range schemas {
		{
			m, err := sc.GetSchema(ctx, &pb.GetSchemaRequest{Name: s.Name, View: pb.SchemaView_FULL})
			must(t, err)
			out[s.Name] = m
		}
		out[s.Name+" revisions"] = collect(t, sc.ListSchemaRevisions(ctx, &pb.ListSchemaRevisionsRequest{Name: s.Name, View: pb.SchemaView_FULL}))
	}
	policies := 0
	for name, v := range out {
		if _, ok := v.(proto.Message); !ok || strings.Contains(name, " ") {
			continue
		}
		var ic iamClient = c.TopicAdminClient
		switch strings.Split(name, "/")[2] {
		case "subscriptions", "snapshots":
			ic = c.SubscriptionAdminClient
		case "schemas":
			ic = sc
		}
		p, err := ic.GetIamPolicy(ctx, &iampb.GetIamPolicyRequest{Resource: name})
		must(t, err)
		out[name+" policy"] = p
		policies += len(p.Bindings)
	}
	if len(topics) < 4 || policies < 4 || len(subs) < 5 || len(snaps) < 1 || len(schemas) < 2 {
		t.Fatalf("%d topics, %d subscriptions, %d snapshots, %d schemas, %d IAM bindings: fewer than were created", len(topics), len(subs), len(snaps), len(schemas), policies)
	}
	return out
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func collect[M any](t *testing.T, it interface{ Next() (M, error) }) []M {
	t.Helper()
	var out []M
	for {
		m, err := it.Next()
		if err == iterator.Done {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, m)
	}
}

// TestRecordKinds checks the table of durable state: the record types are
// the rec constants of the package's source, each with one row, and run
// 1..N without gaps; every kind is replayed, and is either saved by a
// checkpoint or says which saved state holds its effect.
func TestRecordKinds(t *testing.T) {
	rows := map[byte]recordKind{}
	for _, k := range recordKinds {
		if _, dup := rows[k.typ]; dup {
			t.Errorf("record type %d (%s) appears twice", k.typ, k.name)
		}
		rows[k.typ] = k
		if k.apply == nil {
			t.Errorf("%s records are not replayed", k.name)
		}
		if (k.save == nil) == (k.folded == "") {
			t.Errorf("%s: a kind either saves its state at a checkpoint or names the state that holds its effect", k.name)
		}
	}
	for typ := 1; typ <= len(recordKinds); typ++ {
		if _, ok := rows[byte(typ)]; !ok {
			t.Errorf("no row for record type %d: the types run 1..%d without gaps", typ, len(recordKinds))
		}
	}
	consts := recordConsts(t)
	for name, typ := range consts {
		if _, ok := rows[typ]; !ok {
			t.Errorf("%s = %d has no row in recordKinds", name, typ)
		}
	}
	if len(consts) != len(recordKinds) {
		t.Errorf("%d rec constants for %d rows", len(consts), len(recordKinds))
	}
}

// recordConsts reads the record types from the package's source: every
// byte constant whose name starts with rec, with its literal value.
func recordConsts(t *testing.T) map[string]byte {
	t.Helper()
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]byte{}
	fset := token.NewFileSet()
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range f.Decls {
			gd, ok := d.(*ast.GenDecl)
			if !ok || gd.Tok != token.CONST {
				continue
			}
			for _, spec := range gd.Specs {
				vs := spec.(*ast.ValueSpec)
				if id, ok := vs.Type.(*ast.Ident); !ok || id.Name != "byte" {
					continue
				}
				for i, n := range vs.Names {
					if !strings.HasPrefix(n.Name, "rec") {
						continue
					}
					lit, ok := vs.Values[i].(*ast.BasicLit)
					if !ok {
						t.Fatalf("%s: %s is not a literal; record types are written out, being on disk", fset.Position(n.Pos()), n.Name)
					}
					v, err := strconv.ParseUint(lit.Value, 0, 8)
					if err != nil {
						t.Fatalf("%s: %s: %v", fset.Position(n.Pos()), n.Name, err)
					}
					out[n.Name] = byte(v)
				}
			}
		}
	}
	if len(out) == 0 {
		t.Fatal("found no rec constants in the package's source")
	}
	return out
}
