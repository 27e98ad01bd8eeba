package main

import (
	"context"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/dedupflow/dedupflow/internal/metricpage"
	"github.com/jackc/pgx/v5"
	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
)

// metrics is one scrape of a /metrics page: series (name, or name{l="v",…}
// with labels in the page's order) -> value.
type metrics map[string]float64

func (m metrics) value(series string) float64 { return m[series] }

// scrapeClient reads /metrics pages over at most one connection to each
// process: the broker's goroutine count, checked against its level, takes
// one goroutine per open connection, so two scrapes that overlap must not
// leave a second connection open.
func scrapeClient() *http.Client {
	return &http.Client{Transport: &http.Transport{MaxConnsPerHost: 1}}
}

// scrape reads a Prometheus text page into series -> value.
func (s *soak) scrape(ctx context.Context, url string) (metrics, error) {
	fams, err := metricpage.Families(ctx, s.web, url)
	if err != nil {
		return nil, err
	}
	out := metrics{}
	for _, f := range fams {
		for _, s := range f.GetMetric() {
			key := f.GetName()
			if len(s.GetLabel()) > 0 {
				var ls []string
				for _, l := range s.GetLabel() {
					ls = append(ls, l.GetName()+`="`+l.GetValue()+`"`)
				}
				key += "{" + strings.Join(ls, ",") + "}"
			}
			switch {
			case s.GetGauge() != nil:
				out[key] = s.GetGauge().GetValue()
			case s.GetCounter() != nil:
				out[key] = s.GetCounter().GetValue()
			case s.GetUntyped() != nil:
				out[key] = s.GetUntyped().GetValue()
			}
		}
	}
	return out, nil
}

// The pipeline's counters the soak adds up over its runs.
var soakCounters = []string{"dedupflow_received_total", `dedupflow_messages_total{outcome="emitted"}`,
	`dedupflow_messages_total{outcome="duplicate_redelivery"}`, `dedupflow_messages_total{outcome="duplicate_republish"}`}

// sampleLoop reads both processes' resident memory and goroutines, and
// the running pipeline's counters, every plan.sample.
func (s *soak) sampleLoop(ctx context.Context) error {
	tick := time.NewTicker(s.plan.sample)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
		bm, err := s.scrape(ctx, s.brokerURL)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("the broker: %w", err)
		}
		s.mu.Lock()
		run, n := s.run, s.runs
		s.mu.Unlock()
		smp := soakSample{at: time.Since(s.start), brokerRSS: bm.value("process_resident_memory_bytes"), brokerG: bm.value("go_goroutines")}
		s.mu.Lock()
		s.streams = max(s.streams, bm.value(s.streamsSeries()))
		s.mu.Unlock()
		if run != nil {
			// A run that is starting or was just killed does not answer.
			if pm, err := s.scrape(ctx, "http://"+s.pipeAddr+"/metrics"); err == nil {
				smp.run, smp.pipeRSS, smp.pipeG = n, pm.value("process_resident_memory_bytes"), pm.value("go_goroutines")
				last := map[string]float64{}
				for _, c := range soakCounters {
					last[c] = pm.value(c)
				}
				s.mu.Lock()
				if s.run == run {
					s.last = last
				}
				s.mu.Unlock()
			}
		}
		s.mu.Lock()
		s.samples = append(s.samples, smp)
		s.mu.Unlock()
	}
}

