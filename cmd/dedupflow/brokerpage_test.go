package main

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"regexp"
	"strings"
	"testing"

	"github.com/dedupflow/dedupflow/internal/testenv"
)

var reBrokerPage = regexp.MustCompile(`# broker page: (http://\S+)`)

func getPage(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		t.Fatalf("GET %s: %d %s", url, resp.StatusCode, b)
	}
	return string(b)
}

// TestBrokerConsoleFlag: `dedupflow broker --console` serves the broker
// page, which shows the broker's topics; without the flag there is none.
func TestBrokerConsoleFlag(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	out, errs := &testenv.Buffer{}, &testenv.Buffer{}
	done, exited := make(chan error, 1), make(chan struct{})
	go func() {
		done <- runBroker(ctx, []string{"--listen", "127.0.0.1:0", "--console", "127.0.0.1:0", "--project", "p", "--topic", "orders"}, out, errs)
		close(exited)
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("broker: %v", err)
		}
	})
	url := waitFor(t, "broker page URL", out, errs, reBrokerPage, exited)
	if body := getPage(t, url); !strings.Contains(body, "<title>dedupflow broker</title>") {
		t.Fatalf("broker page:\n%s", body)
	}
	var state struct{ Topics []struct{ Name string } }
	if err := json.Unmarshal([]byte(getPage(t, strings.TrimSuffix(url, "/broker")+"/broker/api/state")), &state); err != nil ||
		len(state.Topics) != 1 || state.Topics[0].Name != "projects/p/topics/orders" {
		t.Fatalf("state: %+v %v", state, err)
	}
}

// TestUpBrokerPage: the console of `dedupflow up` links to and serves the
// broker page.
func TestUpBrokerPage(t *testing.T) {
	up := startUp(t)
	if !strings.Contains(getPage(t, up.consoleURL), `href="/broker"`) {
		t.Fatal("the console does not link to /broker")
	}
	if body := getPage(t, up.consoleURL+"/broker/api/state"); !strings.Contains(body, "topicToDataflow") {
		t.Fatalf("broker page state lacks the tutorial's topics:\n%s", body)
	}
}
