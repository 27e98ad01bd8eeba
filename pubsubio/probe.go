package pubsubio

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"strings"
	"time"
)

// checkAddr refuses an emulator address that is not host:port, at once:
// a URL there ("http://localhost:8085", as gcloud's endpoint override
// takes) would otherwise wait out the dial and then say "too many colons".
func checkAddr(host string) error {
	if scheme, rest, ok := strings.Cut(host, "://"); ok {
		return fmt.Errorf("%s=%s: drop %s://, it takes host:port (%s)", emulatorVar, host, scheme, strings.TrimSuffix(rest, "/"))
	}
	if _, _, err := net.SplitHostPort(host); err != nil {
		return fmt.Errorf("%s=%s: want host:port: %w", emulatorVar, host, err)
	}
	return nil
}

// clientPreface opens an HTTP/2 connection, as a gRPC client does: the
// client preface and an empty SETTINGS frame.
var clientPreface = []byte("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00")

// speaksGRPC tells whether the server on conn answers as a gRPC server
// does, with an HTTP/2 SETTINGS frame. Anything else listening there (the
// web console, a REST-only server) would leave every call to hang until
// its deadline with nothing said, so the error names what answered.
func speaksGRPC(ctx context.Context, conn net.Conn) error {
	stop := context.AfterFunc(ctx, func() { _ = conn.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	if _, err := conn.Write(clientPreface); err != nil {
		return fmt.Errorf("send the HTTP/2 preface: %w", err)
	}
	head := make([]byte, 9) // a frame header
	n, err := io.ReadFull(conn, head)
	head = head[:n]
	switch {
	case n == 9 && head[3] == 0x4: // a SETTINGS frame
		return nil
	case bytes.HasPrefix(head, []byte("HTTP/")):
		return fmt.Errorf("it answers in HTTP/1 (%q), not gRPC: a web server, not a Pub/Sub emulator", head)
	case bytes.HasPrefix(head, []byte("<")): // an HTML page without a status line (HTTP/0.9)
		return fmt.Errorf("it answers with a web page (%q), not gRPC: a web server, not a Pub/Sub emulator", head)
	case n > 0:
		return fmt.Errorf("it answers %q, not the HTTP/2 of gRPC", head)
	case ctx.Err() != nil:
		return fmt.Errorf("it did not answer the gRPC handshake: %w", ctx.Err())
	}
	return fmt.Errorf("it closed the connection instead of answering the gRPC handshake: %w", err)
}
