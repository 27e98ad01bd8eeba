package broker

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"strings"
	"time"

	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"cloud.google.com/go/storage"
	"github.com/google/uuid"
	"github.com/hamba/avro/v2"
	"github.com/hamba/avro/v2/ocf"
	"google.golang.org/api/googleapi"
	"google.golang.org/api/option"
)

// Cloud Storage subscriptions write each batch as one object through the
// Cloud Storage JSON API, named <prefix><UTC date-time>_<uuid><suffix>.

// The Avro records of a Cloud Storage subscription: with write_metadata
// the service's PubsubMessageWithMetadata, without it the data alone.
const (
	avroWithMetadata = `{"type":"record","name":"PubsubMessageWithMetadata","fields":[
		{"name":"subscription_name","type":"string"},
		{"name":"message_id","type":"string"},
		{"name":"publish_time","type":{"type":"long","logicalType":"timestamp-micros"}},
		{"name":"attributes","type":{"type":"map","values":"string"}},
		{"name":"data","type":"bytes"}]}`
	avroDataOnly = `{"type":"record","name":"PubsubMessage","fields":[{"name":"data","type":"bytes"}]}`
	// attrOrderingKey carries a message's ordering key in the attributes
	// of a record with metadata, as the service writes it.
	attrOrderingKey = "ordering_key"
)

type avroRecord struct {
	SubscriptionName string            `avro:"subscription_name"`
	MessageID        string            `avro:"message_id"`
	PublishTime      time.Time         `avro:"publish_time"`
	Attributes       map[string]string `avro:"attributes"`
	Data             []byte            `avro:"data"`
}

type storageDest struct {
	client *storage.Client
	sub    string
	c      *pb.CloudStorageConfig
	names  datetimeFormat
	now    func() time.Time
	// Avro output: the schema the file is written in, and whether each
	// message's data is already a record of it (use_topic_schema on a topic
	// with a binary Avro schema).
	avro     avro.Schema
	raw      bool
	metadata bool
}

// storageClient is the broker's one client of the Cloud Storage JSON API,
// made on first use.
func (b *Broker) storageClient() (*storage.Client, error) {
	b.storageOnce.Do(func() {
		host := b.opts.Exports.StorageHost
		if !strings.Contains(host, "://") {
			host = "http://" + host
		}
		b.storage, b.storageErr = storage.NewClient(context.Background(),
			option.WithEndpoint(strings.TrimSuffix(host, "/")+"/storage/v1/"), option.WithoutAuthentication())
	})
	return b.storage, b.storageErr
}

func (b *Broker) newStorageDest(sub string, c *pb.CloudStorageConfig) (exportDest, error) {
	if b.opts.Exports.StorageHost == "" {
		return nil, &destError{state: exportNotFound,
			err: errors.New("no Cloud Storage endpoint: start the broker with STORAGE_EMULATOR_HOST set to a Cloud Storage server (such as fake-gcs-server)")}
	}
	client, err := b.storageClient()
	if err != nil {
		return nil, fmt.Errorf("cloud storage client: %w", err)
	}
	d := &storageDest{client: client, sub: sub, c: c, now: b.now}
	d.names = mustDatetimeFormat(storageDatetimeFormat)
	if c.FilenameDatetimeFormat != "" {
		d.names = mustDatetimeFormat(c.FilenameDatetimeFormat)
	}
	if a := c.GetAvroConfig(); a != nil {
		d.metadata = a.WriteMetadata
		def := avroDataOnly
		if a.WriteMetadata {
			def = avroWithMetadata
		}
		if a.UseTopicSchema {
			sch, enc, err := b.topicAvroSchema(sub)
			if err != nil {
				return nil, err
			}
			if sch != nil {
				if enc != pb.Encoding_BINARY {
					return nil, &destError{state: exportSchemaMismatch,
						err: errors.New("use_topic_schema on a topic whose Avro schema has JSON encoding is not supported by this broker: use BINARY encoding")}
				}
				d.avro, d.raw = sch, true
			}
		}
		if d.avro == nil {
			d.avro = avro.MustParse(def)
		}
	}
	return d, nil
}

