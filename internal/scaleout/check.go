package scaleout

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"reflect"
	"slices"
	"strconv"
	"strings"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/synadia-io/orbit.go/pcgroups"

	"github.com/dedupe-stage/dedupe-stage/internal/finding"
	"github.com/dedupe-stage/dedupe-stage/internal/scaleout/layout"
	"github.com/dedupe-stage/dedupe-stage/internal/scaleout/route"
)

// staticGroupBucket is the KV bucket in which pcgroups keeps each static
// consumer group's membership, under "<stream>.<group>".
const staticGroupBucket = "static-consumer-groups"

// Check runs the checks New makes of the streams, the static consumer group
// and the hand-over bucket of the group o configures (only its names,
// streams, settings and Window are read, and js is used instead of o.JS),
// and returns every finding instead of stopping at the first. It only reads: where New would create something, the finding says
// so (finding.Info). A stream that does not exist is not reported here
// (the caller checks the streams) and its checks are skipped.
func Check(ctx context.Context, js jetstream.JetStream, o Options) []finding.Finding {
	o.JS, o.Logger = js, slog.New(slog.NewTextHandler(io.Discard, nil))
	g := newGroup(o)
	var fs []finding.Finding
	add := func(check string, sev finding.Severity, err error) {
		fs = append(fs, finding.FromError(check, sev, err))
	}
	lookup := func(name string) (jetstream.Stream, bool) {
		st, err := js.Stream(ctx, name)
		if errors.Is(err, jetstream.ErrStreamNotFound) {
			return nil, false
		}
		if err != nil {
			add("stream", finding.Error, fmt.Errorf("scale-out: look up stream %s: %w", name, err))
			return nil, false
		}
		return st, true
	}

	groupStream := o.InputStream
	if ro := o.Route; ro != nil {
		groupStream = ro.RoutedStream
		if st, ok := lookup(groupStream); ok {
			err := route.CheckStream(st.CachedInfo().Config, ro.RoutedSubject, ro.Partitions, ro.AckWait, ro.RestartMargin)
			for _, e := range splitJoined(err) {
				add("routed_stream", finding.Error, fmt.Errorf("scale-out: %w", e))
			}
		}
	} else if in, ok := lookup(o.InputStream); ok {
		if err := checkTransform(ctx, js, o); err != nil {
			add("partition_transform", finding.Error, err)
		}
		if f, ok := checkUntokenedReadOnly(ctx, in, o); ok {
			fs = append(fs, f)
		}
	}

	if out, ok := lookup(g.outStream); ok {
		oc := out.CachedInfo().Config
		if err := g.checkChangelog(oc); err != nil {
			add("changelog", finding.Error, err)
		}
		if err := checkControlSubjects(oc, o.OutputPrefix, o.Partitions); err != nil {
			add("control_subjects", finding.Error, err)
		}
	}
	if dl, ok := lookup(o.DeadLetterStream); ok {
		if err := checkControlSubjects(dl.CachedInfo().Config, o.DeadLetterSubject, o.Partitions); err != nil {
			add("control_subjects", finding.Error, err)
		}
	}

	bucket := layout.HandOverBucket(o.Group)
	if _, err := js.KeyValue(ctx, bucket); errors.Is(err, jetstream.ErrBucketNotFound) {
		fs = append(fs, finding.Finding{Check: "handover_bucket", Severity: finding.Info,
			Message: fmt.Sprintf("KV bucket %s does not exist; run creates it (history 1, replicas %d)", bucket, o.Replicas)})
	} else if err != nil {
		add("handover_bucket", finding.Error, fmt.Errorf("scale-out: hand-over bucket %s: %w", bucket, err))
	}
	if f, ok := checkGroupRecord(ctx, js, groupStream, o); ok {
		fs = append(fs, f)
	}
	return fs
}

