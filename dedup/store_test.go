package dedup_test

import (
	"testing"

	"github.com/dedupflow/dedupflow/dedup"
)

func TestJudge(t *testing.T) {
	const now, tag = 100, 7
	cases := []struct {
		name string
		r    dedup.Record
		want dedup.Verdict
	}{
		{"absent", dedup.Record{}, dedup.Verdict{Status: dedup.Proceed}},
		{"expired commit", dedup.Record{Until: now, Tag: tag}, dedup.Verdict{Status: dedup.Proceed}},
		{"lapsed claim, taken over", dedup.Record{Until: now, Pending: true, Tag: 8}, dedup.Verdict{Status: dedup.Proceed, Retaken: true}},
		{"live claim of another", dedup.Record{Until: now + 1, Pending: true, Tag: 8}, dedup.Verdict{Status: dedup.InFlight}},
		{"live claim of the same message", dedup.Record{Until: now + 1, Pending: true, Tag: tag}, dedup.Verdict{Status: dedup.InFlight}},
		{"redelivery", dedup.Record{Until: now + 1, Tag: tag}, dedup.Verdict{Status: dedup.Duplicate, Kind: dedup.Redelivery}},
		{"republish", dedup.Record{Until: now + 1, Tag: 8}, dedup.Verdict{Status: dedup.Duplicate, Kind: dedup.Republish}},
	}
	for _, c := range cases {
		if got := dedup.Judge(c.r, now, tag); got != c.want {
			t.Errorf("%s: %+v, want %+v", c.name, got, c.want)
		}
	}
}
