// Package history measures the dedupe window from the input stream's
// history, for `dedupe-stage analyze`: it reads the input stream with an
// ordered consumer (read only: no durable consumer, nothing written to
// any stream), judges each message's key, scope and version with the
// function the caller gives (run's), and reports the ages of the repeats
// by the input's clock (the stream's stored timestamps), the dead letters
// run would make, and how many repeats each candidate window would
// forward again, with the state it needs. It takes plain values: the
// command wires the configuration in.
package history

import (
	"container/heap"
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/dedupe-stage/dedupe-stage/internal/changelog"
)

// Verdict is what run reads of a message before any state: its key and
// version, or the dead letter it makes.
type Verdict struct {
	// Key is the message's key, with its scope.
	Key []byte
	// Version is its version when Versioned (key.version).
	Version   uint64
	Versioned bool
	// Reason, when not "", is the dead-letter reason; Detail says why.
	Reason, Detail string
}

// Sizing is what a window needs at the measured key rate.
type Sizing struct {
	ExpectedKeys uint64 `json:"expected_keys"`
	FilterBytes  uint64 `json:"filter_bytes"`
	MemoryBytes  uint64 `json:"memory_bytes"`
	DiskBytes    uint64 `json:"disk_bytes"`
	// Error says why the filter cannot be built at that size.
	Error string `json:"error,omitempty"`
}

// Candidate is a window analyze weighs.
type Candidate struct {
	// Name says where W comes from: "configured", "path client-retry", ...
	Name string
	W    time.Duration
}

// Options configure Run.
type Options struct {
	// Stream is the input stream; FilterSubject, if not "", the subjects
	// run reads of it.
	Stream, FilterSubject string
	// FromSeq, if not 0, is the first sequence to read; else Since, if not
	// zero, the first time; else the whole stream.
	FromSeq uint64
	Since   time.Time
	// Judge reads a message's key, scope and version as run does, or its
	// dead letter. Required.
	Judge func(subject string, hdr nats.Header, data []byte) Verdict
	// Refresh: window.refresh_on_repeat, a repeat's age is measured from
	// its key's last copy instead of its first.
	Refresh bool
	// MismatchIsRepeat: a repeat whose payload differs from its key's
	// first copy is a repeat (pipeline.on_fingerprint_mismatch repeat),
	// else a fingerprint_mismatch dead letter.
	MismatchIsRepeat bool
	// W is the configured window; Candidates are the others to weigh
	// (the windows catching 99.9 % and 100 % of the repeats are added).
	W          time.Duration
	Candidates []Candidate
	// Size sizes a window at keysPerSecond new keys of keyBytes bytes.
	Size func(w time.Duration, keysPerSecond, keyBytes float64) Sizing
	// TempDir is where the temporary key store and ages file go ("": the
	// system's); both are removed when Run returns.
	TempDir string
	// Slowest is how many of the slowest repeats to list. Default 10.
	Slowest int
	// Progress, if set, is called now and then with the messages read and
	// the messages to read.
	Progress func(done, total uint64)
}

// DeadLetters are the dead letters of one reason.
type DeadLetters struct {
	Reason  string `json:"reason"`
	Count   uint64 `json:"count"`
	Example Sample `json:"example"`
}

// Sample is one message of the history.
type Sample struct {
	Seq     uint64    `json:"seq"`
	Subject string    `json:"subject"`
	Time    time.Time `json:"time"`
	Key     string    `json:"key,omitempty"`
	Detail  string    `json:"detail,omitempty"`
}

// Repeat is one repeat and its age.
type Repeat struct {
	Sample
	// FirstSeq is the sequence of the copy its age is measured from.
	FirstSeq uint64 `json:"first_seq"`
	// Age is by the input's clock, in nanoseconds.
	Age time.Duration `json:"age_ns"`
}

