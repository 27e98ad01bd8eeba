package main

import (
	"fmt"
	"image/color"
	"math"
	"os"
	"path/filepath"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/font"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// writePlots draws one PNG per section that has rows.
func (e *env) writePlots(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("make plot folder: %w", err)
	}
	titles := map[string]string{
		"broker":   "Broker: publish and streaming pull + ack (official Go client)",
		"pipeline": "Dedup throughput by share of republished copies",
		"memory":   "Memory per live key",
		"cpu":      "CPU per message in: dedupflow vs the relay floor",
		"unusable": "Unusable messages without a dead-letter topic: time until the good ones are out",
		"replicas": "Replicas on a 3-master Redis Cluster (2 cores: cost, not speedup)",
		"redis":    "Redis: claims of new keys",
		"soak":     "Soak: resident memory while the pipeline is stopped and killed on a schedule",
	}
	for _, st := range sectionsText {
		s := st.key
		rows := e.sectionRows(s)
		if len(rows) == 0 {
			continue
		}
		var p *plot.Plot
		var err error
		switch s {
		case "pipeline":
			p, err = e.linePlot(rows)
		case "soak":
			if len(e.soakSamples) == 0 {
				continue // kept rows of an earlier run: its plot stays
			}
			path := filepath.Join(dir, s+".png")
			if err := e.soakPlot(path, titles[s]+"\n"+e.plotMachine(rows)); err != nil {
				return fmt.Errorf("plot %s: %w", s, err)
			}
			e.logf("wrote %s", path)
			continue
		case "replicas":
			path := filepath.Join(dir, s+".png")
			if err := e.replicaPlot(rows, titles[s]+" — "+e.plotMachine(rows), path); err != nil {
				return fmt.Errorf("plot %s: %w", s, err)
			}
			e.logf("wrote %s", path)
			continue
		default:
			p, err = barPlot(sameUnit(rows))
		}
		if err != nil {
			return fmt.Errorf("plot %s: %w", s, err)
		}
		p.Title.Text = titles[s] + "\n" + e.plotMachine(rows)
		path := filepath.Join(dir, s+".png")
		if err := p.Save(22*vg.Centimeter, 12*vg.Centimeter, path); err != nil {
			return fmt.Errorf("save %s: %w", path, err)
		}
		e.logf("wrote %s", path)
	}
	return nil
}

// linePlot is throughput (median) against the copy share, one line per
// contender.
func (e *env) linePlot(rows []row) (*plot.Plot, error) {
	p := plot.New()
	p.X.Label.Text = "republished copies (% of events)"
	p.Y.Label.Text = "messages in per second (median)"
	p.Legend.Top = true
	p.Legend.Left = true
	p.Add(plotter.NewGrid())
	var names []string
	pts := map[string]plotter.XYs{}
	for _, r := range rows {
		if len(r.values) == 0 {
			continue
		}
		var pct float64
		if _, err := fmt.Sscanf(r.group, "%g%%", &pct); err != nil {
			continue
		}
		name := r.name
		if r.from > 0 {
			name += " (run " + runLetter(r.from) + ")" // rows of another run are another line
		}
		if _, ok := pts[name]; !ok {
			names = append(names, name)
		}
		pts[name] = append(pts[name], plotter.XY{X: pct, Y: r.median()})
	}
	for i, n := range names {
		l, s, err := plotter.NewLinePoints(pts[n])
		if err != nil {
			return nil, err
		}
		l.Color, s.Color = plotutil.Color(i), plotutil.Color(i)
		s.Shape = plotutil.Shape(i)
		s.Radius = vg.Points(4)
		p.Add(l, s)
		p.Legend.Add(n, l, s)
	}
	// Log scale: NATS's publish-side rate is an order of magnitude above
	// the consumers', which would flatten them on a linear axis. The top
	// is raised to leave the legend room above the lines.
	p.Y.Scale = plot.LogScale{}
	p.Y.Tick.Marker = readableTicks{plot.LogTicks{Prec: -1}}
	p.Y.Min /= 2
	p.Y.Max *= 30
	p.X.Min, p.X.Max = p.X.Min-3, p.X.Max+3
	return p, nil
}

// readableTicks labels ticks as the tables do (12,345 rather than 12345.00).
type readableTicks struct{ plot.Ticker }

func (t readableTicks) Ticks(min, max float64) []plot.Tick {
	ts := t.Ticker.Ticks(min, max)
	for i := range ts {
		if ts[i].Label != "" {
			ts[i].Label = num(ts[i].Value)
		}
	}
	return ts
}

// barPlot draws grouped bars: one group per row group, one colour per
// contender, the bars of a group centred on it, each labelled with its
// median (a bar too small to see, such as pstest's, still shows its number).
func barPlot(rows []row) (*plot.Plot, error) { return barPlotIn(rows, 400) }

