package route

import (
	"reflect"
	"testing"

	"github.com/nats-io/nats.go"
)

// FuzzDecodeBundle reads arbitrary bytes as a bundle's payload, of either
// form: it never panics, and what it reads, written again in the same
// form, reads back the same.
func FuzzDecodeBundle(f *testing.F) {
	copies := []*nats.Msg{
		{Header: nats.Header{"Event-Id": {"order-1"}, HeaderKey: {"order-1"}, "Multi": {"a", "b", ""}}, Data: []byte("one")},
		{Header: nats.Header{}, Data: nil},
		{Header: nats.Header{"Event-Id": {"order-2"}}, Data: make([]byte, 300)},
	}
	f.Add(appendBundle(nil, copies, []string{"in.a", "in.b", ""}))
	f.Add(appendBundle2(nil, "EVENTS", []entry{
		{subject: "in.a", header: copies[0].Header, data: copies[0].Data, seq: 7, at: 1_700_000_000_123_456_789, key: "order-1"},
		{subject: "in.b", header: nats.Header{}, seq: 1 << 40, at: -5, key: ""},
	}, keepAll))
	f.Add([]byte{BundleForm1, 1, 0, 0, 0})
	f.Add([]byte{BundleForm1, 2, 1, 'x', 1, 1, 'k', 2, 1, 'v', 0, 2, 'p', 'q'})
	f.Add([]byte{BundleForm2, 1, 'S', 1, 1, 'x', 9, 3, 1, 'k', 0, 0})
	f.Add([]byte{3})
	f.Fuzz(func(t *testing.T, b []byte) {
		es, stream, err := decodeBundle(b, 0)
		if err != nil {
			return
		}
		var written []byte
		if b[0] == BundleForm2 {
			written = appendBundle2(nil, stream, es, keepAll)
		} else {
			msgs := make([]*nats.Msg, len(es))
			subjects := make([]string, len(es))
			for i, e := range es {
				msgs[i], subjects[i] = &nats.Msg{Header: e.header, Data: e.data}, e.subject
			}
			written = appendBundle(nil, msgs, subjects)
		}
		again, stream2, err := decodeBundle(written, 0)
		if err != nil {
			t.Fatalf("a bundle written from what was read does not read: %v", err)
		}
		if stream2 != stream || len(again) != len(es) {
			t.Fatalf("read stream %q and %d entries, written and read again %q and %d", stream, len(es), stream2, len(again))
		}
		for i, e := range es {
			a := again[i]
			if a.subject != e.subject || string(a.data) != string(e.data) || !sameHeader(a.header, e.header) ||
				a.seq != e.seq || a.at != e.at || a.key != e.key {
				t.Fatalf("entry %d read %+v, written and read again %+v", i, e, a)
			}
		}
	})
}

// sameHeader compares two headers, an empty value list equal to none.
func sameHeader(a, b nats.Header) bool {
	if len(a) != len(b) {
		return false
	}
	for k, va := range a {
		vb, ok := b[k]
		if !ok || len(va) != len(vb) || (len(va) > 0 && !reflect.DeepEqual(va, vb)) {
			return false
		}
	}
	return true
}