// Ages are the repeat ages, in nanoseconds in JSON. The percentiles are
// within RelativeError (0 below 1 ms); Max is exact.
type Ages struct {
	P50  time.Duration `json:"p50_ns"`
	P90  time.Duration `json:"p90_ns"`
	P99  time.Duration `json:"p99_ns"`
	P999 time.Duration `json:"p99_9_ns"`
	Max  time.Duration `json:"max_ns"`
	// RelativeError bounds the percentiles' error.
	RelativeError float64 `json:"relative_error"`
	// Histogram counts the ages by range, exactly.
	Histogram []Bar `json:"histogram"`
}

// Bar is the repeats of ages in [From, To).
type Bar struct {
	From  time.Duration `json:"from_ns"`
	To    time.Duration `json:"to_ns"`
	Count uint64        `json:"count"`
}

// Window is one candidate W and what it does with the history.
type Window struct {
	Name string        `json:"name"`
	W    time.Duration `json:"w_ns"`
	// ForwardedAgain is how many repeats are as old as W or older: run
	// forwards each of them again (one after another copy forwarded again
	// may be caught by the window that copy starts: an upper bound then).
	ForwardedAgain uint64  `json:"forwarded_again"`
	Share          float64 `json:"share"` // of the repeats
	Sizing         Sizing  `json:"sizing"`
}

// Report is what analyze found.
type Report struct {
	Stream   string    `json:"stream"`
	FirstSeq uint64    `json:"first_seq"`
	LastSeq  uint64    `json:"last_seq"`
	First    time.Time `json:"first_time"`
	Last     time.Time `json:"last_time"`
	Messages uint64    `json:"messages"`
	// Keys are the distinct keys; NewVersions the copies forwarded as a
	// newer version of a key seen before.
	Keys        uint64 `json:"distinct_keys"`
	NewVersions uint64 `json:"new_versions"`
	Repeats     uint64 `json:"repeats"`
	// DeadLetters by reason, the most first.
	DeadLetters []DeadLetters `json:"dead_letters"`
	// KeysPerSecond is the rate of new keys by the input's clock;
	// KeyBytes the keys' mean length.
	KeysPerSecond float64  `json:"keys_per_second"`
	KeyBytes      float64  `json:"key_bytes"`
	Ages          Ages     `json:"ages"`
	Slowest       []Repeat `json:"slowest"`
	// Windows: the configured W first, then the candidates by W.
	Windows        []Window `json:"windows"`
	Recommendation string   `json:"recommendation"`
}

// slowHeap keeps the slowest repeats: a min-heap by age.
type slowHeap []Repeat

