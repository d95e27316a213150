package batcher

import (
	"testing"
	"time"
)

func TestProgressDue(t *testing.T) {
	var p Progress
	if !p.Due(time.Hour) {
		t.Error("a Progress never started is not due")
	}
	p.Start(time.Now())
	if p.Due(time.Hour) {
		t.Error("due right after Start with an AckWait of an hour")
	}
	p.Start(time.Now().Add(-21 * time.Minute))
	if !p.Due(time.Hour) {
		t.Error("not due 21 minutes after Start with an AckWait of an hour (a third is 20)")
	}
	if p.Due(time.Hour) {
		t.Error("due again right after a signal")
	}
}
