package stage

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/dedupe-stage/dedupe-stage/internal/forward"
	"github.com/dedupe-stage/dedupe-stage/internal/retry"
	"github.com/dedupe-stage/dedupe-stage/internal/scaleout/handover"
	"github.com/dedupe-stage/dedupe-stage/internal/streams"
	"github.com/dedupe-stage/dedupe-stage/state"
)

// How the read-back at start reads (variables for the package's tests).
var (
	// readBackBatch is how many records the read-back restores into a
	// partition at once.
	readBackBatch = 1024
	// readBackIdle is how long one wait for the next message lasts.
	readBackIdle = 2 * time.Second
	// readBackStall is how long the read-back waits with no message
	// before it gives up, and the start with it.
	readBackStall = time.Minute
)

// readBackStats is what a read-back did.
type readBackStats struct {
	from, to uint64 // the sequences read, from..to; from > to: none
	target   uint64 // the last sequence on the pipeline's output subjects (lastSeqOn); 0: none
	read     int    // messages read on the pipeline's output subjects
	restored int    // keys the store did not hold, stored (state.Partition.RestoreCounted)
	skipped  int    // messages without a key a forward carries
	badTotal int    // forwards with totals on whose contribution is missing, malformed or not of this totals.bucket
	// beforeForget counts forwards of keys forgotten after them, not
	// restored.
	beforeForget int
}

// readBack restores into the store, before any batch is judged, every
// forward of this pipeline that the output stream holds after the store's
// watermark (docs/state.md, "The watermark"): a forward whose claim a
// crash left uncommitted is then a repeat after the restart, however long
// the restart took. It returns the sequence the run starts from, which it
// stores as the new watermark: every forward at or below it is in the
// store. A store without a watermark (new, or written by a version
// without one) has nothing read back.
func (src *singleSource) readBack(ctx context.Context) (uint64, error) {
	s, cfg := src.s, src.cfg
	started := time.Now()
	info, err := handover.StreamState(ctx, s.js, cfg.Output.Stream)
	if err != nil {
		return 0, fmt.Errorf("read back output stream: %w", err)
	}
	first, last := info.State.FirstSeq, info.State.LastSeq
	w, ok, err := s.store.Watermark()
	if err != nil {
		return 0, err
	}
	st := readBackStats{from: w + 1, to: last}
	switch {
	case !ok:
		s.log.Info("no watermark in the store yet (a new data dir, or one written before watermarks): the output is not read back; the watermark starts at the output's last sequence",
			"output_stream", cfg.Output.Stream, "last_seq", last)
		st.from = last + 1
	case w > last:
		s.log.Warn("the output stream ends before the store's watermark (the stream was recreated or reset?): reading it all back",
			"output_stream", cfg.Output.Stream, "watermark", w, "first_seq", first, "last_seq", last)
		st.from = first
	}
	if st.from <= st.to {
		if err := src.readRange(ctx, &st); err != nil {
			return 0, err
		}
	}
	if !ok || last != w {
		if err := s.store.SetWatermark(last); err != nil {
			return 0, err
		}
	}
	s.metrics.StartRestored.Add(float64(st.restored))
	if ok {
		s.log.Info("read the output back after the watermark", "output_stream", cfg.Output.Stream, "watermark", w,
			"from_seq", st.from, "to_seq", st.to, "target_seq", st.target, "messages_read", st.read, "records_restored", st.restored,
			"skipped_without_key", st.skipped, "skipped_malformed_total", st.badTotal, "skipped_before_forget", st.beforeForget, "took", time.Since(started).Round(time.Millisecond))
	}
	return last, nil
}

// readSubjects returns the output subjects of this pipeline's forwards:
// the consumer's filter subjects, else the input stream's subjects, under
// the output prefix (config.Output.Subject); else every output subject.
func (src *singleSource) readSubjects(ctx context.Context) ([]string, error) {
	cc := src.cons.CachedInfo().Config
	in := cc.FilterSubjects
	if cc.FilterSubject != "" {
		in = []string{cc.FilterSubject}
	}
	if len(in) == 0 {
		st, err := src.s.js.Stream(ctx, src.cfg.Input.Stream)
		if err != nil {
			return nil, fmt.Errorf("read back: input stream %s: %w", src.cfg.Input.Stream, err)
		}
		in = st.CachedInfo().Config.Subjects
	}
	if len(in) == 0 {
		return []string{src.cfg.Output.Subjects()}, nil
	}
	out := make([]string, len(in))
	for i, sub := range in {
		out[i] = src.cfg.Output.Subject(sub)
	}
	return out, nil
}

