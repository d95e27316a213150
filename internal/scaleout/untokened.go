package scaleout

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// checkUntokened refuses to start when the input stream holds messages
// whose subject does not start with a partition token: they were stored
// before the stream's subject transform put the partition first, and no
// member of the group consumes them, so they would be neither judged nor
// dead-lettered. The error gives their count and what to do.
func checkUntokened(ctx context.Context, js jetstream.JetStream, o Options) error {
	name := o.InputStream
	st, err := js.Stream(ctx, name)
	if err != nil {
		return fmt.Errorf("scale-out: input stream %s: %w", name, err)
	}
	n, err := countUntokened(ctx, st, o)
	if err != nil {
		return fmt.Errorf("scale-out: input stream %s: count the messages without a partition token: %w", name, err)
	}
	if n > 0 {
		return fmt.Errorf("scale-out: input stream %s holds %d messages without a partition token; judge them with scale-out off, "+
			"republish and purge them (nats stream purge %s --subject, for %s), or set scale_out.route: always",
			name, n, name, strings.Join(o.InputSubjects, ", "))
	}
	return nil
}

// countUntokened counts the input's messages whose subject does not start
// with a partition token, with a consumer of its own deleted at once; while
// messages keep arriving the count can only be too high (docs/scale-out.md,
// "Code notes").
func countUntokened(ctx context.Context, st jetstream.Stream, o Options) (uint64, error) {
	count := func(filters []string) (uint64, error) {
		c, err := st.CreateConsumer(ctx, jetstream.ConsumerConfig{FilterSubjects: filters, AckPolicy: jetstream.AckNonePolicy,
			InactiveThreshold: 5 * time.Second, Description: "dedupe-stage: counts the input's messages without a partition token at start"})
		if err != nil {
			return 0, err
		}
		ci := c.CachedInfo()
		if err := st.DeleteConsumer(ctx, ci.Name); err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
			return 0, fmt.Errorf("delete the consumer that counted: %w", err)
		}
		return ci.NumPending, nil
	}
	if !slices.ContainsFunc(o.InputSubjects, mayBePartitioned) {
		return count(o.InputSubjects)
	}
	info, err := st.Info(ctx)
	if err != nil {
		return 0, err
	}
	filters := make([]string, o.Partitions)
	for p := range filters {
		filters[p] = strconv.Itoa(p) + ".>"
	}
	partitioned, err := count(filters)
	if err != nil {
		return 0, err
	}
	if info.State.Msgs <= partitioned {
		return 0, nil
	}
	return info.State.Msgs - partitioned, nil
}

// mayBePartitioned reports whether subject pattern can match a subject
// that starts with a partition token: its first token is a wildcard or a
// number.
func mayBePartitioned(pattern string) bool {
	first, _, _ := strings.Cut(pattern, ".")
	if first == "*" || first == ">" {
		return true
	}
	_, err := strconv.ParseUint(first, 10, 64)
	return err == nil
}
