// Package metricpage reads a Prometheus /metrics page, for the commands and
// the bench that watch a running dedupflow process.
package metricpage

import (
	"context"
	"fmt"
	"net/http"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Families reads the metric families the page at url serves through c,
// giving up after 10 s.
func Families(ctx context.Context, c *http.Client, url string) ([]*dto.MetricFamily, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", string(expfmt.NewFormat(expfmt.TypeTextPlain)))
	resp, err := c.Do(req)
	if err != nil {
		return nil, fmt.Errorf("scrape %s: %w", url, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("scrape %s: %s", url, resp.Status)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("scrape %s: not Prometheus text: %w", url, err)
	}
	out := make([]*dto.MetricFamily, 0, len(fams))
	for _, f := range fams {
		out = append(out, f)
	}
	return out, nil
}
