package route

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// A bundle is one routed message carrying the routed copies of several
// inputs of one partition, so that they cost one write, delivery and ack
// (docs/scale-out.md §3.2); its payload forms 1 and 2 are specified in
// docs/scale-out.md, "Code notes".
const (
	// HeaderBundle marks a routed message that is a bundle; its value is
	// the payload's form, "1" or "2".
	HeaderBundle = "Dedupe-Bundle"
	// BundleForm1 and BundleForm2 are the bundle forms this version writes
	// and reads.
	BundleForm1 = 1
	BundleForm2 = 2
)

// ErrNotABundle means a routed message marked as a bundle cannot be read:
// an unknown form or a malformed payload. Reading it again gives the same
// answer.
var ErrNotABundle = errors.New("route: malformed bundle")

// IsBundle reports whether a routed message with headers h is a bundle.
func IsBundle(h nats.Header) bool { return h.Get(HeaderBundle) != "" }

// BundleID returns the Nats-Msg-Id of a bundle carrying the inputs at
// seqs of stream: route-bundle:<stream>:<first seq>:<n>:<digest>, the
// digest a SHA-256 of every sequence. Two bundles get one id only when
// they carry the same inputs, so the routed stream's duplicate window
// drops a bundle routed again after a redelivery and keeps one whose
// inputs differ (a redelivered input in a new bundle is judged a repeat).
// The id does not depend on the form: a bundle routed again in another
// form (the group's forms changed) carries the same inputs.
func BundleID(stream string, seqs []uint64) string {
	h := sha256.New()
	var b [8]byte
	for _, s := range seqs {
		binary.BigEndian.PutUint64(b[:], s)
		h.Write(b[:])
	}
	sum := h.Sum(nil)
	return "route-bundle:" + stream + ":" + strconv.FormatUint(seqs[0], 10) + ":" + strconv.Itoa(len(seqs)) + ":" + hex.EncodeToString(sum[:16])
}

// entry is one input a bundle carries. seq, at and key are form 2's
// fields.
type entry struct {
	subject string // the input's subject
	header  nats.Header
	data    []byte
	seq     uint64
	at      int64 // the input's time, Unix nanoseconds
	key     string
}

