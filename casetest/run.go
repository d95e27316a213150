package casetest

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/dedupe-stage/dedupe-stage/config"
)

// MessageResult is what happened to one message of a case.
type MessageResult struct {
	// Message is the case's message.
	Message Message
	// Got is what the stage did; zero when Err is set.
	Got Outcome
	// Err is why the message could not be judged.
	Err error
	// Diffs are the differences between Message.Want and Got, one per
	// field; none when it passed.
	Diffs []string
}

// Passed reports whether the stage did what the message wants.
func (r MessageResult) Passed() bool { return r.Err == nil && len(r.Diffs) == 0 }

// CaseResult is what happened to the messages of one case.
type CaseResult struct {
	// Case is the case.
	Case Case
	// Messages are its messages' results, up to the first that could
	// not be judged.
	Messages []MessageResult
	// Err is why the case could not run (a stage that would not start).
	Err error
}

// Passed reports whether every message of the case passed.
func (r CaseResult) Passed() bool {
	if r.Err != nil || len(r.Messages) != len(r.Case.Messages) {
		return false
	}
	for _, m := range r.Messages {
		if !m.Passed() {
			return false
		}
	}
	return true
}

// RunCase runs c on a fresh stage for cfg (a session: an in-process
// server, a temporary data dir; see Isolate) whose offset 0 is start,
// publishing its messages in order at their times, each once the one
// before it is judged.
func RunCase(ctx context.Context, cfg config.Config, start time.Time, c Case) CaseResult {
	res := CaseResult{Case: c}
	s, err := open(ctx, cfg, start)
	if err != nil {
		res.Err = err
		return res
	}
	defer s.close()
	for _, m := range c.Messages {
		got, err := s.judge(ctx, m)
		r := MessageResult{Message: m, Got: got, Err: err}
		if err == nil {
			r.Diffs = Compare(m.Want, got)
		}
		res.Messages = append(res.Messages, r)
		if err != nil {
			break
		}
	}
	return res
}

// Compare returns the differences between what a message wants and what
// the stage did, one line per field; none when they agree.
func Compare(want Want, got Outcome) []string {
	if want.Verdict != got.Verdict {
		return []string{fmt.Sprintf("verdict: expected %s, actual %s", want.Verdict, got.Describe())}
	}
	var diffs []string
	switch got.Verdict {
	case Forwarded:
		if want.Subject != "" && want.Subject != got.Subject {
			diffs = append(diffs, fmt.Sprintf("output subject: expected %s, actual %s", want.Subject, got.Subject))
		}
		if want.MsgID != nil && *want.MsgID != got.MsgID {
			diffs = append(diffs, fmt.Sprintf("Nats-Msg-Id: expected %q, actual %q", *want.MsgID, got.MsgID))
		}
		for _, k := range slices.Sorted(maps.Keys(want.Headers)) {
			if vs, ok := got.Headers[k]; !ok {
				diffs = append(diffs, fmt.Sprintf("header %s: expected %q, actual none", k, want.Headers[k]))
			} else if !slices.Contains(vs, want.Headers[k]) {
				diffs = append(diffs, fmt.Sprintf("header %s: expected %q, actual %q", k, want.Headers[k], strings.Join(vs, ", ")))
			}
		}
		if got.Forwards > 1 {
			diffs = append(diffs, fmt.Sprintf("forwards: expected 1, actual %d", got.Forwards))
		}
	case DeadLetter:
		if want.Reason != "" && want.Reason != got.Reason {
			diffs = append(diffs, fmt.Sprintf("reason: expected %s, actual %s (%s)", want.Reason, got.Reason, got.Detail))
		}
	}
	return diffs
}

// Describe says what the stage did in a few words: "forwarded to
// deduped.x as Nats-Msg-Id \"k\"", "dead_letter no_key (detail)",
// "repeat".
func (o Outcome) Describe() string {
	switch o.Verdict {
	case Forwarded:
		return fmt.Sprintf("forwarded to %s as Nats-Msg-Id %q", o.Subject, o.MsgID)
	case DeadLetter:
		return fmt.Sprintf("dead_letter %s (%s)", o.Reason, o.Detail)
	}
	return string(o.Verdict)
}

// Describe says what a message wants in a few words, as Outcome.Describe.
func (w Want) Describe() string {
	s := string(w.Verdict)
	switch w.Verdict {
	case Forwarded:
		if w.Subject != "" {
			s += " to " + w.Subject
		}
		if w.MsgID != nil {
			s += fmt.Sprintf(" as Nats-Msg-Id %q", *w.MsgID)
		}
		for _, k := range slices.Sorted(maps.Keys(w.Headers)) {
			s += fmt.Sprintf(", %s: %s", k, w.Headers[k])
		}
	case DeadLetter:
		if w.Reason != "" {
			s += " " + w.Reason
		}
	}
	return s
}

// Describe says what a message is: its subject, time, headers and payload.
func (m Message) Describe() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s at %v", m.Subject, config.Duration(m.At))
	for _, k := range slices.Sorted(maps.Keys(m.Headers)) {
		fmt.Fprintf(&b, ", %s: %s", k, m.Headers[k])
	}
	p := string(m.Payload)
	if len(p) > 200 {
		p = p[:200] + "..."
	}
	fmt.Fprintf(&b, ", payload %s", p)
	return b.String()
}