// readRange reads st.from..st.to of the output stream on the pipeline's
// subjects with an ordered consumer and restores each forward into its
// partition. It first sets st.target: the read ends when a message at or
// past it is delivered, not when the consumer has nothing pending, since
// the consumer may sit on a replica that has not applied every message
// the leader stored.
func (src *singleSource) readRange(ctx context.Context, st *readBackStats) error {
	subjects, err := src.readSubjects(ctx)
	if err != nil {
		return err
	}
	if st.target, err = lastSeqOn(ctx, src.s.js, src.cfg.Output.Stream, subjects); err != nil {
		return err
	}
	if st.target < st.from {
		return nil // nothing on the pipeline's subjects after the watermark
	}
	end := min(st.to, st.target)
	it, err := src.openReader(ctx, subjects, st.from)
	if err != nil {
		return err
	}
	defer it.Stop()
	stop := context.AfterFunc(ctx, it.Stop)
	defer stop()
	stream := src.cfg.Output.Stream
	rs := &restorer{store: src.s.store, parts: make([][]state.Restored, src.s.store.Partitions()), st: st}
	if src.cfg.Totals.Enabled {
		rs.bucket = src.cfg.Totals.Bucket.D()
	}
	last := st.from - 1
	heard := time.Now()
	for {
		m, err := it.Next(jetstream.NextMaxWait(readBackIdle))
		if errors.Is(err, nats.ErrTimeout) {
			if quiet := time.Since(heard); quiet > readBackStall {
				return fmt.Errorf("read back output stream %s: no message for %v after sequence %d, reading to sequence %d", stream, quiet.Round(time.Second), last, end)
			}
			continue
		}
		if err != nil {
			return fmt.Errorf("read back output stream %s: %w", stream, errors.Join(ctx.Err(), err))
		}
		heard = time.Now()
		md, err := m.Metadata()
		if err != nil {
			return fmt.Errorf("read back output stream %s: %w", stream, err)
		}
		seq := md.Sequence.Stream
		if seq <= last {
			continue // read again after the ordered consumer was reset
		}
		last = seq
		if seq > end {
			break
		}
		if err := rs.add(m, md, seq); err != nil {
			return err
		}
		if seq == end {
			break
		}
	}
	return rs.flushAll()
}

// openReader opens an ordered consumer of subjects of the output stream
// from sequence from and its message iterator.
func (src *singleSource) openReader(ctx context.Context, subjects []string, from uint64) (jetstream.MessagesContext, error) {
	s := src.s
	var cons jetstream.Consumer
	octx, cancel := context.WithTimeout(ctx, streams.SetUpTimeout)
	defer cancel()
	err := retry.Do(octx, "read back", func() error {
		c, err := s.js.OrderedConsumer(octx, src.cfg.Output.Stream, jetstream.OrderedConsumerConfig{
			FilterSubjects: subjects, DeliverPolicy: jetstream.DeliverByStartSequencePolicy, OptStartSeq: from})
		if err != nil {
			return err
		}
		if _, err := c.Info(octx); err != nil {
			return err
		}
		cons = c
		return nil
	}, retry.Options{})
	if err != nil {
		return nil, fmt.Errorf("read back output stream %s from sequence %d: %w", src.cfg.Output.Stream, from, err)
	}
	it, err := cons.Messages(jetstream.PullMaxMessages(readBackBatch))
	if err != nil {
		return nil, fmt.Errorf("read back output stream %s: %w", src.cfg.Output.Stream, err)
	}
	return it, nil
}

// lastSeqOn returns the highest sequence of a message on subjects
// (wildcards allowed) in stream, as the stream's leader stores it: 0 when
// none is. It asks the leader (forward.LastOnLeader), not any replica as a
// direct get may, which answers from what it has applied.
func lastSeqOn(ctx context.Context, js jetstream.JetStream, stream string, subjects []string) (uint64, error) {
	octx, cancel := context.WithTimeout(ctx, streams.SetUpTimeout)
	defer cancel()
	var last uint64
	for _, sub := range subjects {
		var seq uint64
		err := retry.Do(octx, "read back", func() error {
			rctx, cancel := context.WithTimeout(octx, streams.RequestTimeout)
			defer cancel()
			m, err := forward.LastOnLeader(rctx, js, stream, sub)
			switch {
			case errors.Is(err, jetstream.ErrMsgNotFound):
				seq = 0
			case err != nil:
				return err
			default:
				seq = m.Sequence
			}
			return nil
		}, retry.Options{})
		if err != nil {
			return 0, fmt.Errorf("read back output stream %s: last message on %s: %w", stream, sub, err)
		}
		last = max(last, seq)
	}
	return last, nil
}

