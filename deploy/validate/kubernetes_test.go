package validate

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	k8syaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"
)

// manifests are the example's objects, decoded strictly by kind.
type manifests struct {
	deployments []*appsv1.Deployment
	services    []*corev1.Service
	accounts    []*corev1.ServiceAccount
	pdbs        []*policyv1.PodDisruptionBudget
}

// load decodes every document of every file in dir into its API type; an
// unknown field, a duplicate field, a wrong type or an unknown kind fails.
func load(t *testing.T, dir string) *manifests {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no manifests in %s: %v", dir, err)
	}
	var m manifests
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		r := k8syaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(b)))
		for {
			doc, err := r.Read()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatalf("%s: %v", f, err)
			}
			if len(bytes.TrimSpace(doc)) == 0 {
				continue
			}
			var tm metav1.TypeMeta
			if err := yaml.Unmarshal(doc, &tm); err != nil {
				t.Fatalf("%s: %v", f, err)
			}
			var obj any
			switch tm.APIVersion + " " + tm.Kind {
			case "apps/v1 Deployment":
				d := new(appsv1.Deployment)
				m.deployments, obj = append(m.deployments, d), d
			case "v1 Service":
				s := new(corev1.Service)
				m.services, obj = append(m.services, s), s
			case "v1 ServiceAccount":
				a := new(corev1.ServiceAccount)
				m.accounts, obj = append(m.accounts, a), a
			case "policy/v1 PodDisruptionBudget":
				p := new(policyv1.PodDisruptionBudget)
				m.pdbs, obj = append(m.pdbs, p), p
			default:
				t.Fatalf("%s: %s %s is not a kind this test knows; add it", f, tm.APIVersion, tm.Kind)
			}
			if err := yaml.UnmarshalStrict(doc, obj); err != nil {
				t.Errorf("%s: %s: %v", f, tm.Kind, err)
			}
		}
	}
	return &m
}

// Strict decoding catches what a schema-less apply would let through.
func TestStrictDecodeRejectsMisspelledFields(t *testing.T) {
	for _, doc := range []string{
		"apiVersion: apps/v1\nkind: Deployment\nspec:\n  replica: 3\n",
		"apiVersion: apps/v1\nkind: Deployment\nspec:\n  template:\n    spec:\n      terminationGracePeriod: 60\n",
		"apiVersion: apps/v1\nkind: Deployment\nspec:\n  replicas: three\n",
	} {
		if err := yaml.UnmarshalStrict([]byte(doc), new(appsv1.Deployment)); err == nil {
			t.Errorf("decoded without error:\n%s", doc)
		}
	}
}

