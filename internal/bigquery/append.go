package bigquery

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"

	"cloud.google.com/go/bigquery/storage/apiv1/storagepb"
	"cloud.google.com/go/bigquery/storage/managedwriter"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// MaxRequestBytes is the Storage Write API's limit on one AppendRows
// request (10 MB). A server that takes less (goccy/bigquery-emulator takes
// gRPC's default 4 MiB) says so when it refuses a request, and the Writer
// learns its limit from that refusal: no flag to get wrong, and no row
// lost, since a refused request wrote nothing.
const MaxRequestBytes = 10_000_000

// requestSlack is kept free in each request for its envelope (stream
// name, schema, trace id): rows fill the rest.
const requestSlack = 64 << 10

// Writer appends rows to a table's _default stream.
type Writer struct {
	mw    *managedwriter.Client
	ms    *managedwriter.ManagedStream
	table *Table
	max   atomic.Int64 // bytes of rows per request
	log   *slog.Logger
}

// NewWriter opens t's _default stream. maxRequest caps a request's bytes
// (MaxRequestBytes when zero). Write retries are off: a row the client
// sent again after a lost answer could land twice, so a failed append is
// reported and the caller decides.
//
// Each Writer has a connection of its own, which names its stream in
// every request (managedwriter's multiplexing mode). The service needs
// neither, but goccy/bigquery-emulator does: it reads a connection's
// schema from its first request only, and sends a request that names no
// stream to whichever stream it finds first, another table's included.
func (c *Client) NewWriter(ctx context.Context, t *Table, maxRequest int, log *slog.Logger) (*Writer, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if maxRequest <= 0 {
		maxRequest = MaxRequestBytes
	}
	mw, err := managedwriter.NewClient(ctx, c.Project, append(c.grpc, managedwriter.WithMultiplexing())...)
	if err != nil {
		return nil, fmt.Errorf("credentials: %w", err)
	}
	ms, err := mw.NewManagedStream(ctx,
		managedwriter.WithDestinationTable(managedwriter.TableParentFromParts(t.Project, t.Ref.Dataset, t.Ref.Table)),
		managedwriter.WithType(managedwriter.DefaultStream),
		managedwriter.WithSchemaDescriptor(t.desc),
		managedwriter.EnableWriteRetries(false))
	if err != nil {
		mw.Close()
		return nil, fmt.Errorf("table %s: opening its _default stream: %w", t, err)
	}
	w := &Writer{mw: mw, ms: ms, table: t, log: log}
	w.max.Store(int64(maxRequest))
	return w, nil
}

// Close closes the stream and its connection. The stream's io.EOF is
// its server's goodbye, not an error.
func (w *Writer) Close() error {
	err := w.ms.Close()
	if errors.Is(err, io.EOF) {
		err = nil
	}
	return errors.Join(err, w.mw.Close())
}

// MaxRequest is the request size the writer fills to now: its start, or
// what it learned from the server.
func (w *Writer) MaxRequest() int { return int(w.max.Load()) }

// ErrTooLarge is a row larger than one request can carry.
var ErrTooLarge = errors.New("row larger than an AppendRows request")

// RowError is a row the server refused (a value out of range, say): it
// is permanent, as a FieldError is.
type RowError struct{ Reason string }

func (e *RowError) Error() string     { return "refused by BigQuery: " + e.Reason }
func (e *RowError) Is(err error) bool { return err == ErrUnfit }

// Append writes rows, filling requests up to the size limit, and returns
// each row's outcome: nil once it is in the table. A request either writes
// all its rows or none; when the server refuses some rows of a request,
// those get a *RowError and the others are sent again without them. Any
// other error leaves a row's outcome unknown: it may be in the table.
func (w *Writer) Append(ctx context.Context, rows [][]byte) []error {
	errs := make([]error, len(rows))
	idx := make([]int, len(rows))
	for i := range idx {
		idx[i] = i
	}
	// Each pass sends what the last one must send again: rows beside a
	// refused row, or rows of a request the server found too large. A
	// row is sent again only when its request wrote nothing.
	for pass := 0; len(idx) > 0; pass++ {
		if pass == 3 {
			for _, i := range idx {
				errs[i] = fmt.Errorf("appending to %s: gave up after %d requests", w.table, pass)
			}
			break
		}
		idx = w.send(ctx, rows, idx, errs)
	}
	return errs
}