// checkGroupRecord compares the static consumer group's record with the
// one New writes (groupMappings), without writing it: ok is false when the
// record is the one New wants.
func checkGroupRecord(ctx context.Context, js jetstream.JetStream, stream string, o Options) (finding.Finding, bool) {
	n, name := o.Partitions, o.Group
	key := stream + "." + name
	missing := finding.Finding{Check: "consumer_group", Severity: finding.Info,
		Message: fmt.Sprintf("static consumer group %s on %s does not exist; run creates it with %d members, p<i> consuming partition i", name, stream, n)}
	kv, err := js.KeyValue(ctx, staticGroupBucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		return missing, true
	}
	var entry jetstream.KeyValueEntry
	if err == nil {
		entry, err = kv.Get(ctx, key)
	}
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return missing, true
	}
	if err != nil {
		return finding.FromError("consumer_group", finding.Error, fmt.Errorf("scale-out: read static consumer group %s on %s: %w", name, stream, err)), true
	}
	var have pcgroups.StaticConsumerGroupConfig
	err = json.Unmarshal(entry.Value(), &have)
	if err == nil && have.MaxMembers == uint(n) && len(have.Filters) == 0 && len(have.Members) == 0 &&
		reflect.DeepEqual(have.MemberMappings, groupMappings(n)) {
		return finding.Finding{}, false
	}
	fix := fmt.Sprintf("nats kv del %s %s", staticGroupBucket, key)
	return finding.Finding{Check: "consumer_group", Severity: finding.Error,
		Message: fmt.Sprintf("scale-out: static consumer group %s on %s exists with another membership (max_members %d, not one member per partition of %d): "+
			"run refuses to join it; with every instance of the group stopped, delete its record (%s) and run writes it anew",
			name, stream, have.MaxMembers, n, fix),
		Fix: fix}, true
}

// checkUntokenedReadOnly is checkUntokened without the consumer that
// counts: it sums the stream's per-subject counts (a stream info with a
// subject filter) of the subjects without a partition token. ok is false
// when there are none. On a stream with very many distinct subjects the
// listing is long; ctx bounds it.
func checkUntokenedReadOnly(ctx context.Context, st jetstream.Stream, o Options) (finding.Finding, bool) {
	name := o.InputStream
	// Input subjects that cannot match a partitioned one select exactly the
	// messages without a token; they are also what a purge of them removes.
	filters, purgeable := o.InputSubjects, true
	if slices.ContainsFunc(filters, mayBePartitioned) {
		filters, purgeable = []string{">"}, false
	}
	var n uint64
	for _, f := range filters {
		info, err := st.Info(ctx, jetstream.WithSubjectFilter(f))
		if err != nil {
			return finding.FromError("untokened_backlog", finding.Error,
				fmt.Errorf("scale-out: input stream %s: count the messages without a partition token: %w", name, err)), true
		}
		for subj, c := range info.State.Subjects {
			if !hasPartitionToken(subj, o.Partitions) {
				n += c
			}
		}
	}
	if n == 0 {
		return finding.Finding{}, false
	}
	var purges []string
	if purgeable {
		for _, s := range o.InputSubjects {
			purges = append(purges, fmt.Sprintf("nats stream purge %s --subject '%s' --force", name, s))
		}
	}
	return finding.Finding{Check: "untokened_backlog", Severity: finding.Error,
		Message: fmt.Sprintf("scale-out: input stream %s holds %d messages without a partition token (stored before its subject transform put the partition first): no member of the group consumes them. "+
			"Judge them first with scale-out off, or republish them and then remove them (the fix), or let the route step partition the input (scale_out.route: always)", name, n),
		Fix: strings.Join(purges, "; ")}, true
}

// hasPartitionToken reports whether subject starts with the token of a
// partition below partitions, as the input stream's transform stores it.
func hasPartitionToken(subject string, partitions int) bool {
	first, _, _ := strings.Cut(subject, ".")
	p, err := strconv.Atoi(first)
	return err == nil && p >= 0 && p < partitions && strconv.Itoa(p) == first
}

// splitJoined returns the errors joined in err (errors.Join), or err alone.
func splitJoined(err error) []error {
	if err == nil {
		return nil
	}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		return j.Unwrap()
	}
	return []error{err}
}
