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

// A bundle is one routed message that carries the routed copies of
// several inputs of one partition, made in one route batch: the batch's
// copies then cost one replicated write, one delivery and one ack per
// partition instead of one per input (docs/scale-out.md §3.2).
//
// A bundle's subject is the routed subject of its first copy
// (Subject(p, routed subject, first input subject)); HeaderBundle says
// which form its payload has; its Nats-Msg-Id is BundleID of the inputs it
// carries. The payload, form 1:
//
//	byte 1, uvarint count, then count entries of
//	uvarint len, input subject; uvarint header keys, then per key:
//	uvarint len, key, uvarint values, per value: uvarint len, value;
//	uvarint len, payload.
//
// Each entry's headers are those of the routed copy the route step would
// have published alone (its own Nats-Msg-Id, MsgID of the input, among
// them), so a member reads an entry as it reads a single copy (OriginOf,
// InputOf).
const (
	// HeaderBundle marks a routed message that is a bundle; its value is
	// the payload's form, BundleForm.
	HeaderBundle = "Dedupe-Bundle"
	// BundleForm is the bundle form this version writes and reads.
	BundleForm = "1"
)

// bundleFormByte is BundleForm as the payload's first byte.
const bundleFormByte = 1

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

// appendBundle appends the bundle payload of copies (routed copies whose
// input subjects are inputs) to b.
func appendBundle(b []byte, copies []*nats.Msg, inputs []string) []byte {
	b = append(b, bundleFormByte)
	b = binary.AppendUvarint(b, uint64(len(copies)))
	str := func(s string) {
		b = binary.AppendUvarint(b, uint64(len(s)))
		b = append(b, s...)
	}
	for i, m := range copies {
		str(inputs[i])
		b = binary.AppendUvarint(b, uint64(len(m.Header)))
		for k, vs := range m.Header {
			str(k)
			b = binary.AppendUvarint(b, uint64(len(vs)))
			for _, v := range vs {
				str(v)
			}
		}
		b = binary.AppendUvarint(b, uint64(len(m.Data)))
		b = append(b, m.Data...)
	}
	return b
}

// bundleOverhead bounds the bytes of a bundle of inputs of stream besides
// its entries: its headers (HeaderBundle, its Nats-Msg-Id, the header
// block's framing) and the payload's form and count.
func bundleOverhead(stream string) int {
	return 160 + len(stream)
}

// bundleSize is what appendBundle adds for m, a copy of an input on
// subject, at most.
func bundleSize(m *nats.Msg, subject string) int {
	n := 2*binary.MaxVarintLen64 + len(subject) + len(m.Data)
	for k, vs := range m.Header {
		n += 2*binary.MaxVarintLen64 + len(k)
		for _, v := range vs {
			n += binary.MaxVarintLen64 + len(v)
		}
	}
	return n
}

// entry is one input a bundle carries.
type entry struct {
	subject string // the input's subject
	header  nats.Header
	data    []byte
}

// decodeBundle reads a bundle's payload. Its allocations do not grow with
// an entry's headers: an entry's subject, header keys and values are
// substrings of one string, a copy of the entry's bytes before its
// payload; the values of every header share one slice; and each payload
// is a subslice of b.
func decodeBundle(b []byte) ([]entry, error) {
	if len(b) == 0 || b[0] != bundleFormByte {
		return nil, fmt.Errorf("%w: unknown form", ErrNotABundle)
	}
	r := &bundleReader{b: b, at: 1, spans: make([][2]int, 0, 32), counts: make([]int, 0, 16)}
	count, ok := r.num()
	if !ok || count == 0 || count > uint64(len(b)-r.at) {
		return nil, fmt.Errorf("%w: bad count", ErrNotABundle)
	}
	out := make([]entry, 0, count)
	for i := range count {
		e, err := r.entry(int(count - i))
		if err != nil {
			return nil, fmt.Errorf("%w: %s", ErrNotABundle, err)
		}
		out = append(out, e)
	}
	if r.at != len(b) {
		return nil, fmt.Errorf("%w: trailing bytes", ErrNotABundle)
	}
	return out, nil
}

