package main

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/dedupflow/dedupflow/broker"
)

// brokerCollector reports each subscription's delivery state when scraped,
// under the names of what Cloud Monitoring shows for the service
// (num_undelivered_messages, oldest_unacked_message_age, dead-letter counts,
// open_streaming_pulls, sent_message_count).
type brokerCollector struct{ b *broker.Broker }

var (
	brokerBacklog = prometheus.NewDesc("dedupflow_broker_undelivered_messages",
		"Messages of the subscription waiting to be delivered or redelivered.", []string{"subscription"}, nil)
	brokerUnacked = prometheus.NewDesc("dedupflow_broker_unacked_messages",
		"Messages of the subscription delivered and not yet acknowledged.", []string{"subscription"}, nil)
	brokerOldest = prometheus.NewDesc("dedupflow_broker_oldest_unacked_message_age_seconds",
		"Age of the oldest message the subscription still has to get acknowledged; 0 when it holds none.", []string{"subscription"}, nil)
	brokerDeadLettered = prometheus.NewDesc("dedupflow_broker_dead_lettered_messages_total",
		"Messages the subscription moved to its dead-letter topic since the broker started.", []string{"subscription"}, nil)
	brokerStreams = prometheus.NewDesc("dedupflow_broker_open_streaming_pulls",
		"StreamingPull streams open on the subscription.", []string{"subscription"}, nil)
	// Export subscriptions: sent_message_count is Cloud Monitoring's name
	// (its delivery_type label says bigquery or cloud_storage); the others
	// have no counterpart there, which shows the state in the subscription.
	brokerExportSent = prometheus.NewDesc("dedupflow_broker_export_sent_messages_total",
		"Messages a BigQuery or Cloud Storage subscription wrote (and acknowledged) since the broker started.", []string{"subscription", "delivery_type"}, nil)
	brokerExportBytes = prometheus.NewDesc("dedupflow_broker_export_sent_bytes_total",
		"Message bytes a BigQuery or Cloud Storage subscription wrote since the broker started.", []string{"subscription", "delivery_type"}, nil)
	brokerExportBatches = prometheus.NewDesc("dedupflow_broker_export_writes_total",
		"Objects a Cloud Storage subscription wrote, or appends a BigQuery subscription made, since the broker started.", []string{"subscription", "delivery_type"}, nil)
	brokerExportFailed = prometheus.NewDesc("dedupflow_broker_export_failed_messages_total",
		"Messages the destination refused (left unacknowledged, or dead-lettered) since the broker started.", []string{"subscription", "delivery_type"}, nil)
	brokerExportErrors = prometheus.NewDesc("dedupflow_broker_export_errors_total",
		"Writes that failed as a whole (their messages kept and written again) since the broker started.", []string{"subscription", "delivery_type"}, nil)
	brokerExportState = prometheus.NewDesc("dedupflow_broker_export_state",
		"1 for the export subscription's state (ACTIVE, NOT_FOUND, PERMISSION_DENIED, SCHEMA_MISMATCH).", []string{"subscription", "delivery_type", "state"}, nil)
	brokerTransformFiltered = prometheus.NewDesc("dedupflow_broker_transform_filtered_messages_total",
		"Messages a topic's or subscription's message transform filtered out (returned null) since the broker started.", []string{"resource", "function", "index"}, nil)
	brokerTransformFailed = prometheus.NewDesc("dedupflow_broker_transform_failed_messages_total",
		"Messages a topic's or subscription's message transform failed (threw, ran too long, returned no message) since the broker started.", []string{"resource", "function", "index"}, nil)
)

func (brokerCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{brokerBacklog, brokerUnacked, brokerOldest, brokerDeadLettered, brokerStreams, brokerTransformFiltered, brokerTransformFailed,
		brokerExportSent, brokerExportBytes, brokerExportBatches, brokerExportFailed, brokerExportErrors, brokerExportState} {
		ch <- d
	}
}

func (c brokerCollector) Collect(ch chan<- prometheus.Metric) {
	for _, t := range c.b.Overview() {
		collectTransforms(ch, t.Name, t.Transforms)
		for _, s := range t.Subscriptions {
			collectTransforms(ch, s.Name, s.Transforms)
			ch <- prometheus.MustNewConstMetric(brokerBacklog, prometheus.GaugeValue, float64(s.Backlog), s.Name)
			ch <- prometheus.MustNewConstMetric(brokerUnacked, prometheus.GaugeValue, float64(s.Unacked), s.Name)
			ch <- prometheus.MustNewConstMetric(brokerOldest, prometheus.GaugeValue, s.OldestUnacked.Seconds(), s.Name)
			ch <- prometheus.MustNewConstMetric(brokerDeadLettered, prometheus.CounterValue, float64(s.DeadLettered), s.Name)
			ch <- prometheus.MustNewConstMetric(brokerStreams, prometheus.GaugeValue, float64(s.Streams), s.Name)
			if e := s.Export; e != nil {
				for d, v := range map[*prometheus.Desc]int64{brokerExportSent: e.Messages, brokerExportBytes: e.Bytes,
					brokerExportBatches: e.Batches, brokerExportFailed: e.Failed, brokerExportErrors: e.Errors} {
					ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), s.Name, e.Kind)
				}
				ch <- prometheus.MustNewConstMetric(brokerExportState, prometheus.GaugeValue, 1, s.Name, e.Kind, e.State)
			}
		}
	}
}

func collectTransforms(ch chan<- prometheus.Metric, resource string, ts []broker.TransformStats) {
	for i, t := range ts {
		ix := strconv.Itoa(i)
		ch <- prometheus.MustNewConstMetric(brokerTransformFiltered, prometheus.CounterValue, float64(t.Filtered), resource, t.Function, ix)
		ch <- prometheus.MustNewConstMetric(brokerTransformFailed, prometheus.CounterValue, float64(t.Failed), resource, t.Function, ix)
	}
}
