package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
)

// saved is a run's measurements as JSON (--save), so that the report and
// the plots can be drawn again (--load) without measuring again.
type saved struct {
	Machine      machineJSON `json:"machine"`
	LoadBefore   string      `json:"load_before"`
	LoadAfter    string      `json:"load_after"`
	Date         string      `json:"date"`
	BentoVersion string      `json:"bento_version,omitempty"`
	BentoPath    string      `json:"bento_path,omitempty"`
	Args         []string    `json:"args"`
	Runs         int         `json:"runs"`
	Rows         []rowJSON   `json:"rows"`
	Absent       []string    `json:"absent,omitempty"`
	Failures     []string    `json:"failures,omitempty"`
	// Earlier are the runs whose rows this report kept (rows' From).
	Earlier []earlier `json:"earlier,omitempty"`
}

type machineJSON struct {
	CPU   string `json:"cpu"`
	Cores int    `json:"cores"`
	Go    string `json:"go"`
}

type rowJSON struct {
	Section string    `json:"section"`
	Group   string    `json:"group"`
	Name    string    `json:"name"`
	Ours    bool      `json:"ours,omitempty"`
	Peer    string    `json:"peer,omitempty"`
	Count   string    `json:"count"`
	Unit    string    `json:"unit"`
	Values  []float64 `json:"values"`
	Fixed   string    `json:"fixed,omitempty"`
	Note    string    `json:"note,omitempty"`
	From    int       `json:"from,omitempty"`
}

func (e *env) save(path string) error {
	s := saved{Machine: machineJSON{e.machine.cpu, e.machine.cores, e.machine.goVer}, LoadBefore: e.loadBefore,
		LoadAfter: e.loadAfter, Date: e.date, BentoVersion: e.bentoVersion, BentoPath: e.cfg.bento, Args: benchArgs(e.cfg), Runs: e.cfg.runs,
		Absent: e.absent, Failures: e.failures, Earlier: e.earlier}
	if e.savedArgs != nil {
		s.Args = e.savedArgs
	}
	for _, r := range e.rows {
		s.Rows = append(s.Rows, rowJSON{r.section, r.group, r.name, r.ours, r.peer, r.count, r.unit, r.values, r.fixed, r.note, r.from})
	}
	b, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return fmt.Errorf("encode results: %w", err)
	}
	// The plots' folder, where results.json goes, is made when the plots
	// are drawn, after this.
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("save results: %w", err)
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		return fmt.Errorf("save results: %w", err)
	}
	e.logf("saved results to %s", path)
	return nil
}

// load replaces the env's measurements with saved ones.
func (e *env) load(path string) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("load results: %w", err)
	}
	var s saved
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("decode results %s: %w", path, err)
	}
	e.machine = machine{cpu: s.Machine.CPU, cores: s.Machine.Cores, goVer: s.Machine.Go}
	e.loadBefore, e.loadAfter, e.date, e.bentoVersion = s.LoadBefore, s.LoadAfter, s.Date, s.BentoVersion
	e.absent, e.failures, e.cfg.runs, e.savedArgs = s.Absent, s.Failures, s.Runs, s.Args
	if s.BentoPath != "" {
		e.cfg.bento = s.BentoPath
	}
	e.rows, e.earlier = nil, s.Earlier
	for _, r := range s.Rows {
		e.rows = append(e.rows, row{r.Section, r.Group, r.Name, r.Ours, r.Peer, r.Count, r.Unit, r.Values, r.Fixed, r.Note, r.From})
	}
	return nil
}
