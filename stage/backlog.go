package stage

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/dedupe-stage/dedupe-stage/config"
)

// checkUntokened refuses to start when the input stream holds messages
// whose subject does not start with a partition token: they were stored
// before the stream's subject transform put the partition first, and no
// member of the group consumes them, so they would be neither judged nor
// dead-lettered. The error gives their count and what to do.
func checkUntokened(ctx context.Context, js jetstream.JetStream, cfg config.Config) error {
	name := cfg.Input.Stream
	st, err := js.Stream(ctx, name)
	if err != nil {
		return fmt.Errorf("scale-out: input stream %s: %w", name, err)
	}
	filters := make([]string, cfg.State.Partitions)
	for p := range filters {
		filters[p] = strconv.Itoa(p) + ".>"
	}
	// An ephemeral consumer counts them; it is deleted at once, and its
	// inactivity threshold removes it should the delete be lost, so that
	// no consumer of the check lingers on the input stream.
	c, err := st.CreateConsumer(ctx, jetstream.ConsumerConfig{FilterSubjects: filters, AckPolicy: jetstream.AckNonePolicy,
		InactiveThreshold: 5 * time.Second, Description: "dedupe-stage: counts the partitioned messages at start"})
	if err != nil {
		return fmt.Errorf("scale-out: input stream %s: count the partitioned messages: %w", name, err)
	}
	ci := c.CachedInfo()
	if err := st.DeleteConsumer(ctx, ci.Name); err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
		return fmt.Errorf("scale-out: input stream %s: delete the consumer that counted the partitioned messages: %w", name, err)
	}
	info, err := st.Info(ctx)
	if err != nil {
		return fmt.Errorf("scale-out: input stream %s: %w", name, err)
	}
	if n := info.State.Msgs - ci.NumPending; info.State.Msgs > ci.NumPending && n > 0 {
		return fmt.Errorf("scale-out: input stream %s holds %d messages without a partition token (stored before its subject transform put the partition first): no member of the group consumes them. "+
			"Judge them first with scale-out off, or republish them and remove them (nats stream purge %s --subject <subject>, for each of %s), or let the route step partition the input (scale_out.route: always)",
			name, n, name, strings.Join(cfg.Input.Subjects, ", "))
	}
	return nil
}