func (h slowHeap) Len() int           { return len(h) }
func (h slowHeap) Less(i, j int) bool { return h[i].Age < h[j].Age }
func (h slowHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *slowHeap) Push(x any)        { *h = append(*h, x.(Repeat)) }
func (h *slowHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// analyzer judges the history one message at a time.
type analyzer struct {
	o        Options
	store    *keyStore
	ages     *agesFile
	hist     histogram
	slow     slowHeap
	dead     map[string]*DeadLetters
	rep      Report
	keyBytes uint64
}

func newAnalyzer(o Options) (*analyzer, error) {
	if o.Slowest <= 0 {
		o.Slowest = 10
	}
	st, err := openKeyStore(o.TempDir)
	if err != nil {
		return nil, err
	}
	ages, err := newAgesFile(o.TempDir)
	if err != nil {
		_ = st.close()
		return nil, err
	}
	return &analyzer{o: o, store: st, ages: ages, dead: map[string]*DeadLetters{}}, nil
}

func (a *analyzer) close() error {
	return errors.Join(a.store.close(), a.ages.close())
}

// add judges one message, stored at seq at time at.
func (a *analyzer) add(seq uint64, at time.Time, subject string, hdr nats.Header, data []byte) error {
	r := &a.rep
	if r.Messages == 0 {
		r.FirstSeq, r.First = seq, at
	}
	r.Messages++
	r.LastSeq, r.Last = seq, at
	v := a.o.Judge(subject, hdr, data)
	if v.Reason != "" {
		a.deadLetter(v.Reason, Sample{Seq: seq, Subject: subject, Time: at, Key: string(v.Key), Detail: v.Detail})
		return nil
	}
	fp := changelog.Fingerprint(data)
	rec, found, err := a.store.get(v.Key)
	if err != nil {
		return err
	}
	fresh := record{at: at.UnixNano(), seq: seq, fp: fp, version: v.Version, versioned: v.Versioned}
	switch {
	case !found:
		r.Keys++
		a.keyBytes += uint64(len(v.Key))
		return a.store.put(v.Key, fresh)
	case v.Versioned && (!rec.versioned || rec.version < v.Version):
		r.NewVersions++
		return a.store.put(v.Key, fresh)
	case rec.fp != fp && (!v.Versioned || rec.version == v.Version) && !a.o.MismatchIsRepeat:
		a.deadLetter("fingerprint_mismatch", Sample{Seq: seq, Subject: subject, Time: at, Key: string(v.Key),
			Detail: fmt.Sprintf("key first seen %s with payload fingerprint %016x; this payload has %016x",
				time.Unix(0, rec.at).UTC().Format(time.RFC3339Nano), rec.fp, fp)})
		return nil
	}
	age := max(at.Sub(time.Unix(0, rec.at)), 0)
	r.Repeats++
	a.hist.add(age)
	if err := a.ages.add(age); err != nil {
		return fmt.Errorf("history: write ages file: %w", err)
	}
	if len(a.slow) < a.o.Slowest || age > a.slow[0].Age {
		heap.Push(&a.slow, Repeat{Sample: Sample{Seq: seq, Subject: subject, Time: at, Key: string(v.Key)}, FirstSeq: rec.seq, Age: age})
		if len(a.slow) > a.o.Slowest {
			heap.Pop(&a.slow)
		}
	}
	if a.o.Refresh {
		rec.at, rec.seq = at.UnixNano(), seq
		return a.store.put(v.Key, rec)
	}
	return nil
}

func (a *analyzer) deadLetter(reason string, s Sample) {
	d := a.dead[reason]
	if d == nil {
		d = &DeadLetters{Reason: reason, Example: s}
		a.dead[reason] = d
	}
	d.Count++
}

// histogramEdges are the edges of the terminal histogram's bars; the
// report shows those from the first bar holding a repeat to the last.
var histogramEdges = []time.Duration{0, time.Millisecond, 10 * time.Millisecond, 100 * time.Millisecond,
	time.Second, 10 * time.Second, time.Minute, 5 * time.Minute, 15 * time.Minute, 30 * time.Minute, time.Hour,
	2 * time.Hour, 6 * time.Hour, 12 * time.Hour, 24 * time.Hour, 3 * 24 * time.Hour, 7 * 24 * time.Hour,
	30 * 24 * time.Hour, math.MaxInt64}

// finish computes the report once every message is added.
func (a *analyzer) finish() (Report, error) {
	r := a.rep
	for _, d := range a.dead {
		r.DeadLetters = append(r.DeadLetters, *d)
	}
	slices.SortFunc(r.DeadLetters, func(x, y DeadLetters) int {
		if x.Count != y.Count {
			return int(y.Count) - int(x.Count)
		}
		return compareStrings(x.Reason, y.Reason)
	})
	if r.Keys > 0 {
		r.KeyBytes = float64(a.keyBytes) / float64(r.Keys)
	}
	if span := r.Last.Sub(r.First); span > 0 {
		r.KeysPerSecond = float64(r.Keys+r.NewVersions) / span.Seconds()
	}
	h := &a.hist
	r.Ages = Ages{P50: h.quantile(0.5), P90: h.quantile(0.9), P99: h.quantile(0.99), P999: h.quantile(0.999),
		Max: h.max, RelativeError: RelativeError}
	r.Slowest = append([]Repeat(nil), a.slow...)
	slices.SortFunc(r.Slowest, func(x, y Repeat) int {
		if x.Age != y.Age {
			return int(y.Age - x.Age)
		}
		return int(x.Seq) - int(y.Seq)
	})

	cands := []Candidate{{Name: "configured", W: a.o.W}}
	cands = append(cands, a.o.Candidates...)
	if r.Repeats > 0 {
		cands = append(cands, Candidate{Name: "catches 99.9 %", W: roundUp(h.catching(0.999))},
			Candidate{Name: "catches 100 %", W: roundUp(h.max + 1)})
	}
	counts, bars, err := a.countAges(cands)
	if err != nil {
		return r, err
	}
	r.Ages.Histogram = shownBars(bars)
	for i, c := range cands {
		w := Window{Name: c.Name, W: c.W, ForwardedAgain: counts[i]}
		if r.Repeats > 0 {
			w.Share = float64(counts[i]) / float64(r.Repeats)
		}
		if a.o.Size != nil {
			w.Sizing = a.o.Size(c.W, r.KeysPerSecond, r.KeyBytes)
		}
		r.Windows = append(r.Windows, w)
	}
	slices.SortStableFunc(r.Windows[1:], func(x, y Window) int { return compareDurations(x.W, y.W) })
	r.Recommendation = recommend(r)
	return r, nil
}

// countAges reads the ages back: for each candidate, how many repeats are
// as old as its W or older; for each bar of histogramEdges, how many ages
// it holds.
func (a *analyzer) countAges(cands []Candidate) (counts, bars []uint64, err error) {
	counts = make([]uint64, len(cands))
	bars = make([]uint64, len(histogramEdges)-1)
	err = a.ages.each(func(age time.Duration) {
		for i, c := range cands {
			if age >= c.W {
				counts[i]++
			}
		}
		i, _ := slices.BinarySearch(histogramEdges, age+1)
		bars[i-1]++
	})
	return counts, bars, err
}

// shownBars are the bars from the first holding an age to the last.
func shownBars(bars []uint64) []Bar {
	first, last := -1, -1
	for i, n := range bars {
		if n > 0 {
			if first < 0 {
				first = i
			}
			last = i
		}
	}
	var out []Bar
	for i := first; i >= 0 && i <= last; i++ {
		out = append(out, Bar{From: histogramEdges[i], To: histogramEdges[i+1], Count: bars[i]})
	}
	return out
}

func compareStrings(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

func compareDurations(a, b time.Duration) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// roundUp rounds d up to a W easy to read and configure: tens of
// milliseconds up to a second, whole seconds up to a minute, whole minutes under an hour, ten minutes under a day,
// whole hours beyond.
func roundUp(d time.Duration) time.Duration {
	var unit time.Duration
	switch {
	case d <= time.Second:
		unit = 10 * time.Millisecond
	case d <= time.Minute:
		unit = time.Second
	case d <= time.Hour:
		unit = time.Minute
	case d <= 24*time.Hour:
		unit = 10 * time.Minute
	default:
		unit = time.Hour
	}
	if r := d % unit; r != 0 {
		d += unit - r
	}
	return max(d, 10*time.Millisecond)
}

// recommend is the report's one line.
func recommend(r Report) string {
	if r.Repeats == 0 {
		return fmt.Sprintf("no repeats in %s messages: the history does not measure W; your W %s stands on its paths alone",
			Count(r.Messages), FormatDuration(r.Windows[0].W))
	}
	var all Window
	for _, w := range r.Windows {
		if w.Name == "catches 100 %" {
			all = w
		}
	}
	cfg := r.Windows[0]
	if cfg.ForwardedAgain == 0 {
		return fmt.Sprintf("your W %s catches every repeat seen (the slowest came after %s); W %s would too",
			FormatDuration(cfg.W), FormatDuration(r.Ages.Max), FormatDuration(all.W))
	}
	return fmt.Sprintf("W %s catches every repeat seen; your W %s forwards %s again (%s)",
		FormatDuration(all.W), FormatDuration(cfg.W), Count(cfg.ForwardedAgain), Percent(cfg.Share))
}

// Run reads the input stream's history as o says and reports on it. It
// writes to no stream and leaves no consumer behind: its ordered consumer
// is deleted when it returns (and expires on the server if the process
// dies first).
func Run(ctx context.Context, js jetstream.JetStream, o Options) (rep Report, err error) {
	if o.Judge == nil {
		return rep, errors.New("history: Options.Judge is nil")
	}
	st, err := js.Stream(ctx, o.Stream)
	if err != nil {
		return rep, fmt.Errorf("input stream %s: %w", o.Stream, err)
	}
	info, err := st.Info(ctx)
	if err != nil {
		return rep, fmt.Errorf("input stream %s: %w", o.Stream, err)
	}
	a, err := newAnalyzer(o)
	if err != nil {
		return rep, err
	}
	defer func() { err = errors.Join(err, a.close()) }()
	a.rep.Stream = o.Stream
	if err := read(ctx, st, info, o, a); err != nil {
		return rep, err
	}
	return a.finish()
}

// read feeds a every message of the selection that the stream holds now.
func read(ctx context.Context, st jetstream.Stream, info *jetstream.StreamInfo, o Options, a *analyzer) error {
	last := info.State.LastSeq
	if info.State.Msgs == 0 || (o.FromSeq > last) {
		return nil
	}
	cc := jetstream.OrderedConsumerConfig{NamePrefix: "dedupe-analyze", InactiveThreshold: time.Minute, MaxResetAttempts: 5}
	if o.FilterSubject != "" {
		cc.FilterSubjects = []string{o.FilterSubject}
	}
	switch {
	case o.FromSeq > 0:
		cc.DeliverPolicy, cc.OptStartSeq = jetstream.DeliverByStartSequencePolicy, o.FromSeq
	case !o.Since.IsZero():
		t := o.Since
		cc.DeliverPolicy, cc.OptStartTime = jetstream.DeliverByStartTimePolicy, &t
	default:
		cc.DeliverPolicy = jetstream.DeliverAllPolicy
	}
	c, err := st.OrderedConsumer(ctx, cc)
	if err != nil {
		return fmt.Errorf("ordered consumer on %s: %w", o.Stream, err)
	}
	it, err := c.Messages(jetstream.PullMaxMessages(4096))
	if err != nil {
		return fmt.Errorf("read %s: %w", o.Stream, err)
	}
	defer func() {
		it.Stop()
		if ci := c.CachedInfo(); ci != nil {
			dctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_ = st.DeleteConsumer(dctx, ci.Name) // else it expires after its InactiveThreshold
		}
	}()
	ci, err := c.Info(ctx)
	if err != nil {
		return fmt.Errorf("read %s: %w", o.Stream, err)
	}
	total := ci.NumPending
	if total == 0 {
		return nil
	}
	var done uint64
	progressEvery := max(total/1000, 1)
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		m, err := it.Next()
		if err != nil {
			return fmt.Errorf("read %s after %d messages: %w", o.Stream, done, err)
		}
		md, err := m.Metadata()
		if err != nil {
			return fmt.Errorf("read %s: %w", o.Stream, err)
		}
		if err := a.add(md.Sequence.Stream, md.Timestamp, m.Subject(), m.Headers(), m.Data()); err != nil {
			return err
		}
		done++
		if o.Progress != nil && done%progressEvery == 0 {
			o.Progress(done, total)
		}
		if md.NumPending == 0 || md.Sequence.Stream >= last {
			if o.Progress != nil {
				o.Progress(done, done)
			}
			return nil
		}
	}
}
