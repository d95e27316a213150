package finding

import (
	"errors"
	"fmt"
	"testing"
)

var errBase = errors.New("base")

// TestFixSurvivesWrapping: the fix a check attaches is found through the
// wrapping and joining callers do, and the error stays what it wraps.
func TestFixSurvivesWrapping(t *testing.T) {
	err := WithFix(fmt.Errorf("stream X: %w", errBase), "nats stream edit X --force")
	for name, e := range map[string]error{
		"as is":   err,
		"wrapped": fmt.Errorf("scale-out: %w", err),
		"joined":  fmt.Errorf("scale-out: %w", errors.Join(errors.New("other"), err)),
	} {
		if got := Fix(e); got != "nats stream edit X --force" {
			t.Errorf("%s: Fix %q", name, got)
		}
		if !errors.Is(e, errBase) {
			t.Errorf("%s: does not wrap errBase", name)
		}
	}
	f := FromError("c", Error, err)
	if f.Message != "stream X: base" || f.Fix != "nats stream edit X --force" || !Stops([]Finding{f}) {
		t.Errorf("FromError: %+v", f)
	}
	if WithFix(nil, "x") != nil || Fix(errBase) != "" || Stops([]Finding{{Severity: Warning}, {Severity: Info}}) {
		t.Error("nil error, error without a fix, or findings that do not stop run")
	}
}