// topicAvroSchema is the Avro schema and encoding of the subscription's
// topic, or nil when it has none.
func (b *Broker) topicAvroSchema(sub string) (avro.Schema, pb.Encoding, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	s := b.subs[sub]
	if s == nil || s.topic == nil {
		return nil, 0, nil
	}
	ss := s.topic.proto.SchemaSettings
	if ss == nil {
		return nil, 0, nil
	}
	sc, rev, err := b.schemaLocked(ss.Schema)
	if err != nil {
		return nil, 0, &destError{state: exportSchemaMismatch, err: fmt.Errorf("the topic's schema: %w", err)}
	}
	if rev == nil {
		rev = sc.latest()
	}
	if rev.proto.Type != pb.Schema_AVRO {
		return nil, 0, &destError{state: exportSchemaMismatch, err: fmt.Errorf("use_topic_schema: the topic's schema %s is not Avro", ss.Schema)}
	}
	as, err := avro.Parse(rev.proto.Definition)
	if err != nil {
		return nil, 0, &destError{state: exportSchemaMismatch, err: fmt.Errorf("the topic's schema: %w", err)}
	}
	return as, ss.Encoding, nil
}

func mustDatetimeFormat(f string) datetimeFormat {
	df, err := parseDatetimeFormat(f)
	if err != nil {
		panic(err) // checkStorageConfig accepted it
	}
	return df
}

func (d *storageDest) limits() (int, int, time.Duration) {
	msgs, size := math.MaxInt32, storageMaxBytes
	if d.c.MaxMessages > 0 {
		msgs = int(d.c.MaxMessages)
	}
	if d.c.MaxBytes > 0 {
		size = int(d.c.MaxBytes)
	}
	return msgs, size, d.c.MaxDuration.AsDuration()
}

func (d *storageDest) check(ctx context.Context) error {
	_, err := d.client.Bucket(d.c.Bucket).Attrs(ctx)
	return d.classify(err)
}

// classify turns the storage client's error into a destination state.
func (d *storageDest) classify(err error) error {
	if err == nil {
		return nil
	}
	var ge *googleapi.Error
	switch {
	case errors.Is(err, storage.ErrBucketNotExist):
		return &destError{state: exportNotFound, err: fmt.Errorf("bucket %s does not exist", d.c.Bucket)}
	case errors.As(err, &ge) && ge.Code == http.StatusNotFound:
		return &destError{state: exportNotFound, err: fmt.Errorf("bucket %s: %w", d.c.Bucket, err)}
	case errors.As(err, &ge) && (ge.Code == http.StatusForbidden || ge.Code == http.StatusUnauthorized):
		return &destError{state: exportPermissionDenied, err: fmt.Errorf("bucket %s: %w", d.c.Bucket, err)}
	}
	return &destError{state: exportNotFound, err: fmt.Errorf("cloud storage: %w", err)}
}

// objectName is <prefix><UTC date-time>_<uuid><suffix>.
func (d *storageDest) objectName() string {
	return d.c.FilenamePrefix + d.names.format(d.now()) + "_" + uuid.NewString() + d.c.FilenameSuffix
}

func (d *storageDest) close() {}

func (d *storageDest) write(ctx context.Context, batch []delivery) ([]error, error) {
	content, err := d.encode(batch)
	if err != nil {
		return nil, err
	}
	w := d.client.Bucket(d.c.Bucket).Object(d.objectName()).NewWriter(ctx)
	w.ContentType = "text/plain"
	if d.avro != nil {
		w.ContentType = "application/octet-stream"
	}
	w.ChunkSize = 0 // one request: the object is whole in memory
	if _, err := w.Write(content); err != nil {
		w.Close()
		return nil, d.classify(err)
	}
	return nil, d.classify(w.Close())
}

// encode writes the batch as the object's content: one message's data per
// line, or an Avro object container file.
func (d *storageDest) encode(batch []delivery) ([]byte, error) {
	var buf bytes.Buffer
	if d.avro == nil {
		for _, dl := range batch {
			buf.Write(dl.m.data())
			buf.WriteByte('\n')
		}
		return buf.Bytes(), nil
	}
	enc, err := ocf.NewEncoderWithSchema(d.avro, &buf)
	if err != nil {
		return nil, fmt.Errorf("avro: %w", err)
	}
	for _, dl := range batch {
		if d.raw {
			_, err = enc.Write(dl.m.data())
		} else {
			err = enc.Encode(d.record(dl.m))
		}
		if err != nil {
			return nil, fmt.Errorf("avro record of message %s: %w", dl.m.id(), err)
		}
	}
	if err := enc.Close(); err != nil {
		return nil, fmt.Errorf("avro: %w", err)
	}
	return buf.Bytes(), nil
}

func (d *storageDest) record(m *message) any {
	if !d.metadata {
		return struct {
			Data []byte `avro:"data"`
		}{m.data()}
	}
	attrs := m.attrs()
	if attrs == nil {
		attrs = map[string]string{}
	}
	if m.key != "" {
		attrs[attrOrderingKey] = m.key
	}
	return avroRecord{SubscriptionName: d.sub, MessageID: m.id(), PublishTime: time.Unix(0, m.publish).UTC(),
		Attributes: attrs, Data: m.data()}
}
