// Package deadletter builds and publishes the dead letters of the stage
// and of the route step: a copy of an input that cannot be deduplicated or
// routed, on the dead-letter subject of its Reason, with headers that say
// why and where the input is. Both publish them with one Publisher, which
// settles each Letter the same way.
//
// One dead letter stands for one input message however often that input is
// redelivered: its Nats-Msg-Id is MsgID of the input's stream and
// sequence, the same whether the stage or the route step writes it. A dead
// letter carries the input's headers (but its Nats-* ones) and, when it
// fits the server's max payload, its payload; one the dead-letter stream
// refuses is stored again in its Shrink form.
//
//	m := deadletter.Build(deadletter.Input{Reason: deadletter.ReasonNoKey, ...},
//		cfg.DeadLetter.SubjectFor(string(deadletter.ReasonNoKey)), nc.MaxPayload(), deadletter.OmittedTooLarge)
//
//	pub := &deadletter.Publisher{JS: js, Conn: nc, Component: "dead_letter", AckWait: ackWait,
//		Subject: cfg.DeadLetter.SubjectFor, Note: deadletter.OmittedTooLarge,
//		Done: func(l deadletter.Letter, unstorable bool) { _ = l.Msg.Ack() }}
//	pub.Publish(ctx, []deadletter.Letter{{Msg: msg, Reason: deadletter.ReasonNoKey, Detail: "..."}})
//
// The reasons and headers are listed in docs/failures.md.
package deadletter

import (
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"strconv"
	"strings"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/dedupe-stage/dedupe-stage/internal/forward"
	"github.com/dedupe-stage/dedupe-stage/internal/retry"
)

// Headers a dead letter carries besides the input's own.
const (
	// HeaderReason is the dead letter's Reason.
	HeaderReason = "Dedupe-Reason"
	// HeaderDetail says what was wrong with the input, in words.
	HeaderDetail = "Dedupe-Detail"
	// HeaderOriginalSubject is the input's subject.
	HeaderOriginalSubject = "Dedupe-Original-Subject"
	// HeaderOriginalStream is the input's stream, when known.
	HeaderOriginalStream = "Dedupe-Original-Stream"
	// HeaderOriginalSequence is the input's stream sequence, when known.
	HeaderOriginalSequence = "Dedupe-Original-Sequence"
	// HeaderOriginalMsgID is the input's Nats-Msg-Id, when it had one: the dead letter's own Nats-Msg-Id is MsgID, and a redrive restores this one.
	HeaderOriginalMsgID = "Dedupe-Original-Msg-Id"
	// HeaderPayloadOmitted says the payload was left out, its size and why.
	HeaderPayloadOmitted = "Dedupe-Payload-Omitted"
	// HeaderHeadersTruncated is set on a shrunk dead letter: how many of the input's headers it kept and how they were cut.
	HeaderHeadersTruncated = "Dedupe-Headers-Truncated"
)

// Limits of a shrunk dead letter (Shrink).
const (
	// ShrunkHeaderBudget bounds the input's headers copied into a shrunk dead letter, in bytes.
	ShrunkHeaderBudget = 4096
	// ShrunkValueMax bounds each header value and the detail of a shrunk dead letter, in bytes.
	ShrunkValueMax = 256
)

// Notes HeaderPayloadOmitted carries after the payload's size.
const (
	// OmittedTooLarge is the stage's note on a payload that does not fit the dead letter.
	OmittedTooLarge = "too large to dead-letter; read it from the original stream and sequence"
	// OmittedRefused is the note of a Shrink form: the dead letter with its payload was refused.
	OmittedRefused = "the dead letter was refused; read the input from the original stream and sequence"
	// OmittedRoute is the route step's note, whether the payload did not fit or was refused.
	OmittedRoute = "read the input from the original stream and sequence"
)

// Input is the input message a dead letter stands for, and why.
type Input struct {
	// Reason is why the input is dead-lettered.
	Reason Reason
	// Detail says what was wrong, in words (HeaderDetail).
	Detail string
	// Header and Data are the input's headers and payload.
	Header nats.Header
	Data   []byte
	// Subject is the input's subject.
	Subject string
	// Stream and Sequence are where the input is stored; Stream is empty
	// when that is not known, and then the dead letter has no MsgID.
	Stream   string
	Sequence uint64
}

