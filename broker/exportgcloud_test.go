package broker

import (
	"strings"
	"testing"
	"time"

	"github.com/dedupflow/dedupflow/internal/testenv"
)

// TestGcloudExports creates, updates and reads Cloud Storage and BigQuery
// subscriptions with gcloud's own flags, and gets the broker's refusals of
// values the service refuses. No export server is configured, so both
// show the state NOT_FOUND once their exporters looked.
func TestGcloudExports(t *testing.T) {
	t.Parallel()
	gcloud := testenv.Tool(t, "gcloud")
	ours := startOurs(t, Options{Now: time.Now})
	out := runGcloud(t, gcloud, ours.addr, unique("gcloud"), [][]string{
		{"topics", "create", "gx-topic"},
		{"subscriptions", "create", "gx-gcs", "--topic", "gx-topic", "--ack-deadline", "60",
			"--cloud-storage-bucket", "gx-bucket", "--cloud-storage-file-prefix", "in/", "--cloud-storage-file-suffix", ".avro",
			"--cloud-storage-file-datetime-format", "YYYY/MM/DD", "--cloud-storage-max-bytes", "1000",
			"--cloud-storage-max-duration", "1m", "--cloud-storage-output-format", "avro", "--cloud-storage-write-metadata",
			"--format", "json(cloudStorageConfig)"},
		{"subscriptions", "update", "gx-gcs", "--cloud-storage-bucket", "gx-bucket", "--cloud-storage-max-duration", "2m"},
		{"subscriptions", "update", "gx-gcs", "--cloud-storage-bucket", "gx-bucket-2", "--cloud-storage-max-messages", "5000"},
		{"subscriptions", "describe", "gx-gcs", "--format", "json(cloudStorageConfig)"},
		{"subscriptions", "create", "gx-bq", "--topic", "gx-topic", "--bigquery-table", "PROJECT:ds.tbl",
			"--use-table-schema", "--write-metadata", "--drop-unknown-fields", "--format", "json(bigqueryConfig)"},
		{"subscriptions", "describe", "gx-bq", "--format", "value(bigqueryConfig.state)"},
		{"subscriptions", "create", "gx-bad", "--topic", "gx-topic", "--bigquery-table", "nodots"},
		{"subscriptions", "create", "gx-bad", "--topic", "gx-topic", "--cloud-storage-bucket", "gs://gx-bucket"},
	})
	for _, want := range []string{
		`"filenamePrefix": "in/"`, `"filenameDatetimeFormat": "YYYY/MM/DD"`, `"maxBytes": "1024000"`, `"maxDuration": "60s"`,
		`"writeMetadata": true`, `"state": "ACTIVE"`,
		"max_duration (2m0s) must not exceed the subscription's ack deadline (1m0s)",
		`"bucket": "gx-bucket-2"`, `"maxMessages": "5000"`, `"state": "NOT_FOUND"`,
		`"table": "PROJECT:ds.tbl"`, `"useTableSchema": true`, `"dropUnknownFields": true`,
		"$ gcloud pubsub subscriptions describe gx-bq --format value(bigqueryConfig.state)\nNOT_FOUND\n",
		`table "nodots": want {projectId}.{datasetId}.{tableId}`, "give the bucket's name without gs://",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("gcloud output lacks %q", want)
		}
	}
	if t.Failed() {
		t.Logf("gcloud printed:\n%s", out)
	}
}
