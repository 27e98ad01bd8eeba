package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// A partial run (--only) that writes the report keeps the rows of earlier
// runs that it did not measure again, so the report stays whole: every
// non-quick run that writes a report saves its rows, merged, beside the
// plots (results.json), and the next partial run starts from that file.
// Rows keep the run they came from; the report lists the runs and the
// machine column names each row's, and a ratio is only taken between rows
// of one run.

// earlier is the provenance of a run whose rows a report kept.
type earlier struct {
	Args         []string    `json:"args"`
	Date         string      `json:"date"`
	Machine      machineJSON `json:"machine"`
	LoadBefore   string      `json:"load_before"`
	LoadAfter    string      `json:"load_after"`
	Runs         int         `json:"runs"`
	BentoVersion string      `json:"bento_version,omitempty"`
	BentoPath    string      `json:"bento_path,omitempty"`
}

func (r earlier) machine() machine {
	return machine{cpu: r.Machine.CPU, cores: r.Machine.Cores, goVer: r.Machine.Go}
}

// resultsPath is where a report's rows are kept for the next partial run.
func (c config) resultsPath() string {
	if c.quick || c.out == "" || c.plots == "" {
		return ""
	}
	return filepath.Join(c.plots, "results.json")
}

// mergeEarlier reads the kept rows before a partial run. Absent file: the
// report has this run's rows only.
func (e *env) mergeEarlier() error {
	path := e.cfg.resultsPath()
	if path == "" || len(e.cfg.only) == 0 {
		return nil
	}
	if _, err := os.Stat(path); err != nil {
		return nil
	}
	var prev env
	if err := prev.load(path); err != nil {
		return err
	}
	e.earlier = append([]earlier{prev.current()}, prev.earlier...)
	for _, r := range prev.rows {
		r.from++
		e.kept = append(e.kept, r)
	}
	e.logf("keeping the rows of %s that this run does not measure again", path)
	return nil
}

// current is this run's provenance, as an earlier run for the next one.
func (e *env) current() earlier {
	args := e.savedArgs
	if args == nil {
		args = benchArgs(e.cfg)
	}
	return earlier{Args: args, Date: e.date, Machine: machineJSON{e.machine.cpu, e.machine.cores, e.machine.goVer},
		LoadBefore: e.loadBefore, LoadAfter: e.loadAfter, Runs: e.cfg.runs, BentoVersion: e.bentoVersion, BentoPath: e.cfg.bento}
}

// settle adds the kept rows that this run did not measure again to the
// report, and forgets the earlier runs none of them came from.
func (e *env) settle() {
	if len(e.kept) == 0 {
		return
	}
	measured := map[[3]string]bool{}
	for _, r := range e.rows {
		measured[[3]string{r.section, r.group, r.name}] = true
	}
	used := map[int]int{} // old earlier index (1-based) -> new
	var keep []row
	for _, r := range e.kept {
		if measured[[3]string{r.section, r.group, r.name}] {
			continue
		}
		keep = append(keep, r)
		used[r.from] = 0
	}
	var runs []earlier
	for i := range e.earlier {
		if _, ok := used[i+1]; ok {
			runs = append(runs, e.earlier[i])
			used[i+1] = len(runs)
		}
	}
	for i := range keep {
		keep[i].from = used[keep[i].from]
	}
	e.earlier, e.kept = runs, nil
	// Groups in the order the kept rows had them (they usually come from a
	// full run), new groups after; within a group, this run's rows first.
	var out []row
	for _, s := range sectionsText {
		var groups []string
		for _, rs := range [][]row{keep, e.rows} {
			for _, r := range rs {
				if r.section == s.key && !contains(groups, r.group) {
					groups = append(groups, r.group)
				}
			}
		}
		for _, g := range groups {
			for _, rs := range [][]row{e.rows, keep} {
				for _, r := range rs {
					if r.section == s.key && r.group == g {
						out = append(out, r)
					}
				}
			}
		}
	}
	e.rows = out
}

// machineOf names a row's machine, and its run in the machine column when the report
// holds more than one.
func (e *env) machineOf(r row) string {
	if r.from == 0 {
		if len(e.earlier) == 0 {
			return e.machine.short()
		}
		return e.machine.short() + ", this run"
	}
	return fmt.Sprintf("%s, run %s", e.earlier[r.from-1].machine().short(), runLetter(r.from))
}

func runLetter(i int) string { return string(rune('A' + i - 1)) }

// earlierText lists the runs whose rows the report kept.
func (e *env) earlierText() string {
	if len(e.earlier) == 0 {
		return ""
	}
	var b strings.Builder
	b.WriteString("**Rows kept from earlier runs** (this run did not measure them again; the machine column names each " +
		"row's run, and ratios are only taken between rows of one run):\n\n")
	for i, r := range e.earlier {
		fmt.Fprintf(&b, "- run %s: `go run ./bench %s` on %s; %s, %d cores, %s; load before `%s`, after `%s`",
			runLetter(i+1), strings.Join(r.Args, " "), r.Date, r.Machine.CPU, r.Machine.Cores, r.Machine.Go, r.LoadBefore, r.LoadAfter)
		if r.BentoVersion != "" {
			fmt.Fprintf(&b, "; Bento `%s` (%s)", r.BentoPath, r.BentoVersion)
		}
		b.WriteString("\n")
	}
	return b.String() + "\n"
}