// restorer gathers the records read back per partition and restores them
// readBackBatch at a time.
type restorer struct {
	store  *state.Store
	parts  [][]state.Restored
	st     *readBackStats
	bucket time.Duration // totals.bucket; 0: totals off, and a forward's contribution is not kept
}

// add takes the forward m, stored at seq, into its partition's records.
func (rs *restorer) add(m jetstream.Msg, md *jetstream.MsgMetadata, seq uint64) error {
	rs.st.read++
	r, ok, badTotal := restoredOf(m, md, seq)
	if !ok {
		if badTotal {
			rs.st.badTotal++
		} else {
			rs.st.skipped++
		}
		return nil
	}
	// The partition the key's copies are judged in (source.go deliver): by
	// the group with totals on, by the key otherwise. A forward that does
	// not fit this totals config is not restored; its input's copy, if it
	// comes back, is judged and counted instead.
	route := r.Key
	switch g := r.Total.Group; {
	case rs.bucket == 0:
		r.Total = state.Contribution{} // written with totals on, read with totals off
	case g == "" || len(g) > state.MaxGroupSize || !r.Total.Bucket.Equal(state.BucketOf(r.Total.Bucket, rs.bucket)):
		rs.st.badTotal++
		return nil
	default:
		route = []byte(g)
	}
	p := state.PartitionOf(route, len(rs.parts))
	if skip, err := rs.held(p, r, m.Headers()); err != nil || skip {
		return err
	}
	rs.parts[p] = append(rs.parts[p], r)
	if len(rs.parts[p]) < readBackBatch {
		return nil
	}
	return rs.flush(p)
}

// held reports whether the store needs nothing of r, the forward with
// headers h read back into partition p: it holds r's key inside the
// window (at r's version or a greater one), whatever the two clocks say
// of r's first-seen time; or it holds the key forgotten after r, which
// restored would undo the forget. A forward after a forget carries the
// forget's time (handover.HeaderForgotten), so this needs no clock.
func (rs *restorer) held(p int, r state.Restored, h nats.Header) (bool, error) {
	res, err := rs.store.Partition(p).Lookup(r.Key)
	if err != nil {
		return false, fmt.Errorf("read back: look up key %q: %w", r.Key, err)
	}
	if res.Found {
		return !r.HasVersion || !res.Record.OlderThan(r.Version), nil
	}
	if res.Forgotten.IsZero() {
		return false, nil
	}
	ns, err := strconv.ParseInt(h.Get(handover.HeaderForgotten), 10, 64)
	if err != nil || time.Unix(0, ns).Before(res.Forgotten) {
		rs.st.beforeForget++
		return true, nil
	}
	return false, nil
}

// flush restores partition p's records gathered.
func (rs *restorer) flush(p int) error {
	if len(rs.parts[p]) == 0 {
		return nil
	}
	n, err := rs.store.Partition(p).RestoreCounted(rs.parts[p], 0)
	if err != nil {
		return fmt.Errorf("read back: restore: %w", err)
	}
	rs.st.restored += n
	rs.parts[p] = rs.parts[p][:0]
	return nil
}

// flushAll restores every partition's records gathered.
func (rs *restorer) flushAll() error {
	for p := range rs.parts {
		if err := rs.flush(p); err != nil {
			return err
		}
	}
	return nil
}

// restoredOf returns the record the forward m, stored at seq, makes: its
// key and version (handover.ForwardKey), the fingerprint of its body (the
// input's), its stored time as the first-seen time, and with totals on
// what it added to a total (handover.DecodeTotal). ok is false when m
// carries no key a forward carries, or (badTotal) a malformed
// contribution, which is never guessed.
func restoredOf(m jetstream.Msg, md *jetstream.MsgMetadata, seq uint64) (r state.Restored, ok, badTotal bool) {
	h := m.Headers()
	key, version, versioned, err := handover.ForwardKey(h)
	if err != nil || key == "" || len(key) > state.MaxKeySize || md.Timestamp.IsZero() {
		return state.Restored{}, false, false
	}
	group, bucket, value, err := handover.DecodeTotal(h)
	if err != nil {
		return state.Restored{}, false, true
	}
	return state.Restored{Key: []byte(key), Fingerprint: fingerprint(m.Data()), FirstSeen: md.Timestamp, Seq: seq, OutputSeq: seq,
		Version: version, HasVersion: versioned, Total: state.Contribution{Group: group, Bucket: bucket, Value: value}, Own: true}, true, false
}