type pending struct {
	rows []int
	res  *managedwriter.AppendResult
	err  error
}

// send appends the rows idx in requests, all in flight at once, sets
// their outcomes in errs, and returns the rows to send again.
func (w *Writer) send(ctx context.Context, rows [][]byte, idx []int, errs []error) []int {
	limit := int(w.max.Load()) - requestSlack - proto.Size(w.table.desc)
	var ps []pending
	flush := func(batch []int) {
		data := make([][]byte, len(batch))
		for j, i := range batch {
			data[j] = rows[i]
		}
		res, err := w.ms.AppendRows(ctx, data)
		ps = append(ps, pending{batch, res, err})
	}
	var batch []int
	size := 0
	for _, i := range idx {
		n := len(rows[i]) + 6 // a repeated bytes field's tag and length
		if n > limit {
			errs[i] = fmt.Errorf("%w: %d bytes, over the %d the server takes", ErrTooLarge, len(rows[i]), limit)
			continue
		}
		if size+n > limit {
			flush(batch)
			batch, size = nil, 0
		}
		batch = append(batch, i)
		size += n
	}
	if len(batch) > 0 {
		flush(batch)
	}
	var again []int
	for _, p := range ps {
		err := p.err
		var resp *storagepb.AppendRowsResponse
		if err == nil {
			resp, err = p.res.FullResponse(ctx)
		}
		if err == nil {
			continue
		}
		if refused := resp.GetRowErrors(); len(refused) > 0 {
			bad := map[int]string{}
			for _, re := range refused {
				if j := int(re.GetIndex()); j >= 0 && j < len(p.rows) {
					bad[j] = re.GetMessage()
				}
			}
			for j, i := range p.rows {
				if why, ok := bad[j]; ok {
					errs[i] = &RowError{why}
				} else {
					again = append(again, i)
				}
			}
			continue
		}
		if max, ok := serverMax(err); ok && int64(max) < w.max.Load() {
			w.max.Store(int64(max))
			w.log.Info("bigquery: the server takes smaller requests; filling them to its limit", "table", w.table.String(), "bytes", max)
			again = append(again, p.rows...)
			continue
		}
		for _, i := range p.rows {
			errs[i] = fmt.Errorf("appending to %s: %w", w.table, err)
		}
	}
	return again
}

// Locked reports whether err is goccy/bigquery-emulator's refusal of a
// request while another holds its database ("sqlite3: database is
// locked"), or the io.EOF of the appends behind such a refusal, since the
// emulator ends the stream with it: either way its transaction rolled
// back or never began, so nothing was written. Tests, which write from
// several packages at once, send such requests again; the sink treats
// them as any failed append.
func Locked(err error) bool {
	return err != nil && (strings.Contains(err.Error(), "sqlite3: database is locked") || errors.Is(err, io.EOF))
}

// tooLarge is gRPC's refusal of a message over a server's receive limit.
var tooLarge = regexp.MustCompile(`larger than max \(\d+ vs\. (\d+)\)`)

// serverMax reads a server's request limit from its refusal of a larger
// request (gRPC's ResourceExhausted).
func serverMax(err error) (int, bool) {
	s, ok := status.FromError(err)
	if !ok || s.Code() != codes.ResourceExhausted {
		return 0, false
	}
	m := tooLarge.FindStringSubmatch(s.Message())
	if m == nil {
		return 0, false
	}
	n, err := strconv.Atoi(m[1])
	if err != nil || n <= 2*requestSlack {
		return 0, false // no room for rows: not a limit to fill
	}
	return n, true
}
