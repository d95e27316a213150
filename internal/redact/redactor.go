package redact

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
)

// Redactor replaces known secrets in text. The zero value and nil replace
// nothing. It is safe for concurrent use.
type Redactor struct {
	r *strings.Replacer
}

// New returns a Redactor for every replacement in sets. Longer secrets are
// replaced first, so that a whole URL becomes its display form rather than
// a URL with only its password masked; secrets shorter than MinSecretLen are
// left out (see MinSecretLen).
func New(sets ...Secrets) *Redactor {
	var all Secrets
	for _, s := range sets {
		for _, r := range s {
			if len(r.Old) >= MinSecretLen && r.Old != r.New {
				all = append(all, r)
			}
		}
	}
	if len(all) == 0 {
		return &Redactor{}
	}
	slices.SortStableFunc(all, func(a, b Replacement) int { return len(b.Old) - len(a.Old) })
	pairs := make([]string, 0, 2*len(all))
	for _, r := range all {
		pairs = append(pairs, r.Old, r.New)
	}
	return &Redactor{r: strings.NewReplacer(pairs...)}
}

// String returns s with every known secret replaced.
func (r *Redactor) String(s string) string {
	if r == nil || r.r == nil {
		return s
	}
	return r.r.Replace(s)
}

// Error returns err with its message redacted, or err itself when its
// message holds no secret (so that errors.Is and errors.As see the original
// chain either way: the returned error unwraps to err).
func (r *Redactor) Error(err error) error {
	if err == nil {
		return nil
	}
	msg := err.Error()
	red := r.String(msg)
	if red == msg {
		return err
	}
	return &redactedError{msg: red, err: err}
}

// redactedError is an error whose message was redacted.
type redactedError struct {
	msg string
	err error
}

func (e *redactedError) Error() string { return e.msg }
func (e *redactedError) Unwrap() error { return e.err }

// Handler returns a slog.Handler that redacts every record's message and
// attribute values (including errors, Stringers, groups and the attributes
// given to WithAttrs) before passing it to h. A value whose text holds no
// secret is passed unchanged, keeping its type for structured output.
func (r *Redactor) Handler(h slog.Handler) slog.Handler {
	if r == nil || r.r == nil {
		return h
	}
	return &handler{r: r, h: h}
}

type handler struct {
	r *Redactor
	h slog.Handler
}

func (h *handler) Enabled(ctx context.Context, l slog.Level) bool { return h.h.Enabled(ctx, l) }

func (h *handler) Handle(ctx context.Context, rec slog.Record) error {
	out := slog.NewRecord(rec.Time, rec.Level, h.r.String(rec.Message), rec.PC)
	rec.Attrs(func(a slog.Attr) bool {
		out.AddAttrs(h.attr(a))
		return true
	})
	return h.h.Handle(ctx, out)
}

func (h *handler) WithAttrs(attrs []slog.Attr) slog.Handler {
	red := make([]slog.Attr, len(attrs))
	for i, a := range attrs {
		red[i] = h.attr(a)
	}
	return &handler{r: h.r, h: h.h.WithAttrs(red)}
}

func (h *handler) WithGroup(name string) slog.Handler {
	return &handler{r: h.r, h: h.h.WithGroup(name)}
}

// attr redacts one attribute's value.
func (h *handler) attr(a slog.Attr) slog.Attr {
	v := a.Value.Resolve()
	switch v.Kind() {
	case slog.KindString:
		a.Value = slog.StringValue(h.r.String(v.String()))
	case slog.KindGroup:
		g := v.Group()
		red := make([]slog.Attr, len(g))
		for i, ga := range g {
			red[i] = h.attr(ga)
		}
		a.Value = slog.GroupValue(red...)
	case slog.KindAny:
		var text string
		switch x := v.Any().(type) {
		case error:
			text = x.Error()
		case fmt.Stringer:
			text = x.String()
		default:
			text = fmt.Sprintf("%+v", x)
		}
		if red := h.r.String(text); red != text {
			a.Value = slog.StringValue(red)
		} else {
			a.Value = v
		}
	default:
		a.Value = v
	}
	return a
}
