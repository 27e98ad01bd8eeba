package deploy

import (
	"encoding/json"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strings"
	"testing"

	"github.com/dedupflow/dedupflow/internal/testenv"
)

// image is the container image's configuration and its files, mounted.
type image struct {
	root       string // the mounted root filesystem
	user       string // USER, as uid:gid
	entrypoint []string
	env        []string
	workdir    string
}

// mountImage mounts the image's root filesystem through a buildah working
// container, removed when the test ends.
func mountImage(t testing.TB, name string) *image {
	t.Helper()
	out, err := exec.Command("buildah", "inspect", "--type", "image", name).Output()
	if err != nil {
		t.Fatalf("buildah inspect %s: %v", name, stderrOf(err))
	}
	var info struct {
		OCIv1 struct {
			Config struct {
				User       string
				Entrypoint []string
				Env        []string
				WorkingDir string
			} `json:"config"`
		}
	}
	if err := json.Unmarshal(out, &info); err != nil {
		t.Fatalf("buildah inspect %s: %v", name, err)
	}
	ctr := run(t, "buildah", "from", "--pull-never", name)
	t.Cleanup(func() { _ = exec.Command("buildah", "rm", ctr).Run() })
	root := run(t, "buildah", "mount", ctr)
	c := info.OCIv1.Config
	return &image{root: root, user: c.User, entrypoint: c.Entrypoint, env: c.Env, workdir: c.WorkingDir}
}

// command runs the image's entrypoint with args the way a container runtime
// would, short of starting a container (crun cannot here): chrooted into the
// image's files, as the image's user, with the image's environment plus env.
// The entrypoint is looked up on the image's own PATH.
func (im *image) command(t testing.TB, env []string, args ...string) *exec.Cmd {
	t.Helper()
	if len(im.entrypoint) == 0 {
		t.Fatal("the image has no ENTRYPOINT")
	}
	bin := im.entrypoint[0]
	if !strings.Contains(bin, "/") {
		bin = im.lookPath(t, bin)
	}
	argv := append([]string{"--userspec=" + im.user, im.root, bin}, im.entrypoint[1:]...)
	c := exec.Command("chroot", append(argv, args...)...)
	c.Env = append(append([]string{}, im.env...), env...)
	return c
}

func (im *image) lookPath(t testing.TB, name string) string {
	t.Helper()
	for _, kv := range im.env {
		if dirs, ok := strings.CutPrefix(kv, "PATH="); ok {
			for _, d := range filepath.SplitList(dirs) {
				p := path.Join(d, name)
				if st, err := os.Stat(filepath.Join(im.root, p)); err == nil && st.Mode().IsRegular() && st.Mode()&0o111 != 0 {
					return p
				}
			}
		}
	}
	t.Fatalf("the image's PATH has no executable %q", name)
	return ""
}

// dedupflow makes commands of the binary under test: the container image's
// when scripts/test.sh built one (DEDUPFLOW_IMAGE), else one built from
// this tree.
func dedupflow(t testing.TB) func(env []string, args ...string) *exec.Cmd {
	t.Helper()
	if os.Getenv("DEDUPFLOW_IMAGE") != "" {
		im := mountImage(t, testenv.Image(t))
		return func(env []string, args ...string) *exec.Cmd { return im.command(t, env, args...) }
	}
	bin := filepath.Join(t.TempDir(), "dedupflow")
	build := exec.Command("go", "build", "-o", bin, "github.com/dedupflow/dedupflow/cmd/dedupflow")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return func(env []string, args ...string) *exec.Cmd {
		c := exec.Command(bin, args...)
		c.Env = append([]string{"PATH=/usr/bin:/bin", "HOME=" + t.TempDir()}, env...)
		return c
	}
}

// run runs a command and returns its trimmed standard output.
func run(t testing.TB, name string, args ...string) string {
	t.Helper()
	out, err := exec.Command(name, args...).Output()
	if err != nil {
		t.Fatalf("%s %s: %v", name, strings.Join(args, " "), stderrOf(err))
	}
	return strings.TrimSpace(string(out))
}

func stderrOf(err error) string {
	if ee, ok := err.(*exec.ExitError); ok {
		return err.Error() + ": " + strings.TrimSpace(string(ee.Stderr))
	}
	return err.Error()
}
