package broker

import (
	"fmt"
	"regexp"
	"strings"
	"time"

	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
)

// The Cloud Storage subscription's limits, as CloudStorageConfig documents
// them.
const (
	storageMinDuration     = time.Minute
	storageMaxDuration     = 10 * time.Minute
	storageDefaultDuration = 5 * time.Minute
	storageMinBytes        = 1000
	storageMaxBytes        = 10 << 30
	storageMinMessages     = 1000
	// storageDatetimeFormat names objects when filename_datetime_format is
	// empty.
	storageDatetimeFormat = "YYYY-MM-DDThh:mm:ssZ"
)

// checkExportConfig validates the export settings of a subscription (a
// BigQuery or Cloud Storage destination) and fills in the service's
// defaults. A subscription delivers one way: pull, push, or one export.
func checkExportConfig(s *pb.Subscription) error {
	if s.BigtableConfig != nil {
		return status.Error(codes.Unimplemented, "Bigtable subscriptions are not supported by this broker")
	}
	ways := 0
	for _, set := range []bool{s.PushConfig.GetPushEndpoint() != "", s.BigqueryConfig != nil, s.CloudStorageConfig != nil} {
		if set {
			ways++
		}
	}
	if ways > 1 {
		return status.Error(codes.InvalidArgument, "a subscription has at most one of push_config.push_endpoint, bigquery_config and cloud_storage_config")
	}
	if c := s.CloudStorageConfig; c != nil {
		return checkStorageConfig(c, time.Duration(s.AckDeadlineSeconds)*time.Second)
	}
	if c := s.BigqueryConfig; c != nil {
		return checkBigQueryConfig(c)
	}
	return nil
}

// bucketName is the service's bucket naming rule, without the dotted
// (domain) form's finer points: 3 to 63 characters of lowercase letters,
// digits, '-', '_' and '.', starting and ending with a letter or digit.
var bucketName = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{1,61}[a-z0-9]$`)

func checkStorageConfig(c *pb.CloudStorageConfig, ackDeadline time.Duration) error {
	bad := func(format string, args ...any) error {
		return status.Errorf(codes.InvalidArgument, "cloud_storage_config: "+format, args...)
	}
	switch {
	case c.Bucket == "":
		return bad("bucket is required")
	case strings.HasPrefix(c.Bucket, "gs://"):
		return bad("bucket %q: give the bucket's name without gs://", c.Bucket)
	case !bucketName.MatchString(c.Bucket):
		return bad("bucket %q is not a valid bucket name: 3 to 63 lowercase letters, digits, '-', '_' and '.', starting and ending with a letter or digit", c.Bucket)
	}
	for field, v := range map[string]string{"filename_prefix": c.FilenamePrefix, "filename_suffix": c.FilenameSuffix} {
		if strings.ContainsAny(v, "\r\n") || strings.Contains(v, "#") || strings.Contains(v, "[") || strings.Contains(v, "]") ||
			strings.Contains(v, "*") || strings.Contains(v, "?") {
			return bad("%s %q has a character object names must not have (\\r, \\n, #, [, ], * or ?)", field, v)
		}
	}
	if strings.HasSuffix(c.FilenameSuffix, "/") {
		return bad("filename_suffix %q must not end in /", c.FilenameSuffix)
	}
	if strings.HasPrefix(c.FilenamePrefix, ".well-known/acme-challenge/") {
		return bad("filename_prefix %q: object names must not start with .well-known/acme-challenge/", c.FilenamePrefix)
	}
	if c.FilenameDatetimeFormat != "" {
		if _, err := parseDatetimeFormat(c.FilenameDatetimeFormat); err != nil {
			return bad("filename_datetime_format %q: %v", c.FilenameDatetimeFormat, err)
		}
	}
	if c.MaxDuration == nil {
		c.MaxDuration = durationpb.New(min(storageDefaultDuration, max(ackDeadline, storageMinDuration)))
	}
	if d := c.MaxDuration.AsDuration(); d < storageMinDuration || d > storageMaxDuration {
		return bad("max_duration is %v, it must be between %v and %v", d, storageMinDuration, storageMaxDuration)
	} else if d > max(ackDeadline, storageMinDuration) {
		return bad("max_duration (%v) must not exceed the subscription's ack deadline (%v)", d, ackDeadline)
	}
	if c.MaxBytes != 0 && (c.MaxBytes < storageMinBytes || c.MaxBytes > storageMaxBytes) {
		return bad("max_bytes is %d, it must be between %d (1 KB) and %d (10 GiB)", c.MaxBytes, storageMinBytes, int64(storageMaxBytes))
	}
	if c.MaxMessages != 0 && c.MaxMessages < storageMinMessages {
		return bad("max_messages is %d, it must be at least %d", c.MaxMessages, storageMinMessages)
	}
	if c.OutputFormat == nil {
		c.OutputFormat = &pb.CloudStorageConfig_TextConfig_{TextConfig: &pb.CloudStorageConfig_TextConfig{}}
	}
	c.State = pb.CloudStorageConfig_ACTIVE // until the exporter finds otherwise
	return nil
}

// datetimeMatchers are the matchers of filename_datetime_format, each with
// the part of a UTC time it stands for.
var datetimeMatchers = []struct {
	matcher string
	part    func(t time.Time) string
}{
	{"YYYY", func(t time.Time) string { return fmt.Sprintf("%04d", t.Year()) }},
	{"MM", func(t time.Time) string { return fmt.Sprintf("%02d", int(t.Month())) }},
	{"DD", func(t time.Time) string { return fmt.Sprintf("%02d", t.Day()) }},
	{"hh", func(t time.Time) string { return fmt.Sprintf("%02d", t.Hour()) }},
	{"mm", func(t time.Time) string { return fmt.Sprintf("%02d", t.Minute()) }},
	{"ss", func(t time.Time) string { return fmt.Sprintf("%02d", t.Second()) }},
}

// datetimeFormat writes a time as a filename_datetime_format says: each
// piece is a matcher's part of the time or a literal separator.
type datetimeFormat []func(t time.Time) string

func (f datetimeFormat) format(t time.Time) string {
	var b strings.Builder
	for _, part := range f {
		b.WriteString(part(t.UTC()))
	}
	return b.String()
}

// parseDatetimeFormat reads a filename_datetime_format: the matchers YYYY,
// MM, DD, hh, mm and ss, each at most once, the separators - _ : and /, and
// T and Z.
func parseDatetimeFormat(f string) (datetimeFormat, error) {
	var out datetimeFormat
	seen := map[string]bool{}
next:
	for f != "" {
		for _, m := range datetimeMatchers {
			if strings.HasPrefix(f, m.matcher) {
				if seen[m.matcher] {
					return nil, fmt.Errorf("%s appears twice", m.matcher)
				}
				seen[m.matcher] = true
				out = append(out, m.part)
				f = f[len(m.matcher):]
				continue next
			}
		}
		switch c := f[:1]; c {
		case "-", "_", ":", "/", "T", "Z":
			out = append(out, func(time.Time) string { return c })
			f = f[1:]
		default:
			return nil, fmt.Errorf("unexpected %q: use the matchers YYYY, MM, DD, hh, mm and ss, the separators - _ : and /, and T and Z", f)
		}
	}
	if len(seen) == 0 {
		return nil, fmt.Errorf("no date or time matcher (YYYY, MM, DD, hh, mm, ss)")
	}
	return out, nil
}
