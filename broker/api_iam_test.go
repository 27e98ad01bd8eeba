package broker

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"cloud.google.com/go/iam/apiv1/iampb"
	pubsubapi "cloud.google.com/go/pubsub/v2/apiv1"
	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"github.com/dedupflow/dedupflow/internal/testenv"
	"github.com/googleapis/gax-go/v2"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// iamClient is the IAM part of the official client's admin clients.
type iamClient interface {
	GetIamPolicy(context.Context, *iampb.GetIamPolicyRequest, ...gax.CallOption) (*iampb.Policy, error)
	SetIamPolicy(context.Context, *iampb.SetIamPolicyRequest, ...gax.CallOption) (*iampb.Policy, error)
	TestIamPermissions(context.Context, *iampb.TestIamPermissionsRequest, ...gax.CallOption) (*iampb.TestIamPermissionsResponse, error)
}

// iamResources creates a topic, a subscription, a snapshot and a schema and
// returns each with the official client that serves its IAM calls.
func iamResources(t *testing.T, addr string) (names []string, clients []iamClient) {
	t.Helper()
	ctx := context.Background()
	c, sc := newClient(t, addr), schemaClient(t, addr)
	topic := createTopic(t, c)
	sub := createSub(t, c, &pb.Subscription{Topic: topic})
	snap, err := c.SubscriptionAdminClient.CreateSnapshot(ctx, &pb.CreateSnapshotRequest{Name: "projects/" + project + "/snapshots/" + unique("snap"), Subscription: sub.Name})
	if err != nil {
		t.Fatal(err)
	}
	sch, err := sc.CreateSchema(ctx, &pb.CreateSchemaRequest{Parent: "projects/" + project, SchemaId: unique("order"),
		Schema: &pb.Schema{Type: pb.Schema_AVRO, Definition: orderAvro}})
	if err != nil {
		t.Fatal(err)
	}
	return []string{topic, sub.Name, snap.Name, sch.Name},
		[]iamClient{c.TopicAdminClient, c.SubscriptionAdminClient, c.SubscriptionAdminClient, sc}
}

var _ iamClient = (*pubsubapi.SchemaClient)(nil)

