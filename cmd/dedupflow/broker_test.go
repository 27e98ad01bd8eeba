package main

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"strings"
	"testing"
)

// TestBrokerSharedFlags: broker reads its flags from DEDUPFLOW_* variables
// and takes --log-format and --log-level, as every other command does.
func TestBrokerSharedFlags(t *testing.T) {
	t.Setenv("DEDUPFLOW_LISTEN", "127.0.0.1:0")
	t.Setenv("DEDUPFLOW_LOG_LEVEL", "debug")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	outR, outW := io.Pipe()
	errR, errW := io.Pipe()
	done := make(chan error, 1)
	go func() {
		err := runBroker(ctx, []string{"--log-format=json"}, outW, errW)
		outW.Close()
		errW.Close()
		done <- err
	}()
	logs := make(chan string, 100)
	go func() {
		defer close(logs)
		sc := bufio.NewScanner(errR)
		for sc.Scan() {
			logs <- sc.Text()
		}
	}()
	line, err := bufio.NewReader(outR).ReadString('\n')
	if err != nil {
		t.Fatalf("read stdout: %v", err)
	}
	if !strings.HasPrefix(line, "export PUBSUB_EMULATOR_HOST=127.0.0.1:") || strings.HasSuffix(line, ":8085\n") {
		t.Fatalf("stdout %q: want the port DEDUPFLOW_LISTEN picked", line)
	}
	go io.Copy(io.Discard, outR)
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("broker: %v", err)
	}
	var listening bool
	for l := range logs {
		var rec map[string]any
		if err := json.Unmarshal([]byte(l), &rec); err != nil {
			t.Fatalf("log line %q is not JSON (--log-format json): %v", l, err)
		}
		if rec["msg"] == "broker listening" {
			listening = true
		}
	}
	if !listening {
		t.Fatal("no \"broker listening\" record in the JSON log")
	}
}
