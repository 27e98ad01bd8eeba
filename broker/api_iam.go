package broker

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"slices"
	"strings"

	"cloud.google.com/go/iam/apiv1/iampb"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// IAM policies, as google.iam.v1.IAMPolicy serves them for topics,
// subscriptions, snapshots and schemas: stored per resource, durably, with
// etags, and deleted with their resource. They are stored, not enforced:
// the broker has no callers' identities to check them against.

// emptyPolicyEtag is the etag the service gives a resource that never had a
// policy ("ACAB" in JSON).
var emptyPolicyEtag = []byte{0, 0x20, 0x01}

// pubsubPermissions are the permissions each resource kind has, as the
// service's IAM documentation lists them.
var pubsubPermissions = map[string][]string{
	"topics": {"pubsub.topics.attachSubscription", "pubsub.topics.delete", "pubsub.topics.detachSubscription",
		"pubsub.topics.get", "pubsub.topics.getIamPolicy", "pubsub.topics.publish", "pubsub.topics.setIamPolicy",
		"pubsub.topics.update", "pubsub.topics.updateTag"},
	"subscriptions": {"pubsub.subscriptions.consume", "pubsub.subscriptions.delete", "pubsub.subscriptions.get",
		"pubsub.subscriptions.getIamPolicy", "pubsub.subscriptions.setIamPolicy", "pubsub.subscriptions.update"},
	"snapshots": {"pubsub.snapshots.delete", "pubsub.snapshots.get", "pubsub.snapshots.getIamPolicy",
		"pubsub.snapshots.seek", "pubsub.snapshots.setIamPolicy", "pubsub.snapshots.update"},
	"schemas": {"pubsub.schemas.attach", "pubsub.schemas.commit", "pubsub.schemas.delete", "pubsub.schemas.get",
		"pubsub.schemas.getIamPolicy", "pubsub.schemas.listRevisions", "pubsub.schemas.rollback",
		"pubsub.schemas.setIamPolicy", "pubsub.schemas.validate"},
}

type iamServer struct {
	iampb.UnimplementedIAMPolicyServer
	b *Broker
}

// resourceLocked checks that resource names a live topic, subscription,
// snapshot or schema, with the NotFound its own Get answers, and returns
// its kind.
func (srv *iamServer) resourceLocked(resource string) (string, error) {
	b := srv.b
	parts := strings.Split(resource, "/")
	if len(parts) != 4 || parts[0] != "projects" {
		return "", status.Errorf(codes.InvalidArgument, "invalid resource name %q: want projects/PROJECT/{topics,subscriptions,snapshots,schemas}/ID", resource)
	}
	var err error
	switch kind := parts[2]; kind {
	case "topics":
		_, err = b.pub.topic(resource)
	case "subscriptions":
		_, err = b.sub.subscription(resource)
	case "snapshots":
		_, err = b.sub.snapshot(resource)
	case "schemas":
		_, _, err = b.schemaLocked(resource)
	default:
		err = status.Errorf(codes.InvalidArgument, "invalid resource name %q: IAM policies are kept for topics, subscriptions, snapshots and schemas", resource)
	}
	return parts[2], err
}

func (srv *iamServer) GetIamPolicy(ctx context.Context, req *iampb.GetIamPolicyRequest) (*iampb.Policy, error) {
	b := srv.b
	b.mu.Lock()
	defer b.mu.Unlock()
	if _, err := srv.resourceLocked(req.Resource); err != nil {
		return nil, err
	}
	return b.policyLocked(req.Resource), nil
}

func (b *Broker) policyLocked(resource string) *iampb.Policy {
	if p := b.policies[resource]; p != nil {
		return proto.Clone(p).(*iampb.Policy)
	}
	return &iampb.Policy{Etag: emptyPolicyEtag}
}

// SetIamPolicy replaces the policy. An etag in the request must be the
// stored one (a read-modify-write that lost a race is refused with
// Aborted, as the service does); the stored policy gets a new etag.
func (srv *iamServer) SetIamPolicy(ctx context.Context, req *iampb.SetIamPolicyRequest) (*iampb.Policy, error) {
	b := srv.b
	var out *iampb.Policy
	err := b.change(ctx, func() error {
		if _, err := srv.resourceLocked(req.Resource); err != nil {
			return err
		}
		if req.Policy == nil {
			return status.Error(codes.InvalidArgument, "policy is required")
		}
		old := b.policyLocked(req.Resource)
		if len(req.Policy.Etag) > 0 && !bytes.Equal(req.Policy.Etag, old.Etag) {
			return status.Error(codes.Aborted, "There were concurrent policy changes. Please retry the whole read-modify-write with exponential backoff.")
		}
		for _, bd := range req.Policy.Bindings {
			if !strings.HasPrefix(bd.Role, "roles/") {
				return status.Errorf(codes.InvalidArgument, "role %q must start with roles/", bd.Role)
			}
			if len(bd.Members) == 0 {
				return status.Errorf(codes.InvalidArgument, "the binding of role %s has no members", bd.Role)
			}
		}
		p := proto.Clone(req.Policy).(*iampb.Policy)
		p.Etag = nextEtag(old.Etag, p)
		if p.Version == 0 {
			p.Version = 1
		}
		b.putPolicyLocked(req.Resource, p)
		out = proto.Clone(p).(*iampb.Policy)
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// nextEtag derives a policy's etag from the one it replaces and its
// contents, so that every change gets a new one and a restart keeps it.
func nextEtag(prev []byte, p *iampb.Policy) []byte {
	h := sha256.New()
	h.Write(binary.AppendUvarint(nil, uint64(len(prev))))
	h.Write(prev)
	h.Write(appendProto(nil, &iampb.Policy{Bindings: p.Bindings, AuditConfigs: p.AuditConfigs, Version: p.Version}))
	return h.Sum(nil)[:8]
}

// TestIamPermissions answers, of the permissions asked, those that exist
// for the resource's kind: policies are not enforced, so every caller may
// do everything there is to do. For a missing resource it answers none,
// not NotFound, as the API documents.
func (srv *iamServer) TestIamPermissions(ctx context.Context, req *iampb.TestIamPermissionsRequest) (*iampb.TestIamPermissionsResponse, error) {
	b := srv.b
	b.mu.Lock()
	kind, err := srv.resourceLocked(req.Resource)
	b.mu.Unlock()
	out := &iampb.TestIamPermissionsResponse{}
	if status.Code(err) == codes.NotFound {
		return out, nil
	}
	if err != nil {
		return nil, err
	}
	for _, p := range req.Permissions {
		if strings.Contains(p, "*") {
			return nil, status.Errorf(codes.InvalidArgument, "permissions with wildcards (such as '*' or 'pubsub.*') are not allowed: %s", p)
		}
		if slices.Contains(pubsubPermissions[kind], p) && !slices.Contains(out.Permissions, p) {
			out.Permissions = append(out.Permissions, p)
		}
	}
	return out, nil
}

func (b *Broker) putPolicyLocked(resource string, p *iampb.Policy) {
	if b.policies == nil {
		b.policies = map[string]*iampb.Policy{}
	}
	b.policies[resource] = p
	b.logRecord(recPolicy, func(d []byte) []byte { return appendPolicy(d, resource, p) })
}

// dropPolicyLocked forgets the policy of a deleted resource; replaying the
// deletion drops it again, so it needs no record of its own.
func (b *Broker) dropPolicyLocked(resource string) {
	delete(b.policies, resource)
}
