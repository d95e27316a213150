package state_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/dedupe-stage/dedupe-stage/internal/testkit/natstest"
	"github.com/dedupe-stage/dedupe-stage/state"
)

// randomToken returns a subject token of 1 to 40 characters: printable
// ASCII other than the subject's separators and wildcards, and some
// multi-byte UTF-8, so that every byte value class reaches the hash.
func randomToken(r *rand.Rand) string {
	const ascii = "!\"#$%&'()+,-/0123456789:;<=?@ABCDEFGHIJKLMNOPQRSTUVWXYZ[\\]^_`abcdefghijklmnopqrstuvwxyz{|}~"
	runes := []rune{'é', 'ß', '日', '本', '🙂', 'Ω'}
	var b strings.Builder
	for n := 1 + r.IntN(40); n > 0; n-- {
		if r.IntN(8) == 0 {
			b.WriteRune(runes[r.IntN(len(runes))])
			continue
		}
		b.WriteByte(ascii[r.IntN(len(ascii))])
	}
	return b.String()
}

// TestPartitionFNVMatchesServer publishes random tokens to streams whose
// subject transform is {{partition(N,1)}}.<prefix>.{{wildcard(1)}} and
// checks that the partition the server stored each message under is
// PartitionFNV of its token.
func TestPartitionFNVMatchesServer(t *testing.T) {
	srv := natstest.RunServer(t, "")
	_, js := natstest.Connect(t, srv.ClientURL())
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	seed := uint64(time.Now().UnixNano())
	t.Logf("token seed %d", seed)
	r := rand.New(rand.NewPCG(seed, 0x9e3779b97f4a7c15))
	tokens := make([]string, 500)
	for i := range tokens {
		tokens[i] = randomToken(r)
	}
	for _, n := range []int{1, 4, 16} {
		t.Run(fmt.Sprintf("N=%d", n), func(t *testing.T) {
			prefix := "ev" + strconv.Itoa(n)
			name := "EV" + strconv.Itoa(n)
			_, err := js.CreateStream(ctx, jetstream.StreamConfig{
				Name:     name,
				Subjects: []string{prefix + ".*"},
				SubjectTransform: &jetstream.SubjectTransformConfig{
					Source:      prefix + ".*",
					Destination: fmt.Sprintf("{{partition(%d,1)}}.%s.{{wildcard(1)}}", n, prefix),
				},
			})
			if err != nil {
				t.Fatalf("create stream %s: %v", name, err)
			}
			msgs := make([]*nats.Msg, len(tokens))
			for i, tok := range tokens {
				msgs[i] = &nats.Msg{Subject: prefix + "." + tok, Data: []byte(strconv.Itoa(i))}
			}
			natstest.PublishAll(t, js, msgs)
			stored := natstest.ReadAll(t, js, name)
			if len(stored) != len(tokens) {
				t.Fatalf("stream %s holds %d messages, want %d", name, len(stored), len(tokens))
			}
			used := map[int]bool{}
			for _, m := range stored {
				parts := strings.SplitN(m.Subject, ".", 3)
				if len(parts) != 3 || parts[1] != prefix {
					t.Fatalf("stored subject %q, want <partition>.%s.<token>", m.Subject, prefix)
				}
				i, err := strconv.Atoi(string(m.Data))
				if err != nil || parts[2] != tokens[i] {
					t.Fatalf("stored subject %q for message %q, want token %q", m.Subject, m.Data, tokens[i])
				}
				server, err := strconv.Atoi(parts[0])
				if err != nil {
					t.Fatalf("stored subject %q: first token is not a partition: %v", m.Subject, err)
				}
				if got := state.PartitionFNV([]byte(parts[2]), n); got != server {
					t.Errorf("token %q: PartitionFNV = %d, the server's partition(%d,1) = %d", parts[2], got, n, server)
				}
				used[server] = true
			}
			// 500 keys over at most 16 partitions: a partition left empty
			// would mean the transform did not spread keys at all.
			if len(used) != n {
				t.Errorf("the server used %d of %d partitions for %d keys", len(used), n, len(tokens))
			}
		})
	}
}
