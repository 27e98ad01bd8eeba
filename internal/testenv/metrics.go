package testenv

import (
	"bufio"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Get is the body of a GET of url, failing t unless it answers 200.
func Get(t testing.TB, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	if resp.StatusCode != 200 {
		t.Fatalf("GET %s: %d %s", url, resp.StatusCode, b)
	}
	return string(b)
}

// Scrape reads the /metrics page under base into name{labels} -> value, the
// series as the exposition text spells them, so a test names a series the
// way a user reads it on the page.
func Scrape(base string) (map[string]float64, error) {
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			continue
		}
		if v, err := strconv.ParseFloat(line[i+1:], 64); err == nil {
			out[line[:i]] = v
		}
	}
	return out, sc.Err()
}

// WaitMetrics polls base's /metrics until every series in want has its
// value, and returns that scrape.
func WaitMetrics(t testing.TB, base string, want map[string]float64) map[string]float64 {
	t.Helper()
	var last map[string]float64
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		var err error
		if last, err = Scrape(base); err != nil {
			t.Fatal(err)
		}
		ok := true
		for series, v := range want {
			got, found := last[series]
			ok = ok && found && got == v
		}
		if ok {
			return last
		}
	}
	t.Fatalf("metrics never reached %v; last: %v", want, last)
	return nil
}

// Readyz is the status code of base's /readyz, 0 when it does not answer
// within 2 s.
func Readyz(base string) int {
	c := http.Client{Timeout: 2 * time.Second}
	resp, err := c.Get(base + "/readyz")
	if err != nil {
		return 0
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}
