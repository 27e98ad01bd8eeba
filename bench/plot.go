package main

import (
	"fmt"
	"image/color"
	"math"
	"os"
	"path/filepath"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
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
		"redis":    "Redis: claims of new keys",
	}
	for _, s := range sectionNames {
		rows := e.sectionRows(s)
		if len(rows) == 0 {
			continue
		}
		var p *plot.Plot
		var err error
		if s == "pipeline" {
			p, err = e.linePlot(rows)
		} else {
			p, err = barPlot(rows)
		}
		if err != nil {
			return fmt.Errorf("plot %s: %w", s, err)
		}
		p.Title.Text = titles[s] + "\n" + e.machine.short()
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
		if _, ok := pts[r.name]; !ok {
			names = append(names, r.name)
		}
		pts[r.name] = append(pts[r.name], plotter.XY{X: pct, Y: r.median()})
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
	p.Y.Min = 0
	p.Add(plotter.NewGrid())
	return p, nil
}

// barPlot draws grouped bars: one group per row group, one bar colour per
// contender, each labelled with its median (a value too small to see, such
// as pstest's, still shows its number).
func barPlot(rows []row) (*plot.Plot, error) {
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
	w := vg.Points(math.Min(40, 300/float64(len(names)*len(groups))))
	for i, n := range names {
		vals := make(plotter.Values, len(groups))
		for gi, g := range groups {
			for _, r := range rows {
				if r.name == n && r.group == g && len(r.values) > 0 {
					vals[gi] = r.median()
				}
			}
		}
		b, err := plotter.NewBarChart(vals, w)
		if err != nil {
			return nil, err
		}
		b.Color = plotutil.Color(i)
		b.LineStyle.Width = 0
		b.Offset = w * vg.Length(float64(i)-float64(len(names)-1)/2)
		p.Add(b)
		p.Legend.Add(n, b)
		xy := make(plotter.XYs, len(groups))
		labels := make([]string, len(groups))
		for gi := range groups {
			xy[gi] = plotter.XY{X: float64(gi), Y: vals[gi]}
			if vals[gi] > 0 {
				labels[gi] = num(vals[gi])
			}
		}
		l, err := plotter.NewLabels(plotter.XYLabels{XYs: xy, Labels: labels})
		if err != nil {
			return nil, err
		}
		for j := range l.TextStyle {
			l.TextStyle[j].Color = color.Black
			l.TextStyle[j].XAlign = -0.5
			l.Offset.X = b.Offset
			l.TextStyle[j].Font.Size = vg.Points(8)
		}
		p.Add(l)
	}
	p.NominalX(groups...)
	p.Legend.Top = true
	p.Y.Min = 0
	p.Y.Max *= 1.25 // room above the bars for the legend and labels (Add set Max)
	p.Add(plotter.NewGrid())
	if strings.HasPrefix(unit, "B/") {
		p.Legend.Left = true
	}
	return p, nil
}
