package casetest

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/dedupe-stage/dedupe-stage/config"
	"github.com/dedupe-stage/dedupe-stage/keys"
)

// Explanation is how the stage reads and judges one message.
type Explanation struct {
	// Key is the message's final key (scope:key with a scope), or empty
	// with KeyErr saying why there is none.
	Key    string
	KeyErr string
	// KeyFrom describes key: where the key, scope and version come from.
	KeyFrom string
	// Scope is the scope read, "" without key.scope; ScopeErr says why
	// there is none when key.scope is set.
	Scope    string
	ScopeErr string
	// Version is the version read under key.version ("" without it);
	// VersionErr says why there is none.
	Version    string
	VersionErr string
	// Partitions is state.partitions.
	Partitions int
	// Got is the stage's verdict, judged as the first message of a fresh
	// stage (Got.Partition is the partition that judged it).
	Got Outcome
}

// Explain reads msg's key, scope and version with the key package the
// stage uses, and judges it on a fresh stage for cfg (a session, as
// RunCase) at start + msg.At.
func Explain(ctx context.Context, cfg config.Config, start time.Time, msg Message) (Explanation, error) {
	e := Explanation{KeyFrom: cfg.Key.String(), Partitions: cfg.State.Partitions}
	hdr := nats.Header{}
	for k, v := range msg.Headers {
		hdr.Set(k, v)
	}
	kf, err := keys.NewKeyFunc(cfg.Key)
	if err != nil {
		return e, fmt.Errorf("key: %w", err)
	}
	if k, err := kf.Key(msg.Subject, hdr, msg.Payload); err != nil {
		e.KeyErr = reasonOf(err)
	} else {
		e.Key = string(k)
	}
	if cfg.Key.Scope.Enabled() {
		x, err := keys.NewExtractor(cfg.Key.Scope)
		if err != nil {
			return e, fmt.Errorf("key.scope: %w", err)
		}
		if v, err := x.Extract(msg.Subject, hdr, msg.Payload); err != nil {
			e.ScopeErr = reasonOf(err)
		} else {
			e.Scope = string(v)
		}
	}
	if cfg.Key.Version.Enabled() {
		v, err := keys.NewVersioner(cfg.Key.Version)
		if err != nil {
			return e, fmt.Errorf("key.version: %w", err)
		}
		if n, err := v.Version(msg.Subject, hdr, msg.Payload); err != nil {
			e.VersionErr = reasonOf(err)
		} else {
			e.Version = keys.FormatVersion(n)
		}
	}
	s, err := open(ctx, cfg, start)
	if err != nil {
		return e, err
	}
	defer s.close()
	if e.Got, err = s.judge(ctx, msg); err != nil {
		return e, err
	}
	return e, nil
}

// reasonOf is a key error as "reason: detail".
func reasonOf(err error) string {
	if ke, ok := err.(*keys.Error); ok {
		return ke.Reason + ": " + ke.Detail
	}
	return err.Error()
}

// Print writes e for a reader, one field a line.
func (e Explanation) Print(w io.Writer) {
	line := func(name, format string, args ...any) {
		fmt.Fprintf(w, "%-10s %s\n", name+":", fmt.Sprintf(format, args...))
	}
	if e.KeyErr != "" {
		line("key", "none (%s); key is %s", e.KeyErr, e.KeyFrom)
	} else {
		line("key", "%s (%s)", e.Key, e.KeyFrom)
	}
	switch {
	case e.ScopeErr != "":
		line("scope", "none (%s)", e.ScopeErr)
	case e.Scope != "":
		line("scope", "%s", e.Scope)
	default:
		line("scope", "none (key.scope is not set)")
	}
	switch {
	case e.VersionErr != "":
		line("version", "none (%s)", e.VersionErr)
	case e.Version != "":
		line("version", "%s", e.Version)
	default:
		line("version", "none (key.version is not set)")
	}
	if e.Got.Partition >= 0 {
		line("partition", "%d of %d", e.Got.Partition, e.Partitions)
	} else {
		line("partition", "none (dead-lettered before it reached a partition)")
	}
	line("verdict", "%s", e.Got.Describe())
	line("reason", "%s", e.reason())
}

// reason says why the verdict is what it is, in words.
func (e Explanation) reason() string {
	switch e.Got.Verdict {
	case Forwarded:
		return "its key is new: no copy of it was judged before, so it is the first copy in its window"
	case DeadLetter:
		return fmt.Sprintf("%s: %s", e.Got.Reason, e.Got.Detail)
	case Dropped:
		return "its totals bucket was closed and totals.late_events is drop"
	}
	return "a first message is never a repeat: " + string(e.Got.Verdict)
}