// bundleReader reads a bundle's payload b from at.
type bundleReader struct {
	b      []byte
	at     int
	spans  [][2]int // the entry's strings: subject, then per header its key and values
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

// entry reads the next entry, left counting it: one of the entries still
// to read, which sizes the values' slice.
func (r *bundleReader) entry(left int) (entry, error) {
	from := r.at
	r.spans, r.counts = r.spans[:0], r.counts[:0]
	if !r.span() {
		return entry{}, errors.New("truncated subject")
	}
	keys, ok := r.num()
	if !ok || keys > uint64(len(r.b)-r.at) {
		return entry{}, errors.New("bad header count")
	}
	for range keys {
		ok := r.span()
		nv, ok2 := r.num()
		if !ok || !ok2 || nv > uint64(len(r.b)-r.at) {
			return entry{}, errors.New("truncated header")
		}
		r.counts = append(r.counts, int(nv))
		for range nv {
			if !r.span() {
				return entry{}, errors.New("truncated header value")
			}
		}
	}
	text := string(r.b[from:r.at])
	str := func(i int) string { return text[r.spans[i][0]-from : r.spans[i][1]-from] }
	if cap(r.vals)-len(r.vals) < len(r.spans) {
		// Enough for the entries left if they are like this one.
		r.vals = make([]string, 0, len(r.spans)*left)
	}
	h, next := make(nats.Header, keys), 1
	for _, nv := range r.counts {
		k, first := str(next), len(r.vals)
		for i := range nv {
			r.vals = append(r.vals, str(next+1+i))
		}
		h[k] = r.vals[first:len(r.vals):len(r.vals)]
		next += 1 + nv
	}
	subject := str(0)
	if !r.span() {
		return entry{}, errors.New("truncated payload")
	}
	p := r.spans[len(r.spans)-1]
	return entry{subject: subject, header: h, data: r.b[p[0]:p[1]:p[1]]}, nil
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

// ReadBundle reads the copies a bundle carries, given the bundle's
// subject (with or without the partition token), headers and payload.
// Each copy's subject has the partition token as subject has it. It fails,
// permanently (ErrNotABundle), when the bundle cannot be read.
func ReadBundle(subject string, h nats.Header, data []byte) ([]Copy, error) {
	if f := h.Get(HeaderBundle); f != BundleForm {
		return nil, fmt.Errorf("%w: form %q, this version reads %s", ErrNotABundle, f, BundleForm)
	}
	es, err := decodeBundle(data)
	if err != nil {
		return nil, err
	}
	prefix, ok := strings.CutSuffix(subject, es[0].subject)
	if !ok {
		return nil, fmt.Errorf("%w: subject %q does not end with its first input's %q", ErrNotABundle, subject, es[0].subject)
	}
	out := make([]Copy, len(es))
	for i, e := range es {
		out[i] = Copy{Subject: prefix + e.subject, Header: e.header, Data: e.data}
	}
	return out, nil
}

// Unbundle returns the inputs a bundle carries (ReadBundle), each as a
// message of its own: its headers are its copy's with every header the
// server added to the bundle on delivery (a pinned consumer's
// Nats-Pin-Id), and its metadata is the bundle's. Settling them settles
// the bundle: it is acked once every part is acked or terminated, and
// nakked at the first nak (the parts acked before come back with it and
// are judged repeats). InProgress goes to the bundle. A part left
// unsettled (its partition lost) leaves the bundle unacked: it comes back
// after ack_wait to the partition's next owner.
func Unbundle(msg jetstream.Msg) ([]jetstream.Msg, error) {
	cs, err := ReadBundle(msg.Subject(), msg.Headers(), msg.Data())
	if err != nil {
		return nil, err
	}
	b := &bundle{msg: msg, left: len(cs)}
	out := make([]jetstream.Msg, len(cs))
	for i, c := range cs {
		for k, vs := range msg.Headers() {
			if k != HeaderBundle && k != jetstream.MsgIDHeader {
				c.Header[k] = vs
			}
		}
		out[i] = &part{b: b, subject: c.Subject, header: c.Header, data: c.Data}
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
}

// Metadata returns the bundle's.
func (p *part) Metadata() (*jetstream.MsgMetadata, error) { return p.b.msg.Metadata() }

// Data returns the input's payload.
func (p *part) Data() []byte { return p.data }

// Headers returns the input's routed copy's headers.
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