// The example is what docs/deploy.md promises: N pipeline replicas sharing the
// Redis store, probes on the metrics port's /readyz and /healthz, a grace
// period longer than the drain's bound, requests, a disruption budget, a
// scrape annotation, and the Workload Identity service account.
func TestKubernetesExample(t *testing.T) {
	m := load(t, "../kubernetes")
	pipe := find(t, m.deployments, "dedupflow")
	redis := find(t, m.deployments, "dedupflow-redis")
	spec := pipe.Spec.Template.Spec

	if r := pipe.Spec.Replicas; r == nil || *r < 2 {
		t.Errorf("pipeline replicas %v, want at least 2 (replicas on one subscription)", r)
	}
	sel, err := metav1.LabelSelectorAsSelector(pipe.Spec.Selector)
	if err != nil || !sel.Matches(labels.Set(pipe.Spec.Template.Labels)) {
		t.Errorf("the Deployment's selector %v does not select its own pods (%v): %v", pipe.Spec.Selector, pipe.Spec.Template.Labels, err)
	}
	if len(spec.Containers) != 1 {
		t.Fatalf("%d containers, want the pipeline alone", len(spec.Containers))
	}
	c := spec.Containers[0]
	if len(c.Args) == 0 || c.Args[0] != "pipeline" {
		t.Errorf("args %q, want the pipeline command (the image's entrypoint is dedupflow)", c.Args)
	}
	env := map[string]string{}
	for _, e := range c.Env {
		env[e.Name] = e.Value
	}
	state := env["DEDUPFLOW_STATE"]
	if !strings.HasPrefix(state, "redis://") {
		t.Errorf("DEDUPFLOW_STATE %q, want the shared Redis store", state)
	}
	redisSvc := find(t, m.services, "dedupflow-redis")
	if host := strings.Split(strings.TrimPrefix(state, "redis://"), ":")[0]; host != redisSvc.Name {
		t.Errorf("DEDUPFLOW_STATE names host %q, the Redis service is %q", host, redisSvc.Name)
	}
	if sel := labels.SelectorFromSet(redisSvc.Spec.Selector); !sel.Matches(labels.Set(redis.Spec.Template.Labels)) || sel.Matches(labels.Set(pipe.Spec.Template.Labels)) {
		t.Errorf("the Redis service's selector %v must select the Redis pods and not the pipeline's", redisSvc.Spec.Selector)
	}
	for _, name := range []string{"DEDUPFLOW_PROJECT", "DEDUPFLOW_INPUT_SUBSCRIPTION", "DEDUPFLOW_OUTPUT_TOPIC", "DEDUPFLOW_ID_ATTRIBUTE"} {
		if env[name] == "" {
			t.Errorf("%s is not set", name)
		}
	}

	port := metricsPort(t, c)
	if i := slices.Index(c.Args, "--metrics-addr"); i < 0 || i+1 == len(c.Args) || c.Args[i+1] != "0.0.0.0:"+strconv.Itoa(int(port.ContainerPort)) {
		t.Errorf("args %q: want --metrics-addr 0.0.0.0:%d (the default listens on loopback, out of the kubelet's reach)", c.Args, port.ContainerPort)
	}
	probe := func(what string, p *corev1.Probe, path string) {
		if p == nil || p.HTTPGet == nil {
			t.Errorf("%s probe: want an HTTP GET of %s", what, path)
			return
		}
		if p.HTTPGet.Path != path || !samePort(p.HTTPGet.Port, port) {
			t.Errorf("%s probe GETs %s on port %s, want %s on the metrics port", what, p.HTTPGet.Path, p.HTTPGet.Port.String(), path)
		}
	}
	probe("readiness", c.ReadinessProbe, "/readyz")
	probe("liveness", c.LivenessProbe, "/healthz")

	// A drain is bounded by one sink write (half the 30 s claim lease) and
	// the commit retries after it (the other half); it measured well under
	// a second (docs/deploy.md). The grace period must cover the bound.
	if g := spec.TerminationGracePeriodSeconds; g == nil || *g <= 30 {
		t.Errorf("terminationGracePeriodSeconds %v, want more than the 30 s a drain can take", g)
	}
	req := c.Resources.Requests
	if req.Cpu().IsZero() || req.Memory().IsZero() {
		t.Errorf("requests %v, want CPU and memory", req)
	}
	if lim := c.Resources.Limits.Memory(); lim.Cmp(*req.Memory()) < 0 {
		t.Errorf("memory limit %v below the request %v", lim, req.Memory())
	}

	ann := pipe.Spec.Template.Annotations
	if ann["prometheus.io/scrape"] != "true" || ann["prometheus.io/port"] != strconv.Itoa(int(port.ContainerPort)) || ann["prometheus.io/path"] != "/metrics" {
		t.Errorf("pod annotations %v: want prometheus.io/scrape true on the metrics port's /metrics", ann)
	}

	// The image's user (Dockerfile: USER 65532:65532).
	sc := spec.SecurityContext
	if sc == nil || sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot || sc.RunAsUser == nil || *sc.RunAsUser != 65532 {
		t.Errorf("pod securityContext %+v: want runAsNonRoot and runAsUser 65532, the image's user", sc)
	}
	if csc := c.SecurityContext; csc == nil || csc.ReadOnlyRootFilesystem == nil || !*csc.ReadOnlyRootFilesystem {
		t.Error("the pipeline writes no files with the Redis store: want readOnlyRootFilesystem")
	}

	sa := find(t, m.accounts, spec.ServiceAccountName)
	if !strings.HasSuffix(sa.Annotations["iam.gke.io/gcp-service-account"], ".iam.gserviceaccount.com") {
		t.Errorf("service account %s: want the Workload Identity annotation iam.gke.io/gcp-service-account", sa.Name)
	}

	if len(m.pdbs) != 1 {
		t.Fatalf("%d PodDisruptionBudgets, want 1", len(m.pdbs))
	}
	pdb := m.pdbs[0]
	psel, err := metav1.LabelSelectorAsSelector(pdb.Spec.Selector)
	if err != nil || !psel.Matches(labels.Set(pipe.Spec.Template.Labels)) || psel.Matches(labels.Set(redis.Spec.Template.Labels)) {
		t.Errorf("the PodDisruptionBudget's selector %v must select the pipeline's pods only: %v", pdb.Spec.Selector, err)
	}
	if mu := pdb.Spec.MaxUnavailable; mu == nil || mu.IntValue() < 1 || mu.IntValue() >= int(*pipe.Spec.Replicas) {
		t.Errorf("maxUnavailable %v: want at least 1 and fewer than the %d replicas", mu, *pipe.Spec.Replicas)
	}
}

func metricsPort(t *testing.T, c corev1.Container) corev1.ContainerPort {
	t.Helper()
	for _, p := range c.Ports {
		if p.Name == "metrics" {
			return p
		}
	}
	t.Fatalf("container %s has no port named metrics", c.Name)
	return corev1.ContainerPort{}
}

func samePort(p intstr.IntOrString, port corev1.ContainerPort) bool {
	if p.Type == intstr.String {
		return p.StrVal == port.Name
	}
	return p.IntVal == port.ContainerPort
}

type named interface{ GetName() string }

func find[T named](t *testing.T, objs []T, name string) T {
	t.Helper()
	for _, o := range objs {
		if o.GetName() == name {
			return o
		}
	}
	t.Fatalf("no %T named %q", *new(T), name)
	return *new(T)
}
