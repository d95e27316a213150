package sink

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dedupe-stage/dedupe-stage/internal/testkit/natstest"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"
)

// bucketSeq makes KV bucket and stream names unique within the test binary.
var bucketSeq atomic.Int64

// newKVBucket creates an empty KV bucket on srv and returns it.
func newKVBucket(t testing.TB, srv *server.Server) jetstream.KeyValue {
	t.Helper()
	_, js := natstest.Connect(t, srv.ClientURL())
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: fmt.Sprintf("totals%d", bucketSeq.Add(1)), History: 1})
	if err != nil {
		t.Fatalf("create KV bucket: %v", err)
	}
	return kv
}

// kvEnv returns a conformance env over a fresh KV bucket on srv; every sink
// gets its own connection.
func kvEnv(t *testing.T, srv *server.Server) env {
	kv := newKVBucket(t, srv)
	bucket := kv.Bucket()
	return env{
		newSink: func(t *testing.T) Sink {
			_, js := natstest.Connect(t, srv.ClientURL())
			own, err := js.KeyValue(context.Background(), bucket)
			if err != nil {
				t.Fatalf("open KV bucket %s: %v", bucket, err)
			}
			return NewKV(own)
		},
		snapshot: func(ctx context.Context) (map[string]int64, error) {
			return kvSnapshot(ctx, kv)
		},
		poll: func(ctx context.Context, ids []string) (map[string]int64, error) {
			return kvRead(ctx, kv, ids)
		},
	}
}

// kvRead reads the given keys of kv as totals; absent keys are left out.
// Unlike kvSnapshot it is exact while other clients write: listing keys
// watches the bucket and can miss a key whose value is replaced meanwhile.
func kvRead(ctx context.Context, kv jetstream.KeyValue, keys []string) (map[string]int64, error) {
	out := map[string]int64{}
	for _, k := range keys {
		e, err := kv.Get(ctx, k)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("get %s: %w", k, err)
		}
		v, err := strconv.ParseInt(string(e.Value()), 10, 64)
		if err != nil {
			return nil, fmt.Errorf("key %s holds %q: %w", k, e.Value(), err)
		}
		out[k] = v
	}
	return out, nil
}

// kvSnapshot reads every key of kv as a total. It is exact only while no one
// writes to kv.
func kvSnapshot(ctx context.Context, kv jetstream.KeyValue) (map[string]int64, error) {
	keys, err := kv.Keys(ctx)
	if errors.Is(err, jetstream.ErrNoKeysFound) {
		return map[string]int64{}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("keys: %w", err)
	}
	return kvRead(ctx, kv, keys)
}

func TestKV(t *testing.T) {
	srv := natstest.RunServer(t, "")
	runConformance(t, "kv", func(t *testing.T) env { return kvEnv(t, srv) })

	t.Run("stored form", func(t *testing.T) {
		kv := newKVBucket(t, srv)
		total := tot("campaign-42", bucket0, 1017)
		checkedWrite(t, NewKV(kv), []Total{total})
		e, err := kv.Get(context.Background(), "campaign-42.1767225600")
		if err != nil {
			t.Fatalf("get the total's key: %v", err)
		}
		if got := string(e.Value()); got != "1017" {
			t.Fatalf("stored value = %q, want %q", got, "1017")
		}
	})

	t.Run("bad stored value", func(t *testing.T) {
		kv := newKVBucket(t, srv)
		total := tot("g", bucket0, 5)
		if _, err := kv.PutString(context.Background(), total.ID(), "not a number"); err != nil {
			t.Fatal(err)
		}
		_, err := NewKV(kv).Write(context.Background(), []Total{total})
		if !errors.Is(err, ErrBadStored) {
			t.Fatalf("Write over a non-numeric value: error = %v, want ErrBadStored", err)
		}
	})

	t.Run("deleted key", func(t *testing.T) {
		kv := newKVBucket(t, srv)
		s := NewKV(kv)
		total := tot("g", bucket0, 5)
		checkedWrite(t, s, []Total{total})
		if err := kv.Delete(context.Background(), total.ID()); err != nil {
			t.Fatal(err)
		}
		if got, want := checkedWrite(t, s, []Total{total}), (Result{Applied: 1}); got != want {
			t.Fatalf("Write after delete = %+v, want %+v", got, want)
		}
		snap, err := kvSnapshot(context.Background(), kv)
		if err != nil {
			t.Fatal(err)
		}
		if snap[total.ID()] != 5 {
			t.Fatalf("after delete and Write the store holds %v, want %s=5", snap, total.ID())
		}
	})

	t.Run("canceled context", func(t *testing.T) {
		kv := newKVBucket(t, srv)
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		_, err := NewKV(kv).Write(ctx, []Total{tot("g", bucket0, 5)})
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("Write with a canceled context: error = %v, want context.Canceled", err)
		}
	})
}