// MsgID returns the Nats-Msg-Id of the dead letter of message seq of stream, which makes it one dead letter per input however often the input is redelivered.
func MsgID(stream string, seq uint64) string {
	return "dlq:" + stream + ":" + strconv.FormatUint(seq, 10)
}

// Build returns the dead letter of in on subject, with the input's headers but its Nats-* ones (its Nats-Msg-Id goes to HeaderOriginalMsgID), and its payload if it fits maxPayload with the headers (pass 0 to leave it out), else HeaderPayloadOmitted with the size and note.
func Build(in Input, subject string, maxPayload int64, note string) *nats.Msg {
	h := make(nats.Header, len(in.Header)+6)
	for k, v := range in.Header {
		if !strings.HasPrefix(k, "Nats-") {
			h[k] = v
		}
	}
	mark(h, in, in.Detail)
	if id := in.Header.Get(jetstream.MsgIDHeader); id != "" {
		h.Set(HeaderOriginalMsgID, id)
	}
	data := in.Data
	if room := maxPayload - int64(forward.HeaderSize(h)); int64(len(data)) > room {
		h.Set(HeaderPayloadOmitted, omitted(len(data), note))
		data = nil
	}
	return &nats.Msg{Subject: subject, Header: h, Data: data}
}

// Shrink returns the smallest useful dead letter of in on subject: no payload, the headers that say why and where, and the detail and the input's headers cut to ShrunkValueMax bytes a value and ShrunkHeaderBudget in all, in name order.
func Shrink(in Input, subject string) *nats.Msg {
	h := make(nats.Header)
	mark(h, in, cut(in.Detail, ShrunkValueMax))
	if id := in.Header.Get(jetstream.MsgIDHeader); id != "" {
		h.Set(HeaderOriginalMsgID, cut(id, ShrunkValueMax))
	}
	h.Set(HeaderPayloadOmitted, omitted(len(in.Data), OmittedRefused))
	names := make([]string, 0, len(in.Header))
	for k := range in.Header {
		if !strings.HasPrefix(k, "Nats-") {
			names = append(names, k)
		}
	}
	sort.Strings(names)
	kept, used := 0, 0
	for _, k := range names {
		v := cut(in.Header.Get(k), ShrunkValueMax)
		if len(k) > ShrunkValueMax {
			continue
		}
		if used += len(k) + len(v) + 4; used > ShrunkHeaderBudget {
			break
		}
		h.Set(k, v)
		kept++
	}
	h.Set(HeaderHeadersTruncated, fmt.Sprintf("kept %d of %d headers, first value only, values cut to %d bytes, %d bytes in all",
		kept, len(names), ShrunkValueMax, ShrunkHeaderBudget))
	return &nats.Msg{Subject: subject, Header: h}
}

// mark sets on h the headers that say why in is dead-lettered (with detail) and where it is.
func mark(h nats.Header, in Input, detail string) {
	h.Set(HeaderReason, string(in.Reason))
	h.Set(HeaderDetail, detail)
	h.Set(HeaderOriginalSubject, in.Subject)
	if in.Stream != "" {
		h.Set(HeaderOriginalStream, in.Stream)
		h.Set(HeaderOriginalSequence, strconv.FormatUint(in.Sequence, 10))
		h.Set(jetstream.MsgIDHeader, MsgID(in.Stream, in.Sequence))
	}
}

// omitted is the value of HeaderPayloadOmitted for a payload of n bytes.
func omitted(n int, note string) string { return strconv.Itoa(n) + " bytes: " + note }

// cut returns s cut to at most n bytes, marked with "..." when cut.
func cut(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n-3] + "..."
}

// Describe renders a publish error for a dead letter's detail: the server's status, error code and description when it gave them.
func Describe(err error) string {
	var api *jetstream.APIError
	if errors.As(err, &api) {
		return fmt.Sprintf("code=%d err_code=%d description=%s", api.Code, api.ErrorCode, api.Description)
	}
	return err.Error()
}

// FallbackLevel is the log level of a batch refused as a whole and published again one message at a time: info when an id was already in the duplicate window (expected after a redelivery), else warn.
func FallbackLevel(err error) slog.Level {
	var api *jetstream.APIError
	if errors.As(err, &api) && api.ErrorCode == retry.CodeBatchDuplicateMsgID {
		return slog.LevelInfo
	}
	return slog.LevelWarn
}