// TestIAMPolicies sets, reads and tests IAM policies on every resource kind
// through the official Go client: an etag that changes with every set, a
// stale etag refused with Aborted, missing resources NotFound, the policy
// gone with its resource, and TestIamPermissions answering the resource
// kind's own permissions (policies are stored, not enforced), and none for
// a missing resource.
func TestIAMPolicies(t *testing.T) {
	ctx := context.Background()
	tg := startOurs(t, Options{})
	names, clients := iamResources(t, tg.addr)
	for i, name := range names {
		ic, kind := clients[i], strings.Split(name, "/")[2]
		t.Run(kind, func(t *testing.T) {
			p, err := ic.GetIamPolicy(ctx, &iampb.GetIamPolicyRequest{Resource: name})
			if err != nil || len(p.Bindings) != 0 || string(p.Etag) != string(emptyPolicyEtag) {
				t.Fatalf("policy of a new %s: %v, %v; want no bindings, etag ACAB", kind, p, err)
			}
			want := &iampb.Policy{Bindings: []*iampb.Binding{{Role: "roles/pubsub.viewer", Members: []string{"user:ada@example.com"}}}, Etag: p.Etag}
			set, err := ic.SetIamPolicy(ctx, &iampb.SetIamPolicyRequest{Resource: name, Policy: want})
			if err != nil {
				t.Fatal(err)
			}
			if len(set.Etag) == 0 || string(set.Etag) == string(p.Etag) || !proto.Equal(set.Bindings[0], want.Bindings[0]) {
				t.Fatalf("SetIamPolicy answered %v; want the bindings with a new etag", set)
			}
			got, err := ic.GetIamPolicy(ctx, &iampb.GetIamPolicyRequest{Resource: name})
			if err != nil || !proto.Equal(got, set) {
				t.Fatalf("GetIamPolicy after set: %v, %v; want %v", got, err, set)
			}
			// A read-modify-write from the old read lost the race.
			if _, err := ic.SetIamPolicy(ctx, &iampb.SetIamPolicyRequest{Resource: name, Policy: want}); status.Code(err) != codes.Aborted {
				t.Errorf("SetIamPolicy with a stale etag: %v; want Aborted", err)
			}
			perms := []string{"pubsub." + kind + ".get", "pubsub." + kind + ".setIamPolicy", "pubsub.topics.publish", "storage.buckets.get", "pubsub." + kind + ".nonsense"}
			r, err := ic.TestIamPermissions(ctx, &iampb.TestIamPermissionsRequest{Resource: name, Permissions: perms})
			if err != nil {
				t.Fatal(err)
			}
			wantPerms := perms[:2]
			if kind == "topics" {
				wantPerms = perms[:3]
			}
			if !slices.Equal(r.Permissions, wantPerms) {
				t.Errorf("TestIamPermissions(%v) = %v; want %v", perms, r.Permissions, wantPerms)
			}
			if _, err := ic.TestIamPermissions(ctx, &iampb.TestIamPermissionsRequest{Resource: name, Permissions: []string{"pubsub.*"}}); status.Code(err) != codes.InvalidArgument {
				t.Errorf("TestIamPermissions with a wildcard: %v; want InvalidArgument", err)
			}
			missing := name + "-missing"
			for _, err := range []error{
				second(ic.GetIamPolicy(ctx, &iampb.GetIamPolicyRequest{Resource: missing})),
				second(ic.SetIamPolicy(ctx, &iampb.SetIamPolicyRequest{Resource: missing, Policy: want})),
			} {
				if status.Code(err) != codes.NotFound || !strings.Contains(err.Error(), "not found") {
					t.Errorf("IAM call on a missing %s: %v; want NotFound", kind, err)
				}
			}
			// "If the resource does not exist, this will return an empty set
			// of permissions, not a NOT_FOUND error."
			if r, err := ic.TestIamPermissions(ctx, &iampb.TestIamPermissionsRequest{Resource: missing, Permissions: perms}); err != nil || len(r.Permissions) != 0 {
				t.Errorf("TestIamPermissions on a missing %s: %v, %v; want no permissions", kind, r, err)
			}
		})
	}

	// A resource deleted and created again under the same name has no policy.
	c := newClient(t, tg.addr)
	topic := names[0]
	if err := c.TopicAdminClient.DeleteTopic(ctx, &pb.DeleteTopicRequest{Topic: topic}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.TopicAdminClient.CreateTopic(ctx, &pb.Topic{Name: topic}); err != nil {
		t.Fatal(err)
	}
	if p, err := c.TopicAdminClient.GetIamPolicy(ctx, &iampb.GetIamPolicyRequest{Resource: topic}); err != nil || len(p.Bindings) != 0 {
		t.Errorf("policy of a topic created again: %v, %v; want none", p, err)
	}
}

func second[T any](_ T, err error) error { return err }

// TestIAMEmulator records what Google's emulator answers to the IAM calls
// the broker serves: it does not implement the service.
func TestIAMEmulator(t *testing.T) {
	ctx := context.Background()
	c := newClient(t, emulator(t).addr)
	topic := createTopic(t, c)
	_, err := c.TopicAdminClient.GetIamPolicy(ctx, &iampb.GetIamPolicyRequest{Resource: topic})
	if status.Code(err) != codes.Unimplemented {
		t.Errorf("emulator's GetIamPolicy: %v; want Unimplemented (the broker's TestIAMPolicies assumes no reference)", err)
	}
	_, err = c.TopicAdminClient.TestIamPermissions(ctx, &iampb.TestIamPermissionsRequest{Resource: topic, Permissions: []string{"pubsub.topics.get"}})
	t.Logf("emulator: GetIamPolicy and TestIamPermissions answer %v", err)
}

// TestIAMREST reads, sets and tests a policy through the REST routes of
// each resource kind (GET …:getIamPolicy, as Pub/Sub's REST API reads it,
// which used to fall through to GetTopic), beside Google's emulator's
// answer to the same GET.
func TestIAMREST(t *testing.T) {
	tg := startOurs(t, Options{})
	names, _ := iamResources(t, tg.addr)
	base := "http://" + tg.addr + "/v1/"
	for _, name := range names {
		kind := strings.Split(name, "/")[2]
		code, v := rest(t, "GET", base+name+":getIamPolicy", "")
		if code != 200 || v["etag"] != "ACAB" {
			t.Fatalf("GET %s:getIamPolicy: %d %v; want 200 with etag ACAB", name, code, v)
		}
		code, v = rest(t, "POST", base+name+":setIamPolicy", `{"policy":{"bindings":[{"role":"roles/pubsub.subscriber","members":["serviceAccount:app@p.iam.gserviceaccount.com"]}],"etag":"ACAB"}}`)
		if code != 200 || v["etag"] == "ACAB" || v["bindings"] == nil {
			t.Fatalf("POST %s:setIamPolicy: %d %v", name, code, v)
		}
		if code, again := rest(t, "GET", base+name+":getIamPolicy", ""); code != 200 || again["etag"] != v["etag"] {
			t.Errorf("GET %s:getIamPolicy after set: %d %v; want etag %v", name, code, again, v["etag"])
		}
		if code, v := rest(t, "POST", base+name+":setIamPolicy", `{"policy":{"etag":"ACAB"}}`); code != 409 || v["error"].(map[string]any)["status"] != "ABORTED" {
			t.Errorf("POST %s:setIamPolicy with a stale etag: %d %v; want 409 ABORTED", name, code, v)
		}
		code, v = rest(t, "POST", base+name+":testIamPermissions", `{"permissions":["pubsub.`+kind+`.get","pubsub.nothing.get"]}`)
		if perms, _ := v["permissions"].([]any); code != 200 || len(perms) != 1 || perms[0] != "pubsub."+kind+".get" {
			t.Errorf("POST %s:testIamPermissions: %d %v", name, code, v)
		}
		if code, v := rest(t, "GET", base+name+"-missing:getIamPolicy", ""); code != 404 {
			t.Errorf("GET getIamPolicy of a missing %s: %d %v; want 404", kind, code, v)
		}
	}

	t.Run("emulator", func(t *testing.T) {
		emu := "http://" + testenv.EmulatorHost(t) + "/v1/projects/" + project + "/topics/"
		topic := unique("rest-iam")
		if code, v := rest(t, "PUT", emu+topic, `{}`); code != 200 {
			t.Fatalf("create topic: %d %v", code, v)
		}
		code, v := rest(t, "GET", emu+topic+":getIamPolicy", "")
		t.Logf("GET topics/T:getIamPolicy answers %d %v", code, v)
	})
}

// TestIAMGcloud reads and changes a topic's policy with gcloud, which
// reads it with GET …:getIamPolicy and writes it back with the etag it
// read. (Against Google's emulator every one of these commands fails with
// HTTP 501 UNIMPLEMENTED; TestIAMREST records that without gcloud's
// seconds per command.)
func TestIAMGcloud(t *testing.T) {
	t.Parallel()
	gcloud := testenv.Tool(t, "gcloud")
	ours := startOurs(t, Options{})
	policy := filepath.Join(t.TempDir(), "policy.json")
	if err := os.WriteFile(policy, []byte(`{"bindings":[{"role":"roles/pubsub.subscriber","members":["group:ops@example.com"]},{"role":"roles/pubsub.viewer","members":["user:ada@example.com"]}]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	script := [][]string{
		{"topics", "create", "iam-topic"},
		{"topics", "add-iam-policy-binding", "iam-topic", "--member", "user:ada@example.com", "--role", "roles/pubsub.publisher", "--format", "json(bindings)"},
		{"topics", "set-iam-policy", "iam-topic", policy, "--format", "json(bindings)"},
		{"topics", "remove-iam-policy-binding", "iam-topic", "--member", "group:ops@example.com", "--role", "roles/pubsub.subscriber", "--format", "json(bindings)"},
		{"topics", "get-iam-policy", "missing-topic"},
	}
	got := runGcloud(t, gcloud, ours.addr, unique("gcloud"), script)
	steps := strings.Split(got, "$ gcloud pubsub ")[1:]
	wants := []struct{ has, lacks string }{
		{has: "Created topic"},
		{has: `"roles/pubsub.publisher"`},
		{has: `"group:ops@example.com"`, lacks: `"roles/pubsub.publisher"`},
		{has: `"roles/pubsub.viewer"`, lacks: `"group:ops`},
		{has: "NOT_FOUND"},
	}
	if len(steps) != len(wants) {
		t.Fatalf("gcloud transcript has %d steps, want %d:\n%s", len(steps), len(wants), got)
	}
	for i, w := range wants {
		if !strings.Contains(steps[i], w.has) || w.lacks != "" && strings.Contains(steps[i], w.lacks) || strings.Contains(steps[i], "(failed)") != (i == 4) {
			t.Errorf("gcloud step %d: want %q, without %q:\n%s", i+1, w.has, w.lacks, steps[i])
		}
	}
}