// verify checks that the table holds exactly the workload's keys.
func (s *soak) verify(ctx context.Context) (rows int, err error) {
	seen := make([]bool, s.plan.keys)
	var foreign []string
	r, err := s.db.Query(ctx, "SELECT key FROM "+pgx.Identifier{s.table}.Sanitize())
	if err != nil {
		return 0, fmt.Errorf("read the sink's rows: %w", err)
	}
	defer r.Close()
	for r.Next() {
		var k string
		if err := r.Scan(&k); err != nil {
			return rows, fmt.Errorf("read the sink's rows: %w", err)
		}
		rows++
		e, ok := strings.CutPrefix(k, s.wl.keyPrefix+"-")
		i, err := strconv.Atoi(e)
		if !ok || err != nil || i < 0 || i >= len(seen) || seen[i] {
			foreign = append(foreign, k)
			continue
		}
		seen[i] = true
	}
	if err := r.Err(); err != nil {
		return rows, fmt.Errorf("read the sink's rows: %w", err)
	}
	var missing []string
	for i, ok := range seen {
		if !ok {
			missing = append(missing, s.wl.key(i))
		}
	}
	if len(missing) > 0 || len(foreign) > 0 {
		return rows, &correctnessError{fmt.Sprintf("the sink holds %d rows for %d keys: %d keys missing %v, %d rows not of a published key %v",
			rows, s.plan.keys, len(missing), firstFew(missing), len(foreign), firstFew(foreign))}
	}
	return rows, nil
}

// report checks the end state and adds the soak's rows.
func (s *soak) report() error {
	e := s.e
	took := time.Since(s.start)
	rows, err := s.verify(context.Background())
	if err != nil {
		e.fail(fmt.Errorf("soak: %w", err))
	}
	var terms, kills int
	var settles, firsts []float64
	for _, r := range s.restarts {
		if r.signal == "SIGKILL" {
			kills++
		} else {
			terms++
		}
		settles = append(settles, r.settle.Seconds())
		if r.firstMsg > 0 {
			firsts = append(firsts, r.firstMsg.Seconds())
		}
	}
	var peakB, peakP float64
	perRun := map[int][]float64{}
	for _, m := range s.samples {
		peakB, peakP = max(peakB, m.brokerRSS), max(peakP, m.pipeRSS)
		if m.run > 0 {
			perRun[m.run] = append(perRun[m.run], m.pipeG)
		}
	}
	var runG []float64
	for _, g := range perRun {
		runG = append(runG, row{values: g}.median())
	}
	slices.Sort(runG)
	in := s.totals["dedupflow_received_total"]
	redel := s.totals[`dedupflow_messages_total{outcome="duplicate_redelivery"}`]
	repub := s.totals[`dedupflow_messages_total{outcome="duplicate_republish"}`]
	e.logf("soak: %d rows for %d keys; %d published; the pipeline counted %.0f received, %.0f redeliveries, %.0f republishes (a killed run's last second is not counted); %d seeks; %d SIGTERM, %d SIGKILL in %v",
		rows, s.plan.keys, s.published.Load(), in, redel, repub, s.seeks.Load(), terms, kills, took.Round(time.Second))
	if terms == 0 || kills == 0 {
		e.fail(fmt.Errorf("soak: %d SIGTERM and %d SIGKILL restarts: the run was too short to restart the pipeline both ways", terms, kills))
	}
	if s.streams == 0 {
		// Else the check that a run's streams are let go of proves nothing.
		e.fail(fmt.Errorf("soak: the broker never showed a stream open on %s while the pipeline ran", s.name("subscriptions", soakSub)))
	}
	if redel == 0 || repub == 0 {
		e.fail(fmt.Errorf("soak: the pipeline counted %.0f redeliveries and %.0f republishes: the workload did not reach it as planned", redel, repub))
	}
	for _, b := range []struct {
		what        string
		peak, bound float64
	}{{"the broker", peakB, soakBrokerRSS}, {"a pipeline run", peakP, soakPipelineRSS}} {
		if b.peak > b.bound {
			e.fail(fmt.Errorf("soak: %s reached %s MiB of resident memory, over its bound of %s MiB", b.what, num(b.peak/(1<<20)), num(b.bound/(1<<20))))
		}
	}
	group := fmt.Sprintf("%s keys, 30%% copies", inum(s.plan.keys))
	count := fmt.Sprintf("%s messages published over %v; %s redeliveries counted; %d SIGTERM + %d SIGKILL restarts in %v",
		inum(int(s.published.Load())), s.plan.publishFor, inum(int(redel)), terms, kills, took.Round(time.Second))
	add := func(name, unit string, v float64, note string) {
		e.add(row{section: "soak", group: group, name: name, ours: true, count: count, unit: unit, values: []float64{v}, note: note})
	}
	add(nameSoakLag, "s", s.drained.Sub(s.lastPub).Seconds(), fmt.Sprintf("%s msg/s published, %s msg/s received over the soak",
		num(float64(s.published.Load())/s.plan.publishFor.Seconds()), num(in/took.Seconds())))
	add(nameSoakBroker, "MiB", peakB/(1<<20), fmt.Sprintf("peak; bound %s MiB", inum(soakBrokerRSS>>20)))
	add(nameSoakPipe, "MiB", peakP/(1<<20), fmt.Sprintf("peak over %d runs; bound %s MiB", len(perRun), inum(soakPipelineRSS>>20)))
	add("broker goroutines back at their level after a pipeline ended", "s", slices.Max(append(settles, 0)),
		fmt.Sprintf("worst of %d; median %s s; the level: %.0f, before any pipeline connected", len(settles), num(row{values: settles}.median()), s.baseline))
	if len(runG) > 0 {
		add("pipeline goroutines, median of a run", "goroutines", row{values: runG}.median(),
			fmt.Sprintf("%s to %s across %d runs", num(runG[0]), num(runG[len(runG)-1]), len(runG)))
	}
	if len(firsts) > 0 {
		add("pipeline restart to its first message", "s", row{values: firsts}.median(),
			fmt.Sprintf("median of %d; worst %s s", len(firsts), num(slices.Max(firsts))))
	}
	e.soakSamples, e.soakRestarts = s.samples, s.restarts
	return nil
}

