package scaleout

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"hash"
	"io"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/dedupe-stage/dedupe-stage/internal/changelog"
)

// objectReadAhead is how many chunks of an object objectReader asks the
// server for at a time: 16 of the Object Store's default 128 KiB, 2 MiB.
// jetstream.ObjectStore.Get reads through a push consumer with flow
// control, which lets the server send up to 32 MiB
// (JsFlowControlMaxPending, nats-server 2.15) ahead of a reader slower
// than the network. A snapshot load is such a reader: in a hand-over of a
// 1M-key partition the new owner held 26.6 MiB of chunks in the client at
// its largest live heap, 78 MiB.
const objectReadAhead = 16

// objectChunkTimeout bounds the wait for one chunk of an object. An
// object that a newer one replaced loses its chunks (Put purges them), and
// a read of it would otherwise wait for chunks that no longer exist.
const objectChunkTimeout = 30 * time.Second

// objectReader reads one object of an Object Store bucket through an
// ordered pull consumer of the bucket's chunk subject, at most
// objectReadAhead chunks ahead of Read, and checks the object's size and
// SHA-256 digest before io.EOF. It is not safe for concurrent use.
type objectReader struct {
	ctx    context.Context
	info   *jetstream.ObjectInfo
	msgs   jetstream.MessagesContext
	digest hash.Hash
	wait   time.Duration // the longest wait for one chunk
	buf    []byte        // the rest of the current chunk
	chunks uint32        // chunks read
	size   uint64        // bytes read
	err    error         // sticky
}

// openObject opens object name of bucket in obs for reading through js.
// The chunk subject and stream follow the Object Store's layout (ADR-20):
// stream OBJ_<bucket>, chunks on $O.<bucket>.C.<object's NUID>.
func openObject(ctx context.Context, js jetstream.JetStream, obs jetstream.ObjectStore, bucket, name string) (*objectReader, error) {
	ictx, cancel := changelog.Request(ctx) // ctx is the transfer's: an hour
	info, err := obs.GetInfo(ictx, name)
	cancel()
	if err != nil {
		return nil, err
	}
	r := &objectReader{ctx: ctx, info: info, digest: sha256.New(), wait: objectChunkTimeout}
	if info.Chunks == 0 {
		return r, nil
	}
	cons, err := js.OrderedConsumer(ctx, "OBJ_"+bucket, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{"$O." + bucket + ".C." + info.NUID},
	})
	if err != nil {
		return nil, fmt.Errorf("object %s: chunk consumer: %w", name, err)
	}
	r.msgs, err = cons.Messages(jetstream.PullMaxMessages(objectReadAhead))
	if err != nil {
		return nil, fmt.Errorf("object %s: chunk consumer: %w", name, err)
	}
	return r, nil
}

// Read reads the object's bytes in order. It returns io.EOF after the
// last chunk when the object's chunk count, size and digest match its
// info, and an error otherwise.
func (r *objectReader) Read(p []byte) (int, error) {
	for len(r.buf) == 0 {
		if r.err != nil {
			return 0, r.err
		}
		r.err = r.next()
	}
	n := copy(p, r.buf)
	r.buf = r.buf[n:]
	return n, nil
}

// next reads the next chunk into buf, or returns io.EOF (after the last
// chunk, all checks passed) or the error that ends the read.
func (r *objectReader) next() error {
	name := r.info.Name
	if r.chunks == r.info.Chunks {
		want, err := jetstream.DecodeObjectDigest(r.info.Digest)
		switch {
		case r.size != r.info.Size:
			return fmt.Errorf("object %s: read %d bytes, its info says %d", name, r.size, r.info.Size)
		case err != nil:
			return fmt.Errorf("object %s: digest: %w", name, err)
		case !bytes.Equal(r.digest.Sum(nil), want):
			return fmt.Errorf("object %s: %w", name, jetstream.ErrDigestMismatch)
		}
		return io.EOF
	}
	ctx, cancel := context.WithTimeout(r.ctx, r.wait)
	defer cancel()
	m, err := r.msgs.Next(jetstream.NextContext(ctx))
	if err != nil {
		if errors.Is(err, context.DeadlineExceeded) && r.ctx.Err() == nil {
			err = fmt.Errorf("no chunk in %v (the object may have been replaced)", r.wait)
		}
		return fmt.Errorf("object %s: chunk %d of %d: %w", name, r.chunks+1, r.info.Chunks, err)
	}
	r.buf = m.Data()
	r.digest.Write(r.buf)
	r.chunks++
	r.size += uint64(len(r.buf))
	return nil
}

// Close stops the chunk consumer.
func (r *objectReader) Close() error {
	if r.msgs != nil {
		r.msgs.Stop()
	}
	return nil
}
