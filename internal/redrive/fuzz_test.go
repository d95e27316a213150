package redrive_test

import (
	"bytes"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/dedupe-stage/dedupe-stage/internal/deadletter"
	"github.com/dedupe-stage/dedupe-stage/internal/redrive"
)

// FuzzCopy reads dead letters with any header values: a copy is the
// input's subject and payload with none of the dead letter's headers, and
// anything that does not say where the input was, or does not carry it
// whole, is refused.
func FuzzCopy(f *testing.F) {
	f.Add("events.a", "IN", "7", "order-1", "X-Trace", "t1", "", "", []byte(`{"id":1}`), false)
	f.Add("events.a", "IN", "-1", "", "Nats-Expected-Stream", "OTHER", "", "", []byte(nil), true)
	f.Add("", "IN", "7", "", "Dedupe-Reason", "no_key", "10 bytes: too large", "kept 0 of 1", []byte("x"), false)
	f.Fuzz(func(t *testing.T, subject, stream, seq, msgID, name, value, omitted, truncated string, data []byte, keyFromMsgID bool) {
		if len(data) > 1<<16 || len(name) > 256 || len(value) > 1024 {
			return
		}
		h := nats.Header{deadletter.HeaderReason: {"no_key"}, jetstream.MsgIDHeader: {"dlq:IN:7"}}
		for k, v := range map[string]string{deadletter.HeaderOriginalSubject: subject, deadletter.HeaderOriginalStream: stream,
			deadletter.HeaderOriginalSequence: seq, deadletter.HeaderOriginalMsgID: msgID,
			deadletter.HeaderPayloadOmitted: omitted, deadletter.HeaderHeadersTruncated: truncated} {
			if v != "" {
				h.Set(k, v)
			}
		}
		if name != "" {
			h.Add(name, value)
		}
		m, _, refusal, detail := redrive.Copy("DLQ", 3, h, data, keyFromMsgID)
		if m == nil {
			if refusal == "" || detail == "" {
				t.Fatalf("no copy, and no refusal or detail: %q %q", refusal, detail)
			}
			return
		}
		if omitted != "" || truncated != "" || subject == "" || stream == "" {
			t.Fatalf("copied a dead letter that does not carry or locate its input: %v", h)
		}
		if m.Subject != subject || !bytes.Equal(m.Data, data) || m.Header.Get(jetstream.ExpectedStreamHeader) != stream {
			t.Fatalf("copy on %q expecting %q, want %q expecting %q with the payload", m.Subject, m.Header.Get(jetstream.ExpectedStreamHeader), subject, stream)
		}
		for _, k := range []string{deadletter.HeaderReason, deadletter.HeaderDetail, deadletter.HeaderOriginalSubject,
			deadletter.HeaderOriginalStream, deadletter.HeaderOriginalSequence, deadletter.HeaderOriginalMsgID} {
			if _, ok := m.Header[k]; ok {
				t.Fatalf("copy carries the dead letter's %s", k)
			}
		}
		if want := msgID; want != "" && m.Header.Get(jetstream.MsgIDHeader) != want {
			t.Fatalf("copy Nats-Msg-Id %q, want the input's %q", m.Header.Get(jetstream.MsgIDHeader), want)
		}
	})
}