// Names of the soak's rows the plot and docs/stores.md refer to.
const (
	nameSoakLag    = "dedupflow pipeline, disk store → PostgreSQL: the last publish to every key in the table"
	nameSoakBroker = "dedupflow broker --data-dir (the longest-lived process), resident memory"
	nameSoakPipe   = "dedupflow pipeline, resident memory of a run"
)

// soakPlot draws resident memory over the soak: the broker's line, one
// line per pipeline run, and a mark at each restart.
func (e *env) soakPlot(path, title string) error {
	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text = "minutes since the soak began"
	p.Y.Label.Text = "resident memory (MiB)"
	p.Add(plotter.NewGrid())
	p.Legend.Top, p.Legend.Left = true, true
	var broker plotter.XYs
	runs := map[int]plotter.XYs{}
	for _, m := range e.soakSamples {
		x := m.at.Minutes()
		broker = append(broker, plotter.XY{X: x, Y: m.brokerRSS / (1 << 20)})
		if m.run > 0 {
			runs[m.run] = append(runs[m.run], plotter.XY{X: x, Y: m.pipeRSS / (1 << 20)})
		}
	}
	bl, err := plotter.NewLine(broker)
	if err != nil {
		return err
	}
	bl.Color = plotutil.Color(0)
	p.Add(bl)
	p.Legend.Add("dedupflow broker --data-dir", bl)
	for i, n := range slices.Sorted(maps.Keys(runs)) {
		if len(runs[n]) < 2 {
			continue
		}
		l, err := plotter.NewLine(runs[n])
		if err != nil {
			return err
		}
		l.Color = plotutil.Color(1)
		p.Add(l)
		if i == 0 {
			p.Legend.Add("dedupflow pipeline (one line per run)", l)
		}
	}
	for ci, sig := range []string{"SIGTERM", "SIGKILL"} {
		var pts plotter.XYs
		for _, r := range e.soakRestarts {
			if r.signal == sig {
				pts = append(pts, plotter.XY{X: r.at.Minutes(), Y: 0})
			}
		}
		if len(pts) == 0 {
			continue
		}
		sc, err := plotter.NewScatter(pts)
		if err != nil {
			return err
		}
		sc.Color = plotutil.Color(2 + ci)
		sc.Shape = draw.TriangleGlyph{}
		sc.Radius = vg.Points(4)
		p.Add(sc)
		p.Legend.Add(sig, sc)
	}
	p.Y.Min = 0
	p.Y.Max *= 1.3 // room for the legend
	return p.Save(22*vg.Centimeter, 12*vg.Centimeter, path)
}
