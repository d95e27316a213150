package scaleout

import (
	"bytes"
	"context"
	"errors"
	"io"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/dedupe-stage/dedupe-stage/internal/testkit/natstest"
)

// objectStore returns a bucket of an in-process JetStream server, and the
// JetStream context it was made with.
func objectStore(t *testing.T) (jetstream.JetStream, jetstream.ObjectStore) {
	t.Helper()
	srv := natstest.RunServer(t, t.TempDir())
	_, js := natstest.Connect(t, srv.ClientURL())
	ctx := context.Background()
	obs, err := js.CreateObjectStore(ctx, jetstream.ObjectStoreConfig{Bucket: "snaps"})
	if err != nil {
		t.Fatal(err)
	}
	return js, obs
}

// putObject stores size random bytes as object name in chunks of chunk
// bytes and returns them.
func putObject(t *testing.T, obs jetstream.ObjectStore, name string, size, chunk int) []byte {
	t.Helper()
	data := make([]byte, size)
	for i := range data {
		data[i] = byte(rand.Uint32())
	}
	meta := jetstream.ObjectMeta{Name: name, Opts: &jetstream.ObjectMetaOptions{ChunkSize: uint32(chunk)}}
	if _, err := obs.Put(context.Background(), meta, bytes.NewReader(data)); err != nil {
		t.Fatal(err)
	}
	return data
}

// TestObjectReaderReadsTheObject: every byte in order, io.EOF after the
// last, for an object of many chunks (the last one short) and an empty one.
func TestObjectReaderReadsTheObject(t *testing.T) {
	js, obs := objectStore(t)
	ctx := context.Background()
	for _, size := range []int{0, 1, 1000, 100*1024 + 17} {
		want := putObject(t, obs, "p0", size, 1024)
		r, err := openObject(ctx, js, obs, "snaps", "p0")
		if err != nil {
			t.Fatal(err)
		}
		got, err := io.ReadAll(r)
		r.Close()
		if err != nil || !bytes.Equal(got, want) {
			t.Fatalf("size %d: read %d bytes (equal: %v), %v; want the %d put", size, len(got), bytes.Equal(got, want), err, len(want))
		}
	}
}

// TestObjectReaderReadsAheadABoundedAmount: a reader that has taken one
// chunk of 200 has had at most 32 delivered, 4 MiB of the default 128 KiB
// chunks (jetstream.ObjectStore.Get would have had all 200 sent at once).
func TestObjectReaderReadsAheadABoundedAmount(t *testing.T) {
	js, obs := objectStore(t)
	ctx := context.Background()
	putObject(t, obs, "p0", 200*1024, 1024)
	r, err := openObject(ctx, js, obs, "snaps", "p0")
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if _, err := r.Read(make([]byte, 1)); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	s, err := js.Stream(ctx, "OBJ_snaps")
	if err != nil {
		t.Fatal(err)
	}
	var delivered uint64
	for info := range s.ListConsumers(ctx).Info() {
		delivered = max(delivered, info.Delivered.Consumer)
	}
	if delivered == 0 || delivered > 32 {
		t.Errorf("%d chunks delivered to a reader that took one, want 1..32", delivered)
	}
	if _, err := io.Copy(io.Discard, r); err != nil {
		t.Fatalf("the rest of the object: %v", err)
	}
}

// TestObjectReaderChecksTheObject: chunks replaced by others of the same
// count and size fail the digest, and an object replaced by a newer one
// while it is read (its chunks purged) ends the read with an error
// instead of a wait for chunks that are gone.
func TestObjectReaderChecksTheObject(t *testing.T) {
	js, obs := objectStore(t)
	ctx := context.Background()
	putObject(t, obs, "p0", 4*1024, 1024)
	info, err := obs.GetInfo(ctx, "p0")
	if err != nil {
		t.Fatal(err)
	}
	s, err := js.Stream(ctx, "OBJ_snaps")
	if err != nil {
		t.Fatal(err)
	}
	subj := "$O.snaps.C." + info.NUID
	if err := s.Purge(ctx, jetstream.WithPurgeSubject(subj)); err != nil {
		t.Fatal(err)
	}
	for range 4 {
		if _, err := js.Publish(ctx, subj, make([]byte, 1024)); err != nil {
			t.Fatal(err)
		}
	}
	r, err := openObject(ctx, js, obs, "snaps", "p0")
	if err != nil {
		t.Fatal(err)
	}
	_, err = io.ReadAll(r)
	r.Close()
	if !errors.Is(err, jetstream.ErrDigestMismatch) {
		t.Errorf("reading chunks that are not the object's: %v, want ErrDigestMismatch", err)
	}

	putObject(t, obs, "p1", 64*1024, 1024)
	r, err = openObject(ctx, js, obs, "snaps", "p1")
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	r.wait = time.Second
	if _, err := r.Read(make([]byte, 1)); err != nil {
		t.Fatal(err)
	}
	putObject(t, obs, "p1", 10, 1024)
	if _, err = io.ReadAll(r); err == nil {
		t.Errorf("reading an object replaced (its chunks purged) while it was read: no error")
	}
}
