// Package finding holds what `dedupe-stage check-config --connect` reports:
// one Finding per thing the stage would refuse, warn about or create at
// start, each with the nats command that fixes it.
//
// A start-up check attaches its fix to the error it returns, so that the
// stage's refusal and check-config's finding say the same:
//
//	return finding.WithFix(fmt.Errorf("..."), "nats stream edit OUT --dupe-window 2m")
//	...
//	f := finding.FromError("duplicate_window", finding.Error, err) // f.Fix is the command
package finding

import "errors"

// Severity says what a finding means for `dedupe-stage run`.
type Severity string

// Severities, from the one that stops run to the one that only informs.
const (
	// Error: run refuses to start.
	Error Severity = "error"
	// Warning: run starts, but logs a warning the operator should read.
	Warning Severity = "warning"
	// Info: run starts; it creates what the finding names, or it is fine.
	Info Severity = "info"
)

// Finding is one result of checking the configuration against the server.
type Finding struct {
	// Check names the check, e.g. "duplicate_window", "stream".
	Check string `json:"check"`
	// Severity says whether run would refuse to start.
	Severity Severity `json:"severity"`
	// Message says what was found and why it matters.
	Message string `json:"message"`
	// Fix is the nats command that fixes it, "" when there is none.
	Fix string `json:"fix,omitempty"`
}

// FromError returns the finding of a failed check: err's message and the
// fix it carries (WithFix), if any.
func FromError(check string, sev Severity, err error) Finding {
	return Finding{Check: check, Severity: sev, Message: err.Error(), Fix: Fix(err)}
}

// Stops reports whether any of fs would stop run from starting.
func Stops(fs []Finding) bool {
	for _, f := range fs {
		if f.Severity == Error {
			return true
		}
	}
	return false
}

// fixError is an error with the command that fixes it.
type fixError struct {
	err error
	fix string
}

func (e *fixError) Error() string { return e.err.Error() }
func (e *fixError) Unwrap() error { return e.err }

// WithFix returns err carrying fix, the nats command that fixes it; its
// message and what it wraps are err's. A nil err stays nil.
func WithFix(err error, fix string) error {
	if err == nil {
		return nil
	}
	return &fixError{err: err, fix: fix}
}

// Fix returns the command carried by err or by an error it wraps (the
// outermost one), or "" when there is none.
func Fix(err error) string {
	var fe *fixError
	if errors.As(err, &fe) {
		return fe.fix
	}
	return ""
}