// appendString appends s, length first.
func appendString(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

// keepAll leaves out no header (appendHeader).
func keepAll(string) bool { return false }

// appendHeader appends h's keys and values, leaving out the keys drop
// reports.
func appendHeader(b []byte, h nats.Header, drop func(string) bool) []byte {
	n := len(h)
	for k := range h {
		if drop(k) {
			n--
		}
	}
	b = binary.AppendUvarint(b, uint64(n))
	for k, vs := range h {
		if drop(k) {
			continue
		}
		b = appendString(b, k)
		b = binary.AppendUvarint(b, uint64(len(vs)))
		for _, v := range vs {
			b = appendString(b, v)
		}
	}
	return b
}

// appendBundle appends the form-1 bundle payload of copies (routed copies
// whose input subjects are inputs) to b.
func appendBundle(b []byte, copies []*nats.Msg, inputs []string) []byte {
	b = append(b, BundleForm1)
	b = binary.AppendUvarint(b, uint64(len(copies)))
	for i, m := range copies {
		b = appendString(b, inputs[i])
		b = appendHeader(b, m.Header, keepAll)
		b = binary.AppendUvarint(b, uint64(len(m.Data)))
		b = append(b, m.Data...)
	}
	return b
}

// appendBundle2 appends the form-2 bundle payload of es, inputs of stream,
// to b; the keys drop reports are left out of their headers.
func appendBundle2(b []byte, stream string, es []entry, drop func(string) bool) []byte {
	b = append(b, BundleForm2)
	b = appendString(b, stream)
	b = binary.AppendUvarint(b, uint64(len(es)))
	for _, e := range es {
		b = appendString(b, e.subject)
		b = binary.AppendUvarint(b, e.seq)
		b = binary.AppendVarint(b, e.at)
		b = appendString(b, e.key)
		b = appendHeader(b, e.header, drop)
		b = binary.AppendUvarint(b, uint64(len(e.data)))
		b = append(b, e.data...)
	}
	return b
}

// bundleOverhead bounds the bytes of a bundle of inputs of stream besides
// its entries: its headers (HeaderBundle, its Nats-Msg-Id, the header
// block's framing) and the payload's form, stream and count.
func bundleOverhead(stream string) int {
	return 160 + 2*len(stream)
}

// headerBound bounds what appendHeader adds for h.
func headerBound(h nats.Header) int {
	n := binary.MaxVarintLen64
	for k, vs := range h {
		n += 2*binary.MaxVarintLen64 + len(k)
		for _, v := range vs {
			n += binary.MaxVarintLen64 + len(v)
		}
	}
	return n
}

// bundleSize is what appendBundle adds for m, a copy of an input on
// subject, at most.
func bundleSize(m *nats.Msg, subject string) int {
	return 2*binary.MaxVarintLen64 + len(subject) + len(m.Data) + headerBound(m.Header)
}

// bundleSize2 is what appendBundle2 adds for e at most.
func bundleSize2(e entry) int {
	return 5*binary.MaxVarintLen64 + len(e.subject) + len(e.key) + len(e.data) + headerBound(e.header)
}

// decodeBundle reads a bundle's payload, either form; stream is form 2's
// input stream ("" for form 1). Each entry's header has room for room
// more keys. Its allocations do not grow with an entry's headers: an
// entry's subject, key, header keys and values are substrings of one
// string, a copy of the entry's bytes before its payload; the values of
// every header share one slice; and each payload is a subslice of b.
func decodeBundle(b []byte, room int) (es []entry, stream string, err error) {
	if len(b) == 0 || (b[0] != BundleForm1 && b[0] != BundleForm2) {
		return nil, "", fmt.Errorf("%w: unknown form", ErrNotABundle)
	}
	r := &bundleReader{b: b, at: 1, form: b[0], room: room, spans: make([][2]int, 0, 32), counts: make([]int, 0, 16)}
	if r.form == BundleForm2 {
		if !r.span() {
			return nil, "", fmt.Errorf("%w: truncated stream", ErrNotABundle)
		}
		stream = string(b[r.spans[0][0]:r.spans[0][1]])
	}
	count, ok := r.num()
	if !ok || count == 0 || count > uint64(len(b)-r.at) {
		return nil, "", fmt.Errorf("%w: bad count", ErrNotABundle)
	}
	out := make([]entry, 0, count)
	for i := range count {
		e, err := r.entry(int(count - i))
		if err != nil {
			return nil, "", fmt.Errorf("%w: %s", ErrNotABundle, err)
		}
		out = append(out, e)
	}
	if r.at != len(b) {
		return nil, "", fmt.Errorf("%w: trailing bytes", ErrNotABundle)
	}
	return out, stream, nil
}

// bundleReader reads a bundle's payload b from at.
type bundleReader struct {
	b      []byte
	at     int
	form   byte
	room   int      // more keys each entry's header has room for
	spans  [][2]int // the entry's strings: subject, form 2's key, then per header its key and values
	counts []int    // the entry's values per header
	vals   []string // the values of the headers read, shared
}

// num reads a uvarint.
func (r *bundleReader) num() (uint64, bool) {
	v, n := binary.Uvarint(r.b[r.at:])
	if n <= 0 {
		return 0, false
	}
	r.at += n
	return v, true
}

// span reads a length-prefixed string's bounds into r.spans.
func (r *bundleReader) span() bool {
	l, ok := r.num()
	if !ok || l > uint64(len(r.b)-r.at) {
		return false
	}
	r.spans = append(r.spans, [2]int{r.at, r.at + int(l)})
	r.at += int(l)
	return true
}

// fields reads form 2's sequence, time and key (into r.spans) into e.
func (r *bundleReader) fields(e *entry) error {
	var ok bool
	if e.seq, ok = r.num(); !ok {
		return errors.New("truncated sequence")
	}
	at, n := binary.Varint(r.b[r.at:])
	if n <= 0 {
		return errors.New("truncated time")
	}
	r.at, e.at = r.at+n, at
	if !r.span() {
		return errors.New("truncated key")
	}
	return nil
}

// headers reads an entry's header keys and values into r.spans and
// r.counts, and returns how many keys.
func (r *bundleReader) headers() (uint64, error) {
	keys, ok := r.num()
	if !ok || keys > uint64(len(r.b)-r.at) {
		return 0, errors.New("bad header count")
	}
	for range keys {
		ok := r.span()
		nv, ok2 := r.num()
		if !ok || !ok2 || nv > uint64(len(r.b)-r.at) {
			return 0, errors.New("truncated header")
		}
		r.counts = append(r.counts, int(nv))
		for range nv {
			if !r.span() {
				return 0, errors.New("truncated header value")
			}
		}
	}
	return keys, nil
}

// entry reads the next entry, left counting it: one of the entries still
// to read, which sizes the values' slice.
func (r *bundleReader) entry(left int) (entry, error) {
	var e entry
	from := r.at
	r.spans, r.counts = r.spans[:0], r.counts[:0]
	if !r.span() {
		return entry{}, errors.New("truncated subject")
	}
	keysFrom := 1 // r.spans index of the first header key
	if r.form == BundleForm2 {
		if err := r.fields(&e); err != nil {
			return entry{}, err
		}
		keysFrom = 2
	}
	keys, err := r.headers()
	if err != nil {
		return entry{}, err
	}
	text := string(r.b[from:r.at])
	str := func(i int) string { return text[r.spans[i][0]-from : r.spans[i][1]-from] }
	if cap(r.vals)-len(r.vals) < len(r.spans) {
		// Enough for the entries left if they are like this one.
		r.vals = make([]string, 0, len(r.spans)*left)
	}
	h, next := make(nats.Header, int(keys)+r.room), keysFrom
	for _, nv := range r.counts {
		k, first := str(next), len(r.vals)
		for i := range nv {
			r.vals = append(r.vals, str(next+1+i))
		}
		h[k] = r.vals[first:len(r.vals):len(r.vals)]
		next += 1 + nv
	}
	e.subject, e.header = str(0), h
	if r.form == BundleForm2 {
		e.key = str(1)
	}
	if !r.span() {
		return entry{}, errors.New("truncated payload")
	}
	p := r.spans[len(r.spans)-1]
	e.data = r.b[p[0]:p[1]:p[1]]
	return e, nil
}

// Copy is one input's routed copy, as a bundle carries it.
type Copy struct {
	// Subject is the subject the copy would have had alone.
	Subject string
	// Header is the copy's headers, its Nats-Msg-Id (MsgID of the input)
	// among them.
	Header nats.Header
	// Data is the input's payload.
	Data []byte
}

// formOf returns the bundle form h says, or an error wrapping
// ErrNotABundle.
func formOf(h nats.Header) (byte, error) {
	switch f := h.Get(HeaderBundle); f {
	case "1":
		return BundleForm1, nil
	case "2":
		return BundleForm2, nil
	default:
		return 0, fmt.Errorf("%w: form %q, this version reads 1 and 2", ErrNotABundle, f)
	}
}

// readBundle reads a bundle: its entries, form 2's input stream, and the
// prefix its copies' subjects take (the bundle's subject without its
// first input's).
func readBundle(subject string, h nats.Header, data []byte, room int) (es []entry, stream, prefix string, form byte, err error) {
	if form, err = formOf(h); err != nil {
		return nil, "", "", 0, err
	}
	if len(data) == 0 || data[0] != form {
		return nil, "", "", 0, fmt.Errorf("%w: the payload is not of form %d", ErrNotABundle, form)
	}
	if es, stream, err = decodeBundle(data, room); err != nil {
		return nil, "", "", 0, err
	}
	prefix, ok := strings.CutSuffix(subject, es[0].subject)
	if !ok {
		return nil, "", "", 0, fmt.Errorf("%w: subject %q does not end with its first input's %q", ErrNotABundle, subject, es[0].subject)
	}
	return es, stream, prefix, form, nil
}

// ReadBundle reads the copies a bundle of either form carries, as the
// route step would have published each alone, given the bundle's subject
// (with or without the partition token), headers and payload. Each copy's
// subject has the partition token as subject has it. It fails,
// permanently (ErrNotABundle), when the bundle cannot be read.
func ReadBundle(subject string, h nats.Header, data []byte) ([]Copy, error) {
	es, stream, prefix, form, err := readBundle(subject, h, data, 0)
	if err != nil {
		return nil, err
	}
	out := make([]Copy, len(es))
	for i, e := range es {
		ch := e.header
		if form == BundleForm2 {
			ch = copyHeader(e.header, e.key, stream, e.seq, time.Unix(0, e.at))
		}
		out[i] = Copy{Subject: prefix + e.subject, Header: ch, Data: e.data}
	}
	return out, nil
}

// partRoom is the room a part's headers keep for what the stage adds to
// its forwarded copy (Nats-Msg-Id and the hand-over's annotations), so
// that adding them does not grow the map.
const partRoom = 3

// Unbundle returns the inputs a bundle carries, each as a message with its
// entry's headers, those the server added to the bundle and the bundle's
// metadata; settling the parts settles the bundle (docs/scale-out.md, "Code
// notes"). It fails, permanently (ErrNotABundle), when the bundle cannot be
// read.
func Unbundle(msg jetstream.Msg) ([]jetstream.Msg, error) {
	bh := msg.Headers()
	es, stream, prefix, form, err := readBundle(msg.Subject(), bh, msg.Data(), len(bh)+partRoom)
	if err != nil {
		return nil, err
	}
	b := &bundle{msg: msg, left: len(es)}
	parts := make([]part, len(es))
	out := make([]jetstream.Msg, len(es))
	for i, e := range es {
		for k, vs := range bh {
			if k != HeaderBundle && k != jetstream.MsgIDHeader {
				e.header[k] = vs
			}
		}
		p := &parts[i]
		*p = part{b: b, subject: prefix + e.subject, header: e.header, data: e.data}
		if form == BundleForm2 {
			p.origin, p.stream, p.seq, p.key, p.at = true, stream, e.seq, e.key, e.at
		}
		out[i] = p
	}
	return out, nil
}

// bundle settles a bundle for its parts.
type bundle struct {
	msg jetstream.Msg

	mu      sync.Mutex
	left    int  // parts not yet acked or terminated
	nakked  bool // the bundle was nakked: nothing settles it again
	touched time.Time
}

// settled counts part p settled, once however often it is settled; the
// last part acks the bundle.
func (b *bundle) settled(p *part) error {
	b.mu.Lock()
	if p.done {
		b.mu.Unlock()
		return nil
	}
	p.done = true
	b.left--
	last := b.left == 0 && !b.nakked
	b.mu.Unlock()
	if last {
		return b.msg.Ack()
	}
	return nil
}

// nak naks the bundle once.
func (b *bundle) nak(delay time.Duration) error {
	b.mu.Lock()
	first := !b.nakked
	b.nakked = true
	b.mu.Unlock()
	if !first {
		return nil
	}
	if delay > 0 {
		return b.msg.NakWithDelay(delay)
	}
	return b.msg.Nak()
}

// inProgress tells the server the bundle is being worked on, at most once
// a second however many parts ask.
func (b *bundle) inProgress() error {
	b.mu.Lock()
	due := time.Since(b.touched) >= time.Second
	if due {
		b.touched = time.Now()
	}
	b.mu.Unlock()
	if !due {
		return nil
	}
	return b.msg.InProgress()
}

// part is one input of a bundle, as a jetstream.Msg.
type part struct {
	b       *bundle
	subject string
	header  nats.Header
	data    []byte
	done    bool // settled (acked or terminated); guarded by b.mu

	// A form-2 part's origin (origin true): what the route step adds,
	// carried as fields (OriginOfMsg, InputOfMsg).
	origin bool
	stream string
	seq    uint64
	key    string
	at     int64
}

// Metadata returns the bundle's.
func (p *part) Metadata() (*jetstream.MsgMetadata, error) { return p.b.msg.Metadata() }

// Data returns the input's payload.
func (p *part) Data() []byte { return p.data }

// Headers returns the entry's headers: form 1, the input's routed copy's;
// form 2, the input's own.
func (p *part) Headers() nats.Header { return p.header }

// Subject returns the subject the input's routed copy would have had.
func (p *part) Subject() string { return p.subject }

// Reply returns the bundle's.
func (p *part) Reply() string { return p.b.msg.Reply() }

// Ack settles the part; the last one acks the bundle.
func (p *part) Ack() error { return p.b.settled(p) }

// DoubleAck settles the part as Ack does.
func (p *part) DoubleAck(context.Context) error { return p.b.settled(p) }

// Nak naks the bundle.
func (p *part) Nak() error { return p.b.nak(0) }

// NakWithDelay naks the bundle with delay.
func (p *part) NakWithDelay(delay time.Duration) error { return p.b.nak(delay) }

// InProgress tells the server the bundle is being worked on.
func (p *part) InProgress() error { return p.b.inProgress() }

// Term settles the part: the caller gave the input up (dead-lettered it).
func (p *part) Term() error { return p.b.settled(p) }

// TermWithReason settles the part as Term does.
func (p *part) TermWithReason(string) error { return p.b.settled(p) }
