package route

import (
	"reflect"
	"testing"

	"github.com/nats-io/nats.go"
)

// FuzzDecodeBundle reads arbitrary bytes as a bundle's payload: it never
// panics, and what it reads, written again, reads back the same.
func FuzzDecodeBundle(f *testing.F) {
	copies := []*nats.Msg{
		{Header: nats.Header{"Event-Id": {"order-1"}, HeaderKey: {"order-1"}, "Multi": {"a", "b", ""}}, Data: []byte("one")},
		{Header: nats.Header{}, Data: nil},
		{Header: nats.Header{"Event-Id": {"order-2"}}, Data: make([]byte, 300)},
	}
	f.Add(appendBundle(nil, copies, []string{"in.a", "in.b", ""}))
	f.Add([]byte{bundleFormByte, 1, 0, 0, 0})
	f.Add([]byte{bundleFormByte, 2, 1, 'x', 1, 1, 'k', 2, 1, 'v', 0, 2, 'p', 'q'})
	f.Add([]byte{2})
	f.Fuzz(func(t *testing.T, b []byte) {
		es, err := decodeBundle(b)
		if err != nil {
			return
		}
		msgs := make([]*nats.Msg, len(es))
		subjects := make([]string, len(es))
		for i, e := range es {
			msgs[i], subjects[i] = &nats.Msg{Header: e.header, Data: e.data}, e.subject
		}
		again, err := decodeBundle(appendBundle(nil, msgs, subjects))
		if err != nil {
			t.Fatalf("a bundle written from what was read does not read: %v", err)
		}
		for i := range es {
			if again[i].subject != es[i].subject || string(again[i].data) != string(es[i].data) || !sameHeader(again[i].header, es[i].header) {
				t.Fatalf("entry %d read %+v, written and read again %+v", i, es[i], again[i])
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