// racingKV is a real KV bucket whose Get runs race after reading, so that a
// competing write lands between the sink's read and its compare-and-set.
// For tests only.
type racingKV struct {
	jetstream.KeyValue
	race func(key string)
}

// Get reads key, then lets the competing writer in.
func (r racingKV) Get(ctx context.Context, key string) (jetstream.KeyValueEntry, error) {
	e, err := r.KeyValue.Get(ctx, key)
	r.race(key)
	return e, err
}

func TestKVConflicts(t *testing.T) {
	srv := natstest.RunServer(t, "")
	ctx := context.Background()
	total := tot("g", bucket0, 50)

	tests := []struct {
		name    string
		initial string // stored before the Write; "" for none
		writes  []string
		want    Result
		stored  string
	}{
		// Another instance creates the key between our miss and our Create.
		{"create races create, ours larger", "", []string{"40"}, Result{Applied: 1, Retried: 1}, "50"},
		{"create races create, theirs larger", "", []string{"60"}, Result{Stale: 1, Retried: 1}, "60"},
		// Another instance raises the key between our read and our Update.
		{"update races update, ours larger", "10", []string{"20"}, Result{Applied: 1, Retried: 1}, "50"},
		{"update races update, theirs larger", "10", []string{"70"}, Result{Stale: 1, Retried: 1}, "70"},
		{"two conflicts in a row", "10", []string{"20", "30"}, Result{Applied: 1, Retried: 2}, "50"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			kv := newKVBucket(t, srv)
			if tc.initial != "" {
				if _, err := kv.PutString(ctx, total.ID(), tc.initial); err != nil {
					t.Fatal(err)
				}
			}
			pending := tc.writes
			s := NewKV(racingKV{KeyValue: kv, race: func(key string) {
				if len(pending) == 0 {
					return
				}
				if _, err := kv.PutString(ctx, key, pending[0]); err != nil {
					t.Errorf("competing put: %v", err)
				}
				pending = pending[1:]
			}})
			if got := checkedWrite(t, s, []Total{total}); got != tc.want {
				t.Fatalf("Write = %+v, want %+v", got, tc.want)
			}
			e, err := kv.Get(ctx, total.ID())
			if err != nil {
				t.Fatal(err)
			}
			if string(e.Value()) != tc.stored {
				t.Fatalf("stored %q, want %q", e.Value(), tc.stored)
			}
		})
	}

	t.Run("gives up after MaxKVAttempts", func(t *testing.T) {
		kv := newKVBucket(t, srv)
		if _, err := kv.PutString(ctx, total.ID(), "0"); err != nil {
			t.Fatal(err)
		}
		gets := 0
		s := NewKV(racingKV{KeyValue: kv, race: func(key string) {
			gets++
			if _, err := kv.PutString(ctx, key, "1"); err != nil {
				t.Errorf("competing put: %v", err)
			}
		}})
		res, err := s.Write(ctx, []Total{total})
		if !errors.Is(err, ErrConflicts) {
			t.Fatalf("Write under constant conflicts = %+v, %v; want ErrConflicts", res, err)
		}
		if gets != MaxKVAttempts || res != (Result{Retried: MaxKVAttempts - 1}) {
			t.Fatalf("Write made %d reads and returned %+v; want %d reads and Retried %d", gets, res, MaxKVAttempts, MaxKVAttempts-1)
		}
	})
}