// barPlotIn is barPlot with span points of bar width in all, for plots
// narrower than the default.
func barPlotIn(rows []row, span float64) (*plot.Plot, error) {
	p := plot.New()
	var groups, names []string
	for _, r := range rows {
		if len(r.values) == 0 {
			continue
		}
		if !contains(groups, r.group) {
			groups = append(groups, r.group)
		}
		if !contains(names, r.name) {
			names = append(names, r.name)
		}
	}
	if len(names) == 0 {
		return p, nil
	}
	unit := rows[0].unit
	p.Y.Label.Text = unit + " (median)"
	p.Y.Tick.Marker = readableTicks{plot.DefaultTicks{}}
	p.Add(plotter.NewGrid())
	w := vg.Points(math.Min(60, span/float64(len(names)*len(groups))))
	inLegend := map[string]bool{}
	for gi, g := range groups {
		var present []row
		for _, r := range rows {
			if r.group == g && len(r.values) > 0 {
				present = append(present, r)
			}
		}
		for j, r := range present {
			ci := indexOf(names, r.name)
			b, err := plotter.NewBarChart(plotter.Values{r.median()}, w)
			if err != nil {
				return nil, err
			}
			b.XMin = float64(gi)
			b.Color = plotutil.Color(ci)
			b.LineStyle.Width = 0
			b.Offset = w * vg.Length(float64(j)-float64(len(present)-1)/2)
			p.Add(b)
			if !inLegend[r.name] {
				inLegend[r.name] = true
				p.Legend.Add(r.name, b)
			}
			l, err := plotter.NewLabels(plotter.XYLabels{XYs: plotter.XYs{{X: float64(gi), Y: r.median()}}, Labels: []string{num(r.median())}})
			if err != nil {
				return nil, err
			}
			l.Offset.X = b.Offset - w/2
			l.TextStyle[0].Color = color.Black
			l.TextStyle[0].Font.Size = vg.Points(8)
			p.Add(l)
		}
	}
	p.NominalX(groups...)
	p.Legend.Top = true
	p.Y.Min = 0
	p.Y.Max *= 1.35 // room above the bars for the legend and labels (Add set Max)
	return p, nil
}

func indexOf(s []string, x string) int {
	for i, v := range s {
		if v == x {
			return i
		}
	}
	return -1
}

// replicaPlot draws the replica section as three panels side by side:
// throughput of all replicas, CPU per message (pipelines and Redis), and
// Redis commands and reads per message, each by replica count.
func (e *env) replicaPlot(rows []row, title, path string) error {
	panels := []struct {
		title string
		names []string
	}{
		{"messages in per second", []string{nameRepAll}},
		{"CPU per message in (µs)", []string{nameRepCPU, nameRepRedis}},
		{"Redis, per message in", []string{nameRepCmds, nameRepReads}},
	}
	var ps []*plot.Plot
	for _, pn := range panels {
		var sel []row
		for _, r := range rows {
			if contains(pn.names, r.name) {
				sel = append(sel, r)
			}
		}
		p, err := barPlotIn(sel, 150)
		if err != nil {
			return err
		}
		p.Title.Text = pn.title
		p.Y.Label.Text = ""
		p.Legend.TextStyle.Font.Size = vg.Points(8)
		ps = append(ps, p)
	}
	const w, h = 30 * vg.Centimeter, 12 * vg.Centimeter
	img := vgimg.New(w, h)
	dc := draw.New(img)
	dc.FillText(draw.TextStyle{Color: color.Black, Font: font.From(plot.DefaultFont, vg.Points(12)),
		Handler: plot.DefaultTextHandler, XAlign: draw.XCenter, YAlign: draw.YTop},
		vg.Point{X: w / 2, Y: h - vg.Millimeter}, title)
	tiles := draw.Tiles{Rows: 1, Cols: len(ps), PadTop: 8 * vg.Millimeter, PadX: 6 * vg.Millimeter,
		PadLeft: 2 * vg.Millimeter, PadRight: 2 * vg.Millimeter, PadBottom: 2 * vg.Millimeter}
	grid := [][]*plot.Plot{ps}
	cs := plot.Align(grid, tiles, dc)
	for j, p := range ps {
		p.Draw(cs[0][j])
	}
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("save %s: %w", path, err)
	}
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(f); err != nil {
		f.Close()
		return fmt.Errorf("save %s: %w", path, err)
	}
	return f.Close()
}

// plotMachine is the machine a plot's rows were measured on, and their run
// when the report holds rows of several.
func (e *env) plotMachine(rows []row) string {
	for _, r := range rows[1:] {
		if r.from != rows[0].from {
			return "rows of several runs: see the table's machine column"
		}
	}
	return e.machineOf(rows[0])
}

// sameUnit keeps the rows in the first row's unit: one axis cannot show
// both the broker's rates and its restart times.
func sameUnit(rows []row) []row {
	var out []row
	for _, r := range rows {
		if r.unit == rows[0].unit {
			out = append(out, r)
		}
	}
	return out
}
