package testenv

import (
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// DedupflowCommand is the import path of the dedupflow binary.
const DedupflowCommand = "github.com/dedupflow/dedupflow/cmd/dedupflow"

// builds holds the binaries a test process built, once per package and
// mode, since tests run in parallel and each link takes seconds.
var builds struct {
	sync.Mutex
	dir string
	bin map[string]string
}

// Build builds the command pkg (an import path) with -race when race is set,
// once per test process; tests share the file and must not change it. With
// race as the test binary was built, the packages it compiled are reused; a
// binary a test kills is built without it. The package's TestMain calls
// RemoveBuilds.
func Build(t testing.TB, pkg string, race bool) string {
	t.Helper()
	builds.Lock()
	defer builds.Unlock()
	key, args := pkg, []string{"build"}
	if race {
		key += " -race"
		args = append(args, "-race")
	}
	if bin, ok := builds.bin[key]; ok {
		return bin
	}
	if builds.dir == "" {
		dir, err := os.MkdirTemp("", "dedupflow-test-bin-")
		if err != nil {
			t.Fatal(err)
		}
		builds.dir, builds.bin = dir, map[string]string{}
	}
	// Built in the package's own folder, so its module's go.mod resolves
	// its imports whichever module the test belongs to; each build in a
	// folder of its own, so the binary keeps its name (a README command
	// calls it so).
	src, err := exec.Command("go", "list", "-e", "-f", "{{.Dir}}", pkg).Output()
	if err != nil || len(src) == 0 {
		t.Fatalf("go list %s: %v", pkg, err)
	}
	out := filepath.Join(builds.dir, strconv.Itoa(len(builds.bin)))
	if err := os.Mkdir(out, 0o755); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(out, path.Base(pkg))
	build := exec.Command("go", append(args, "-o", bin, ".")...)
	build.Dir = strings.TrimSpace(string(src))
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build %s: %v\n%s", pkg, err, out)
	}
	builds.bin[key] = bin
	return bin
}

// RemoveBuilds removes what Build built; a TestMain calls it after m.Run.
func RemoveBuilds() {
	builds.Lock()
	defer builds.Unlock()
	if builds.dir != "" {
		os.RemoveAll(builds.dir)
		builds.dir, builds.bin = "", nil
	}
}
