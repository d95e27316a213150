package sink

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"
)

// OpenKV returns the KV sink on the JetStream KV bucket named bucket. A
// missing bucket is created (file storage, replicas copies; 0 means 1)
// when create is set; otherwise the error wraps jetstream.ErrBucketNotFound.
func OpenKV(ctx context.Context, js jetstream.JetStream, bucket string, create bool, replicas int) (Sink, error) {
	kv, err := js.KeyValue(ctx, bucket)
	if err == nil {
		return NewKV(kv), nil
	}
	if !errors.Is(err, jetstream.ErrBucketNotFound) || !create {
		return nil, fmt.Errorf("sink kv: bucket %s: %w", bucket, err)
	}
	kv, err = js.CreateKeyValue(ctx, jetstream.KeyValueConfig{
		Bucket: bucket, Description: "dedupe-stage totals: <group>.<bucket unix seconds> = total", Storage: jetstream.FileStorage,
		Replicas: max(replicas, 1),
	})
	if err != nil {
		return nil, fmt.Errorf("sink kv: create bucket %s: %w", bucket, err)
	}
	return NewKV(kv), nil
}

// StreamSubjects returns the subjects of a stream that holds the stream
// sink's messages published under subjectPrefix: subjectPrefix + ".>".
func StreamSubjects(subjectPrefix string) string { return subjectPrefix + ".>" }

// OpenStream returns the stream sink publishing under subjectPrefix, after
// checking that stream exists. A missing stream is created (file storage,
// subjects StreamSubjects(subjectPrefix), atomic publish allowed, replicas
// copies; 0 means 1) when create is set; otherwise the error wraps
// jetstream.ErrStreamNotFound.
// atomic, given whether the stream allows atomic publish, decides
// StreamOptions.Atomic; nil means never.
func OpenStream(ctx context.Context, js jetstream.JetStream, stream, subjectPrefix string, create bool, replicas int, atomic func(streamAllowsAtomic bool) bool) (Sink, error) {
	st, err := js.Stream(ctx, stream)
	if errors.Is(err, jetstream.ErrStreamNotFound) && create {
		st, err = js.CreateStream(ctx, jetstream.StreamConfig{
			Name: stream, Subjects: []string{StreamSubjects(subjectPrefix)}, Storage: jetstream.FileStorage,
			Description:        "dedupe-stage totals: the largest value per (group, bucket) is current",
			AllowAtomicPublish: true,
			Replicas:           max(replicas, 1),
		})
		if err != nil {
			return nil, fmt.Errorf("sink stream: create stream %s: %w", stream, err)
		}
	} else if err != nil {
		return nil, fmt.Errorf("sink stream: stream %s: %w", stream, err)
	}
	var o StreamOptions
	if atomic != nil {
		o.Atomic = atomic(st.CachedInfo().Config.AllowAtomicPublish)
	}
	return NewStreamWith(js, subjectPrefix, o), nil
}

// OpenPostgres connects a pool to dsn, creates table when createSchema is
// set (see CreateSchema) and returns the PostgreSQL sink on it. Unlike the
// sinks built on a caller's connection, this one owns its pool: Close closes
// the pool too. On error nothing is left open.
func OpenPostgres(ctx context.Context, dsn, table string, createSchema bool) (_ Sink, err error) {
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		return nil, fmt.Errorf("sink postgres: %w", err)
	}
	defer func() {
		if err != nil {
			pool.Close()
		}
	}()
	if createSchema {
		if err := CreateSchema(ctx, pool, table); err != nil {
			return nil, err
		}
	}
	s, err := NewPostgres(ctx, pool, table)
	if err != nil {
		return nil, err
	}
	return &poolOwner{Sink: s, pool: pool}, nil
}

// poolOwner is a Sink that closes its pool with it.
type poolOwner struct {
	Sink
	pool *pgxpool.Pool
	once sync.Once
}

// Close closes the sink, then the pool.
func (p *poolOwner) Close() error {
	err := p.Sink.Close()
	p.once.Do(p.pool.Close)
	return err
}
