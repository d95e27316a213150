package scaleout

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/dedupe-stage/dedupe-stage/internal/changelog"
	"github.com/dedupe-stage/dedupe-stage/internal/finding"
	"github.com/dedupe-stage/dedupe-stage/window"
)

// ErrChangelog means the output stream does not keep what a new owner
// restores a partition from (docs/scale-out.md §8): the partition would be
// restored short, and copies of the keys it lost forwarded again. The error
// names the stream field and the nats stream edit command that fixes it.
var ErrChangelog = errors.New("the output stream does not keep what a restore needs")

// Reasons a takeover is refused, the reason label of
// dedupe_partition_refused_total.
const (
	refusedLimits = "limits" // the stream's configuration drops records
	refusedShort  = "short"  // records the restore needs are gone
)

// changelogError is an ErrChangelog with its reason.
type changelogError struct {
	reason string
	msg    string
}

func (e *changelogError) Error() string        { return e.msg }
func (e *changelogError) Is(target error) bool { return target == ErrChangelog }

// refusedReason returns the reason of an ErrChangelog, or "" for any other
// error.
func refusedReason(err error) string {
	var ce *changelogError
	if errors.As(err, &ce) {
		return ce.reason
	}
	return ""
}

// checkChangelog checks that the output stream, as configured in oc, keeps
// what a new owner restores a partition from: limits retention, messages
// for at least the retention a restore reads back, and no count or size
// limit that drops the oldest messages (the streams the stage creates have
// none). It is checked at start and again at every takeover, since the
// stream can be edited while the group runs.
func (g *Group) checkChangelog(oc jetstream.StreamConfig) error {
	fail := func(field, now, flags string) error {
		fix := "nats stream edit " + g.outStream + " " + flags + " --force"
		return finding.WithFix(&changelogError{reason: refusedLimits, msg: fmt.Sprintf(
			"scale-out: %v: output stream %s has %s %s; it is the changelog new owners restore partitions from, and that drops records a restore needs (fix: %s)",
			ErrChangelog, g.outStream, field, now, fix)}, fix)
	}
	switch {
	case oc.Retention != jetstream.LimitsPolicy:
		return fail("retention", oc.Retention.String(), "--retention limits")
	case oc.MaxAge != 0 && oc.MaxAge < g.retention:
		return fail("max_age", fmt.Sprintf("%v, below %s = %v", oc.MaxAge, g.terms, g.retention),
			fmt.Sprintf("--max-age %v", g.retention))
	case oc.MaxMsgsPerSubject > 0 && !(oc.Discard == jetstream.DiscardNew && oc.DiscardNewPerSubject):
		return fail("max_msgs_per_subject", fmt.Sprint(oc.MaxMsgsPerSubject), "--max-msgs-per-subject=-1")
	case oc.MaxMsgs > 0 && oc.Discard == jetstream.DiscardOld:
		return fail("max_msgs", fmt.Sprintf("%d with discard old", oc.MaxMsgs), "--max-msgs=-1")
	case oc.MaxBytes > 0 && oc.Discard == jetstream.DiscardOld:
		return fail("max_bytes", fmt.Sprintf("%d with discard old", oc.MaxBytes), "--max-bytes=-1")
	}
	return nil
}

// ErrControlSubjects is returned at start when the output or dead-letter
// stream does not hold the group's control subjects
// (changelog.ControlSubjects): the fences have no subject to be written on.
var ErrControlSubjects = errors.New("a stream has no subjects for the group's fences")

// checkControlSubjects checks that a stream, as configured in oc, whose
// messages are under prefix stores every partition's fence subject
// (changelog.FenceSubject(prefix, p)). The streams the stage creates hold
// "_dedupe.<prefix>.>" beside "<prefix>.>" (config.Config.OutputStreamSubjects,
// DeadLetterStreamSubjects); an existing stream without it is refused with
// the nats stream edit command that adds it.
func checkControlSubjects(oc jetstream.StreamConfig, prefix string, partitions int) error {
	control := changelog.ControlSubjects(prefix)
	for p := range partitions {
		fence := changelog.FenceSubject(prefix, p)
		if !slices.ContainsFunc(oc.Subjects, func(s string) bool { return server.SubjectMatchesFilter(fence, s) }) {
			subjects := append(slices.Clone(oc.Subjects), control)
			fix := fmt.Sprintf("nats stream edit %s --subjects '%s' --force", oc.Name, strings.Join(subjects, ","))
			return finding.WithFix(fmt.Errorf("scale-out: %w: stream %s has subjects %v, none of which holds %s, the fence of partition %d; add %s (fix: %s)",
				ErrControlSubjects, oc.Name, oc.Subjects, fence, p, control, fix), fix)
		}
	}
	return nil
}

// restoreStart returns where a takeover's restore reads from: the local
// cursor + 1 when the store has a cursor into this stream (at most its
// last sequence: a larger one is from a stream since deleted and made
// again), else from since = now - the output's retention.
func (g *Group) restoreStart(cursor, lastSeq uint64, now time.Time) (from uint64, since time.Time) {
	if cursor > 0 && cursor <= lastSeq {
		return cursor + 1, time.Time{}
	}
	return 0, now.Add(-g.retention)
}

// checkReach checks that the output stream, in state st, still holds every
// record a restore of p from sequence from (a cursor restore) or the
// retention's start needs, by where its first message is; it misses
// removals from the middle (docs/scale-out.md, "Code notes").
func (g *Group) checkReach(st jetstream.StreamState, p int, from uint64, now time.Time) error {
	edge := now.Add(-g.retention)
	first, firstTime := st.FirstSeq, st.FirstTime
	if st.Msgs == 0 {
		first, firstTime = st.LastSeq+1, st.LastTime
	}
	if first <= max(from, 1) || !firstTime.After(edge) {
		return nil
	}
	start := "from sequence 1 (everything since " + edge.UTC().Format(time.RFC3339) + ")"
	if from > 0 {
		start = fmt.Sprintf("from sequence %d (its local cursor + 1)", from)
	}
	return &changelogError{reason: refusedShort, msg: fmt.Sprintf(
		"scale-out: %v: output stream %s begins at sequence %d of %s, but partition %d's restore reads %s: messages removed before it (a purge, a deleted message, max_age, max_msgs or max_bytes lowered for a while) may hold records of keys still in the window, whose copies would be forwarded again. "+
			"No stream edit brings them back; the partition is refused until %s, when they are past the retention %s = %v (check with nats stream info %s that first_seq stays put and no limit drops messages)",
		ErrChangelog, g.outStream, first, firstTime.UTC().Format(time.RFC3339), p, start,
		firstTime.Add(g.retention).UTC().Format(time.RFC3339), g.terms, g.retention, g.outStream)}
}

// serverTime is the output's server's time when info was read
// (StreamInfo.TimeStamp), on the clock that the stream's max_age and
// stored timestamps run on; clock's now when the server sent none. What a
// restore reads is bounded by what the output keeps, so it is judged on
// the server's clock, not this instance's.
func serverTime(info *jetstream.StreamInfo, clock window.Clock) time.Time {
	if !info.TimeStamp.IsZero() {
		return info.TimeStamp
	}
	return clock.Now()
}
