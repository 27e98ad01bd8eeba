package pull

import "github.com/prometheus/client_golang/prometheus"

var (
	streamsDesc = prometheus.NewDesc("dedupflow_streams_opened_total",
		"StreamingPull streams the receiver opened, reconnects included: a rate above zero after the start means streams keep failing.", nil, nil)
	invalidDesc = prometheus.NewDesc("dedupflow_invalid_acks_total",
		"Acks an exactly-once subscription refused as invalid (their lease had expired): those messages come back and are then counted as redeliveries.", nil, nil)
)

// Collector exports the counters an operator watches the receive path by,
// read from Stats when scraped.
func (r *Receiver) Collector() prometheus.Collector { return collector{r} }

type collector struct{ r *Receiver }

func (collector) Describe(ch chan<- *prometheus.Desc) {
	ch <- streamsDesc
	ch <- invalidDesc
}

func (c collector) Collect(ch chan<- prometheus.Metric) {
	st := c.r.Stats()
	ch <- prometheus.MustNewConstMetric(streamsDesc, prometheus.CounterValue, float64(st.Streams))
	ch <- prometheus.MustNewConstMetric(invalidDesc, prometheus.CounterValue, float64(st.InvalidAcks))
}
